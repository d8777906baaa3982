"""One generation request as the scheduler sees it: token ids and counters, no tensors."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import NewType

RequestId = NewType("RequestId", str)


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "stop"  # the values double as OpenAI finish_reason where one applies
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def is_finished(self) -> bool:
        return self in (
            RequestStatus.FINISHED_STOPPED,
            RequestStatus.FINISHED_LENGTH,
            RequestStatus.FINISHED_ABORTED,
        )


@dataclass(frozen=True, slots=True)
class MediaSpan:
    """An image/audio/video item's embedding rows at prompt positions [offset, offset + num_rows).

    The tokens there are placeholders, equal for every item, so the prefix cache keys the
    blocks they overlap by key too (scheduler/prefix_hash.py).
    """

    offset: int
    num_rows: int
    key: str  # the artifact-store key of the embeddings: it names their content

    @property
    def end(self) -> int:
        return self.offset + self.num_rows


@dataclass(frozen=True, slots=True)
class SamplingParams:
    # 0: a prefill-only request (completions' echo with max_tokens 0): its prompt is computed,
    # for its prompt logprobs, and it ends without a token.
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    # None: no logprobs. 0: the sampled token's logprob only. k: also the top k alternatives.
    logprobs: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    # EOS and stop_token_ids can neither be sampled nor end the request until this many
    # tokens are out (vLLM's min_tokens).
    min_tokens: int = 0
    # OpenAI's: logit - count * frequency_penalty - (count > 0) * presence_penalty, counting
    # output tokens only.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    # transformers' and vLLM's: a token already in the prompt or the output has its logit
    # divided by this when positive, multiplied when negative.
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), ids unique
    min_p: float = 0.0
    allowed_token_ids: tuple[int, ...] | None = None  # None: every token may be sampled
    # Each bad word's token sequence: its last token is banned where the rest ends the output.
    bad_words_token_ids: tuple[tuple[int, ...], ...] = ()
    # None: no prompt logprobs. k: every prompt token's logprob and rank (from the logits of
    # the position before it), and the k most likely tokens there. Such a request takes no
    # blocks from the prefix cache: the cached positions' logits would never be computed.
    prompt_logprobs: int | None = None
    # False: this request never speculates, whatever the server's --speculative-config.
    speculative: bool = True
    # Not a sampling option (the worker never sees it): the scheduler's order under
    # --scheduling-policy priority, lower first (vLLM's request priority). Here so that every
    # choice and continuation of a request carries it, as they carry its sampling.
    priority: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def prefill_only(self) -> bool:
        return self.max_tokens == 0


@dataclass(slots=True)
class Request:
    request_id: RequestId
    prompt_token_ids: list[int]
    sampling_params: SamplingParams
    eos_token_ids: frozenset[int] = frozenset()
    media: tuple[MediaSpan, ...] = ()
    # Shares cached blocks only with requests of the same salt (scheduler/prefix_hash.py).
    cache_salt: str | None = None
    arrival_time: float = field(default_factory=time.monotonic)
    # When the request reached each phase, time.monotonic() like arrival_time; None: not yet.
    # The engine sets them (the scheduler keeps no clock): queued on entering its scheduler,
    # scheduled the first time a step took it (a resumption after preemption keeps it), the
    # first and the latest sampled token as their step's result came back.
    queued_time: float | None = None
    scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    output_token_ids: list[int] = field(default_factory=list)
    status: RequestStatus = RequestStatus.WAITING
    # Tokens whose KV is in the cache (computed here or found in the prefix cache).
    num_computed_tokens: int = 0
    # Prompt tokens served from the prefix cache at first admission (usage.cached_tokens).
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    # Draft tokens the worker holds for this request's next step (speculative decoding): the
    # scheduler may schedule up to this many after its next token. Reset by every result.
    num_draft_tokens: int = 0
    # May the worker draft for it (speculation is configured and the request is fit for it)?
    speculate: bool = False

    @property
    def priority(self) -> int:
        return self.sampling_params.priority

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def all_token_ids(self) -> list[int]:
        return self.prompt_token_ids + self.output_token_ids

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def reads_prefix_cache(self) -> bool:
        """Whether cached blocks may stand in for computing the prompt's leading tokens."""
        return self.sampling_params.prompt_logprobs is None

    def append_output_token(self, token_id: int) -> None:
        """Record a sampled token and decide whether the request is done."""
        self.output_token_ids.append(token_id)
        params = self.sampling_params
        # The worker bans stops while fewer than min_tokens tokens precede the one it samples;
        # this check agrees, so min_tokens of 3 means three tokens, then an EOS at the 4th.
        may_stop = self.num_output_tokens > params.min_tokens
        if may_stop and (
            token_id in params.stop_token_ids
            or (not params.ignore_eos and token_id in self.eos_token_ids)
        ):
            self.status = RequestStatus.FINISHED_STOPPED
        elif self.num_output_tokens >= params.max_tokens:
            self.status = RequestStatus.FINISHED_LENGTH
