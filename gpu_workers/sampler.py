"""Next-token sampling for a batch of requests with per-request options.

Logprobs (of the sampled token and the top alternatives) come from log_softmax of the RAW
logits, before temperature, top-k and top-p, as OpenAI and vLLM report them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from omni.protocol import SamplingOptions


@dataclass(slots=True)
class SampleOutput:
    token_id: int
    logprob: float | None
    top_logprobs: list[list[float | int]] | None  # [[token_id, logprob], ...] best first


def is_greedy(options: SamplingOptions) -> bool:
    return options.temperature <= 0.0


def validate_options(options: SamplingOptions) -> None:
    if options.temperature < 0.0:
        raise ValueError(f"temperature must be >= 0, got {options.temperature}")
    if not 0.0 < options.top_p <= 1.0:
        raise ValueError(f"top_p must be in (0, 1], got {options.top_p}")
    if options.top_k is not None and options.top_k < 1:
        raise ValueError(f"top_k must be >= 1 or None, got {options.top_k}")
    if options.logprobs is not None and options.logprobs < 0:
        raise ValueError(f"logprobs must be >= 0 or None, got {options.logprobs}")


class Sampler:
    def sample(
        self,
        logits: torch.Tensor,  # (N, V) float32
        options: list[SamplingOptions],
        generators: list[torch.Generator | None],  # per row; None samples from the global RNG
    ) -> list[SampleOutput]:
        n = logits.shape[0]
        token_ids = torch.empty(n, dtype=torch.int64, device=logits.device)
        greedy = [i for i, o in enumerate(options) if is_greedy(o)]
        if len(greedy) == n:
            token_ids = logits.argmax(dim=-1)
        else:
            if greedy:
                rows = torch.tensor(greedy, device=logits.device)
                token_ids[rows] = logits[rows].argmax(dim=-1)
            sampled = [i for i, o in enumerate(options) if not is_greedy(o)]
            rows = torch.tensor(sampled, device=logits.device)
            token_ids[rows] = self._sample_rows(
                logits[rows], [options[i] for i in sampled], [generators[i] for i in sampled]
            )
        return self._outputs(logits, token_ids, options)

    def _sample_rows(
        self, logits: torch.Tensor, options: list[SamplingOptions], generators: list[torch.Generator | None]
    ) -> torch.Tensor:
        # logits (M, V) of non-greedy rows -> (M,) sampled ids
        temps = torch.tensor([o.temperature for o in options], device=logits.device)
        logits = logits / temps[:, None]
        if any(o.top_k is not None or o.top_p < 1.0 for o in options):
            logits = _top_k_top_p(logits, options)
        probs = logits.softmax(dim=-1)  # (M, V)
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
    sorted_logits = sorted_logits.masked_fill(remove, float("-inf"))
    return torch.empty_like(logits).scatter_(1, order, sorted_logits)
