"""Next-token sampling for a batch of requests with per-request options.

The order is vLLM's:

    raw logits -> allowed_token_ids, bad_words, min_tokens, logit_bias -> repetition,
    frequency and presence penalties                            (process_logits)
    -> temperature -> min_p -> top-k / top-p                    (warp_logits, sampled rows)
    -> argmax (greedy rows) or a draw from the softmax

Logprobs (of the sampled token and the top alternatives) come from log_softmax of the RAW
logits, before all of that, as OpenAI and vLLM report them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from omni.shared.protocol import SamplingOptions


class TokenHistory(Protocol):
    """What the sampler reads of a request's tokens (the runner's RequestState is one)."""

    @property
    def token_ids(self) -> list[int]: ...  # prompt, then every sampled token

    @property
    def num_prompt_tokens(self) -> int: ...


@dataclass(slots=True)
class SampleOutput:
    token_id: int
    logprob: float | None
    top_logprobs: list[list[float | int]] | None  # [[token_id, logprob], ...] best first


# A temperature this small is greedy: dividing float32 logits by it would overflow to inf
# (vLLM draws the line at the same place).
GREEDY_BELOW_TEMPERATURE = 1e-5


def is_greedy(options: SamplingOptions) -> bool:
    return options.temperature < GREEDY_BELOW_TEMPERATURE


def validate_options(options: SamplingOptions, vocab_size: int | None = None) -> None:
    """A ValueError for options the sampler cannot apply; vocab_size bounds every token id (the
    server refuses such ids with a 400 first: an id past the logits would index out of range,
    a sticky device-side assert on a GPU)."""
    if options.temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {options.temperature}")
    if not 0.0 < options.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {options.top_p}")
    if options.top_k is not None and options.top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {options.top_k}")
    if options.logprobs is not None and options.logprobs < 0:
        raise ValueError(f"logprobs must be >= 0 or None, got {options.logprobs}")
    if not (math.isfinite(options.presence_penalty) and math.isfinite(options.frequency_penalty)):
        raise ValueError("presence_penalty and frequency_penalty must be finite")
    if not (math.isfinite(options.repetition_penalty) and options.repetition_penalty > 0.0):
        raise ValueError(f"repetition_penalty must be > 0, got {options.repetition_penalty}")
    if len(options.logit_bias_token_ids) != len(options.logit_bias_values):
        raise ValueError("logit_bias_token_ids and logit_bias_values must have the same length")
    if not all(math.isfinite(b) for b in options.logit_bias_values):
        raise ValueError("logit biases must be finite")
    if not 0.0 <= options.min_p <= 1.0:
        raise ValueError(f"min_p must be in [0, 1], got {options.min_p}")
    if options.allowed_token_ids is not None and not options.allowed_token_ids:
        raise ValueError("allowed_token_ids must not be empty (None allows every token)")
    if any(not word for word in options.bad_words_token_ids):
        raise ValueError("a bad word must have at least one token")
    if options.min_tokens < 0:
        raise ValueError(f"min_tokens must be >= 0, got {options.min_tokens}")
    if options.prompt_logprobs is not None and options.prompt_logprobs < 0:
        raise ValueError(f"prompt_logprobs must be >= 0 or None, got {options.prompt_logprobs}")
    ids = itertools.chain(
        options.logit_bias_token_ids,
        options.allowed_token_ids or (),
        *options.bad_words_token_ids,
        options.min_tokens_stop_ids,
    )
    bound = vocab_size if vocab_size is not None else float("inf")
    if any(not 0 <= t < bound for t in ids):
        raise ValueError(f"token ids must be in [0, {vocab_size})" if vocab_size else "token ids must be >= 0")


def adjusts_logits(options: SamplingOptions) -> bool:
    """Whether process_logits has anything to do for this request."""
    return (
        options.presence_penalty != 0.0
        or options.frequency_penalty != 0.0
        or options.repetition_penalty != 1.0
        or bool(options.logit_bias_token_ids)
        or options.allowed_token_ids is not None
        or bool(options.bad_words_token_ids)
        or options.min_tokens > 0
    )


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,  # (N, V) float32
        options: list[SamplingOptions],
        generators: list[torch.Generator | None],  # per row; None samples from the global RNG
        histories: Sequence[TokenHistory],  # per row; read only by penalties, bad_words, min_tokens
    ) -> list[SampleOutput]:
        n = logits.shape[0]
        x = process_logits(logits, options, histories)  # logits itself when no row adjusts
        if x is not logits:
            x = _fall_back_where_empty(x, logits)
        token_ids = torch.empty(n, dtype=torch.int64, device=logits.device)
        greedy = [i for i, o in enumerate(options) if is_greedy(o)]
        if len(greedy) == n:
            token_ids = x.argmax(dim=-1)
        else:
            if greedy:
                rows = torch.tensor(greedy, device=logits.device)
                token_ids[rows] = x[rows].argmax(dim=-1)
            sampled = [i for i, o in enumerate(options) if not is_greedy(o)]
            rows = torch.tensor(sampled, device=logits.device)
            token_ids[rows] = self._sample_rows(
                x[rows], [options[i] for i in sampled], [generators[i] for i in sampled]
            )
        return self._outputs(logits, token_ids, options)

    def _sample_rows(
        self, logits: torch.Tensor, options: list[SamplingOptions], generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        # logits (M, V) of non-greedy rows -> (M,) sampled ids
        probs = warp_logits(logits, options).softmax(dim=-1)  # (M, V)
        out = torch.empty(len(options), dtype=torch.int64, device=logits.device)
        unseeded = [i for i, g in enumerate(generators) if g is None]
        if unseeded:
            rows = torch.tensor(unseeded, device=logits.device)
            out[rows] = torch.multinomial(probs[rows], 1).squeeze(1)
        for i, g in enumerate(generators):
            if g is not None:
                # one draw per row from the request's own generator: reproducible whatever
                # else shares the batch
                out[i] = torch.multinomial(probs[i], 1, generator=g)[0]
        return out

    def _outputs(
        self, logits: torch.Tensor, token_ids: torch.Tensor, options: list[SamplingOptions]
    ) -> list[SampleOutput]:
        ids = token_ids.tolist()
        wanted = [i for i, o in enumerate(options) if o.logprobs is not None]
        if not wanted:
            return [SampleOutput(t, None, None) for t in ids]
        rows = torch.tensor(wanted, device=logits.device)
        logprobs = logits[rows].log_softmax(dim=-1)  # (W, V) raw, before temperature
        chosen = logprobs.gather(1, token_ids[rows][:, None]).squeeze(1).tolist()
        k_max = max(options[i].logprobs or 0 for i in wanted)
        top_vals = top_ids = None
        if k_max > 0:
            top = logprobs.topk(min(k_max, logprobs.shape[1]), dim=-1)
            top_vals, top_ids = top.values.tolist(), top.indices.tolist()
        outputs = [SampleOutput(t, None, None) for t in ids]
        for j, i in enumerate(wanted):
            k = options[i].logprobs or 0
            top_list = None
            if k > 0 and top_vals is not None and top_ids is not None:
                top_list = [[tid, lp] for tid, lp in zip(top_ids[j][:k], top_vals[j][:k])]
            outputs[i] = SampleOutput(ids[i], chosen[j], top_list)
        return outputs


def process_logits(
    logits: torch.Tensor, options: list[SamplingOptions], histories: Sequence[TokenHistory]
) -> torch.Tensor:
    """The raw-logit processors, on a copy (logprobs read the raw logits): (N, V) -> (N, V).

    A batch where no request adjusts gets logits back untouched and builds no tensor; when
    some do, only their rows are read and written.
    """
    rows = [i for i, o in enumerate(options) if adjusts_logits(o)]
    if not rows:
        return logits
    x = logits.clone()
    _keep_allowed(x, [(i, options[i].allowed_token_ids) for i in rows])
    banned = [(i, t) for i in rows for t in _banned_tokens(options[i], histories[i])]
    if banned:
        r, t = zip(*banned)
        x[torch.tensor(r, device=x.device), torch.tensor(t, device=x.device)] = float("-inf")
    biased = [
        (i, t, b)
        for i in rows
        for t, b in zip(options[i].logit_bias_token_ids, options[i].logit_bias_values)
    ]
    if biased:
        r, t, b = zip(*biased)
        index = (torch.tensor(r, device=x.device), torch.tensor(t, device=x.device))
        x.index_put_(index, torch.tensor(b, dtype=x.dtype, device=x.device), accumulate=True)
    _apply_penalties(x, [(i, options[i], histories[i]) for i in rows])
    return x


def _fall_back_where_empty(x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """A row the processors left with nothing to sample (allowed_token_ids or bad_words that
    exclude every token a grammar allows, or a penalty that overflowed) samples from its
    logits as they came, grammar mask included: the grammar wins over the processors, and
    the request goes on rather than failing its whole step."""
    dead = ~torch.isfinite(x).any(dim=-1) | torch.isnan(x).any(dim=-1) | torch.isposinf(x).any(dim=-1)
    if not bool(dead.any()):
        return x
    return torch.where(dead[:, None], logits, x)


def _keep_allowed(x: torch.Tensor, rows: list[tuple[int, list[int] | None]]) -> None:
    allowed = [(i, ids) for i, ids in rows if ids is not None]
    if not allowed:
        return
    keep = torch.zeros(len(allowed), x.shape[1], dtype=torch.bool, device=x.device)  # (A, V)
    r = [j for j, (_, ids) in enumerate(allowed) for _ in ids]
    t = [t for _, ids in allowed for t in ids]
    keep[torch.tensor(r, device=x.device), torch.tensor(t, device=x.device)] = True
    index = torch.tensor([i for i, _ in allowed], device=x.device)
    x[index] = x[index].masked_fill(~keep, float("-inf"))


def _banned_tokens(options: SamplingOptions, history: TokenHistory) -> list[int]:
    """bad_words and min_tokens: the tokens this request may not sample next."""
    if not options.bad_words_token_ids and not options.min_tokens:
        return []
    banned = []
    if len(history.token_ids) - history.num_prompt_tokens < options.min_tokens:
        banned += options.min_tokens_stop_ids
    output = history.token_ids[history.num_prompt_tokens :] if options.bad_words_token_ids else []
    for word in options.bad_words_token_ids:
        # word = [*prefix, last]: last is banned when prefix ends the output so far, so a
        # one-token word is always banned. Only output counts, as in vLLM.
        prefix = word[:-1]
        if len(prefix) <= len(output) and output[len(output) - len(prefix) :] == prefix:
            banned.append(word[-1])
    return banned


def _apply_penalties(
    x: torch.Tensor, rows: list[tuple[int, SamplingOptions, TokenHistory]]
) -> None:
    rows = [
        (i, o, h)
        for i, o, h in rows
        if o.repetition_penalty != 1.0 or o.frequency_penalty != 0.0 or o.presence_penalty != 0.0
    ]
    if not rows:
        return
    index = torch.tensor([i for i, _, _ in rows], device=x.device)
    y = x[index]  # (P, V)
    if any(o.repetition_penalty != 1.0 for _, o, _ in rows):
        seen = _token_counts([h.token_ids for _, _, h in rows], y) > 0  # prompt and output
        rep = torch.tensor([o.repetition_penalty for _, o, _ in rows], dtype=y.dtype, device=y.device)
        penalty = torch.where(seen, rep[:, None], 1.0)
        # transformers' RepetitionPenaltyLogitsProcessor exactly: a logit of 0 is divided
        y = torch.where(y < 0, y * penalty, y / penalty)
    if any(o.frequency_penalty != 0.0 or o.presence_penalty != 0.0 for _, o, _ in rows):
        counts = _token_counts([h.token_ids[h.num_prompt_tokens :] for _, _, h in rows], y)
        freq = torch.tensor([o.frequency_penalty for _, o, _ in rows], dtype=y.dtype, device=y.device)
        pres = torch.tensor([o.presence_penalty for _, o, _ in rows], dtype=y.dtype, device=y.device)
        y = y - counts * freq[:, None] - (counts > 0).to(y.dtype) * pres[:, None]
    x[index] = y


def _token_counts(seqs: list[list[int]], like: torch.Tensor) -> torch.Tensor:
    """How often each token occurs in each sequence: (len(seqs), V), like's dtype and device."""
    counts = torch.zeros(len(seqs), like.shape[1], dtype=like.dtype, device=like.device)
    flat = torch.tensor(list(itertools.chain.from_iterable(seqs)), dtype=torch.int64, device=like.device)
    lengths = torch.tensor([len(s) for s in seqs], device=like.device)
    r = torch.repeat_interleave(torch.arange(len(seqs), device=like.device), lengths)
    counts.index_put_((r, flat), torch.ones_like(flat, dtype=like.dtype), accumulate=True)
    return counts


def warp_logits(logits: torch.Tensor, options: list[SamplingOptions]) -> torch.Tensor:
    """Temperature, then min_p, then top-k / top-p, for sampled (non-greedy) rows: (M, V)."""
    temps = torch.tensor([o.temperature for o in options], device=logits.device)
    logits = logits / temps[:, None]
    if any(o.min_p > 0.0 for o in options):
        logits = _min_p(logits, options)
    if any(o.top_k is not None or o.top_p < 1.0 for o in options):
        logits = _top_k_top_p(logits, options)
    return logits


def _min_p(logits: torch.Tensor, options: list[SamplingOptions]) -> torch.Tensor:
    # a token whose probability is below min_p times the top token's goes (the top one stays)
    probs = logits.softmax(dim=-1)  # (M, V)
    min_p = torch.tensor([o.min_p for o in options], dtype=probs.dtype, device=logits.device)
    remove = probs < min_p[:, None] * probs.amax(dim=-1, keepdim=True)
    return logits.masked_fill(remove, float("-inf"))


def _top_k_top_p(logits: torch.Tensor, options: list[SamplingOptions]) -> torch.Tensor:
    # logits (M, V), temperature applied; tokens outside each row's top-k / nucleus -> -inf
    v = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)  # (M, V)
    ks = torch.tensor([min(o.top_k or v, v) for o in options], device=logits.device)
    remove = torch.arange(v, device=logits.device)[None, :] >= ks[:, None]  # rank >= k
    ps = torch.tensor([o.top_p for o in options], device=logits.device)
    probs = sorted_logits.masked_fill(remove, float("-inf")).softmax(dim=-1)
    # drop a token when the tokens ranked above it already reach top_p; rank 0 always stays
    mass_before = probs.cumsum(dim=-1) - probs
    remove |= (mass_before >= ps[:, None]) & (ps[:, None] < 1.0)
    remove[:, 0] = False  # even a top_p that rounds to 0 in float32 keeps the top token
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
