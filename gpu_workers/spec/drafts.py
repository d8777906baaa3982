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
request did not opt out, and it has no grammar or a plain one: the server checks the drafts
against it and sends a mask for each verifying row); fits() adds the worker's (not
prefill_only: nothing is sampled).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from gpu_workers.spec.suffix import SuffixCache
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


class Drafter(ABC):
    """A worker's drafter: after each step, the drafts for a request that just sampled. It sees
    which request it drafts for, and hears when one leaves the worker (release), so it may
    keep what it learns of each. The variants: NgramDrafter and SuffixDrafter."""

    __slots__ = ()
    num_tokens: int  # the most drafts it gives a request a step

    @staticmethod
    def from_spec(spec: LLMWorkerSpec) -> Drafter | None:
        """The worker's drafter, from its spec's speculative fields; None: no speculation."""
        k = spec.num_speculative_tokens
        if spec.speculative_method is None or k < 1:
            return None
        if spec.speculative_method == "ngram":
            return NgramDrafter(k, spec.prompt_lookup_min, spec.prompt_lookup_max)
        if spec.speculative_method == "suffix":
            cache = SuffixCache(
                spec.suffix_decoding_max_tree_depth,
                spec.suffix_decoding_max_cached_requests,
                spec.suffix_decoding_max_spec_factor,
                spec.suffix_decoding_min_token_prob,
            )
            return SuffixDrafter(k, cache)
        raise ValueError(f"unknown drafting method {spec.speculative_method!r}")

    @abstractmethod
    def draft(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int, limit: int) -> list[int]:
        """At most `limit` draft tokens (and at most the drafter's num_tokens) to follow
        `tokens`, the request's prompt (its first num_prompt_tokens) and output so far."""

    def release(self, request_id: str) -> None:
        """The request left the worker (finished, aborted or dropped); unknown ids are fine."""


@dataclass(frozen=True, slots=True)
class NgramDrafter(Drafter):
    """Prompt lookup (ngram_draft): stateless."""

    num_tokens: int
    n_min: int
    n_max: int

    def draft(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int, limit: int) -> list[int]:
        return ngram_draft(tokens, min(self.num_tokens, limit), self.n_min, self.n_max)


class SuffixDrafter(Drafter):
    """Suffix decoding: the request's own suffix tree and the one of recent outputs
    (gpu_workers/spec/suffix.py, which has the rules)."""

    __slots__ = ("cache", "num_tokens")

    def __init__(self, num_tokens: int, cache: SuffixCache) -> None:
        self.num_tokens = num_tokens
        self.cache = cache

    def draft(self, request_id: str, tokens: Sequence[int], num_prompt_tokens: int, limit: int) -> list[int]:
        return self.cache.draft(request_id, tokens, num_prompt_tokens, min(self.num_tokens, limit))

    def release(self, request_id: str) -> None:
        self.cache.release(request_id)


class _History(Protocol):
    """What drafting reads and writes of a request (the runner's RequestState is one)."""

    token_ids: list[int]
    num_prompt_tokens: int
    draft: list[int]
    sampling: SamplingOptions
    backoff: tuple[int, int, int]


def accepted(drafts: Sequence[int], sampled: Sequence[int]) -> int:
    """How many drafts are accepted: drafts[i] is kept while it equals sampled[i], what row i
    (the row before it) sampled (sampled may be shorter: a prefix of the rows)."""
    n = 0
    while n < min(len(drafts), len(sampled)) and drafts[n] == sampled[n]:
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


# With more requests than this in the worker, drafting follows how well each request's drafts
# hold: a verifying row then costs a row of a batch that reading the weights no longer bounds
# (the native small-batch decode serves up to 8 rows at about the cost of one).
BACKOFF_ABOVE = 4
MAX_BACKOFF = 16  # tokens a request goes without drafts, at most, after misses in a row


def draft_next(drafter: Drafter | None, states: Mapping[str, _History], sampled: Sequence[SampledToken], max_model_len: int) -> list[Drafted]:
    """Drafts for the next step of each request that just sampled (state.draft; a request that
    may not speculate holds none), and the counts the server schedules from. None: no drafter.

    In a busy worker (more than BACKOFF_ABOVE requests) drafts follow the request's record
    (state.backoff), as a draft token there pays only if it holds more often than not (a row
    costs about 2 % of a 32-row CPU step that emits 32 tokens). Its last draft held for `a`
    tokens (those equal to the tokens sampled after it): if all of it held, the next draft may
    be a + 1 long, if a token after those differed, max(a, 1), so drafts that hold grow back to
    the drafter's length and those that fail shrink to one token. A first token that missed
    counts a miss (a hit clears the count), and after m misses in a row the request drafts
    again only min(2^m, MAX_BACKOFF) tokens later."""
    drafted: list[Drafted] = []
    if drafter is None:
        return drafted
    counts = Counter(s.request_id for s in sampled)
    busy = len(states) > BACKOFF_ABOVE
    for request_id, count in counts.items():
        state = states[request_id]
        misses, after, cap = state.backoff
        if state.draft:  # the draft made before this step's `count` tokens
            held = accepted(state.draft, state.token_ids[len(state.token_ids) - count :])
            misses = 0 if held else misses + 1
            after = len(state.token_ids) + min(2**misses, MAX_BACKOFF) if misses else 0
            if held == len(state.draft):  # all of it held: one more next time
                cap = held + 1
            elif held < count:  # held for `held`, then a token differed
                cap = max(1, held)
            # else the step verified only what held (its budget): no news of the rest
        state.backoff = (misses, after, cap)
        state.draft = []
        if fits(state.sampling) and not (busy and len(state.token_ids) < after):
            # the step after next holds len(token_ids) + drafts tokens, within max_model_len
            limit = max_model_len - len(state.token_ids) - 1
            state.draft = drafter.draft(
                request_id, state.token_ids, state.num_prompt_tokens, min(limit, cap) if busy and cap else limit
            )
            if state.draft:
                drafted.append(Drafted(request_id, list(state.draft)))
    return drafted
