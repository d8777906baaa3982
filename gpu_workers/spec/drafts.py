"""Speculative decoding in the LLM worker: who may speculate, drafting, and acceptance.

The worker drafts after each step, for the requests it just sampled, and tells the server how
many draft tokens it holds for each (StepResult.drafted). The scheduler may then schedule a
request's next token with up to that many drafts behind it; the step computes all of them in
one forward (rows at positions p, p + 1, ..., p + d), and every row is sampled as it would be
without speculation: every sampling field applies, with the drafts before a row counted as
output by penalties, bad_words and min_tokens (the sampler's `pending`). A draft is accepted
while it equals what its row sampled; the first row whose sample differs gives the
correction, and if all d are accepted the last row gives one token more. So a step emits 1 to
d + 1 tokens.

Greedy rows sample the argmax, so the tokens are exactly plain decoding's. A sampled row draws
x from its target distribution p, so the draft t is kept with probability p(t) and, when it
is not, the emitted x follows p without t, renormalised: the rejection sampler of speculative
sampling for a draft that proposes t with certainty (ours are deterministic), and the output's
distribution is the target's. A seeded request draws the token at each position from a
generator seeded by (seed, position) (sampler.position_seed), so one seed gives the same text
with speculation and without, whichever drafts were rejected.

Who speculates: SamplingOptions.speculate is the server's half (speculation is configured, the
request did not opt out, and it has no grammar); fits() adds the worker's (not prefill_only:
nothing is sampled).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from omni.shared.protocol import Drafted, LLMWorkerSpec, SampledToken, SamplingOptions, TopLogprob


def fits(options: SamplingOptions) -> bool:
    """Whether the worker drafts for this request."""
    return options.speculate and not options.prefill_only


def ngram_draft(tokens: Sequence[int], k: int, n_min: int, n_max: int) -> list[int]:
    """Prompt lookup: the longest n-gram (n_max down to n_min) that ends the sequence and also
    occurs earlier in it; the up to k tokens that followed its latest earlier occurrence that
    k tokens follow (else its earliest). Empty when no such n-gram occurs."""
    size = len(tokens)
    if k < 1 or size < n_min + 1:
        return []
    seq = np.asarray(tokens, dtype=np.int64)
    # earlier positions i whose token equals the last one: candidate n-gram ends
    ends = np.flatnonzero(seq[:-1] == seq[-1])
    if ends.size == 0:
        return []
    # for each candidate end, how many tokens back (up to n_max) match the sequence's tail
    matched = np.ones(ends.size, dtype=np.int64)
    alive = np.ones(ends.size, dtype=bool)
    for back in range(1, min(n_max, size - 1)):
        prev = ends - back
        ok = alive & (prev >= 0)
        ok[ok] = seq[prev[ok]] == seq[size - 1 - back]
        matched += ok
        alive = ok
        if not alive.any():
            break
    best = int(matched.max())
    if best < n_min:
        return []
    longest = ends[matched == best]
    # the latest of the longest that k tokens follow; if none does, the one most tokens follow
    full = longest[longest + k < size]
    end = int(full[-1] if full.size else longest[0])
    return seq[end + 1 : end + 1 + k].tolist()


@dataclass(frozen=True, slots=True)
class Drafter:
    """A worker's drafting setting (its spec's speculative fields)."""

    method: str
    num_tokens: int
    n_min: int
    n_max: int

    @classmethod
    def from_spec(cls, spec: LLMWorkerSpec) -> Drafter | None:
        if spec.speculative_method is None or spec.num_speculative_tokens < 1:
            return None
        return cls(spec.speculative_method, spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)

    def draft(self, tokens: Sequence[int], limit: int) -> list[int]:
        """Up to min(num_tokens, limit) draft tokens to follow `tokens`."""
        k = min(self.num_tokens, limit)
        if self.method == "ngram":
            return ngram_draft(tokens, k, self.n_min, self.n_max)
        raise ValueError(f"unknown drafting method {self.method!r}")


class _History(Protocol):
    """What drafting reads and writes of a request (the runner's RequestState is one)."""

    token_ids: list[int]
    num_prompt_tokens: int
    draft: list[int]
    sampling: SamplingOptions


def accepted(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many drafts are accepted: drafts[i] is kept while it equals sampled[i], what row i
    (the row before it) sampled. sampled has len(drafts) + 1 entries."""
    n = 0
    while n < len(drafts) and drafts[n] == sampled[n]:
        n += 1
    return n


def emitted(sample_ids: Sequence[str], states: Sequence[_History], outputs: Sequence[Any]) -> list[SampledToken]:
    """The step's tokens, appended to each request's token_ids: a sampling request's one row's,
    or, verifying d drafts (its d + 1 consecutive rows), the accepted drafts' rows and the row
    after them. outputs: the sampler's, one per row."""
    sampled = []
    row = 0
    while row < len(sample_ids):
        request_id, state = sample_ids[row], states[row]
        rows = 1
        while row + rows < len(sample_ids) and sample_ids[row + rows] == request_id:
            rows += 1
        keep = 1
        if rows > 1:
            keep += accepted(state.draft[: rows - 1], [o.token_id for o in outputs[row : row + rows]])
        for out in outputs[row : row + keep]:
            state.token_ids.append(out.token_id)
            top = None if out.top_logprobs is None else [TopLogprob(int(t), float(lp)) for t, lp in out.top_logprobs]
            sampled.append(SampledToken(request_id, out.token_id, out.logprob, top))
        row += rows
    return sampled


def draft_next(drafter: Drafter | None, states: Mapping[str, _History], sampled: Sequence[SampledToken], max_model_len: int) -> list[Drafted]:
    """Drafts for the next step of each request that just sampled (state.draft; a request that
    may not speculate holds none), and the counts the server schedules from. None: no drafter."""
    drafted: list[Drafted] = []
    if drafter is None:
        return drafted
    for request_id in dict.fromkeys(s.request_id for s in sampled):
        state = states[request_id]
        state.draft = []
        if fits(state.sampling):
            # the step after next holds len(token_ids) + drafts tokens, within max_model_len
            state.draft = drafter.draft(state.token_ids, max_model_len - len(state.token_ids) - 1)
            if state.draft:
                drafted.append(Drafted(request_id, list(state.draft)))
    return drafted
