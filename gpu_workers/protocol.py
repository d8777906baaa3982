"""Messages between the server process and a worker process.

Each message is a small slots dataclass with a unique integer TAG. On the wire a message is
the msgpack array [TAG, field0, field1, ...] in declaration order; nested messages are
encoded the same way, so decoding is a table lookup by tag and never evaluates names.
A request travels in full once (NewRequest) and as deltas afterwards (CachedRequest).
This module imports neither torch nor anything from omni/ or scheduler/.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack


@dataclass(slots=True)
class SamplingOptions:
    TAG: ClassVar[int] = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    # None: no logprobs. 0: sampled token only. k > 0: also the top k alternatives.
    logprobs: int | None = None


@dataclass(slots=True)
class MediaRef:
    """An encoder output injected at prompt positions [offset, offset + num_rows): the rows of
    the artifact stored under key replace the placeholder tokens' embeddings there."""

    TAG: ClassVar[int] = 10
    key: str
    offset: int
    num_rows: int


@dataclass(slots=True)
class NewRequest:
    """First appearance of a request on a worker: everything the worker keeps about it."""

    TAG: ClassVar[int] = 2
    request_id: str
    token_ids: list[int]  # prompt token ids (the worker appends what it samples)
    sampling: SamplingOptions
    block_ids: list[int]  # the request's whole block table so far
    num_computed_tokens: int  # tokens [0, num_computed_tokens) already have KV in the cache
    num_scheduled_tokens: int  # compute tokens [num_computed, num_computed + num_scheduled)
    media: list[MediaRef] = field(default_factory=list)  # sorted by offset, non-overlapping


@dataclass(slots=True)
class CachedRequest:
    """A request the worker already knows: only what changed since its last step."""

    TAG: ClassVar[int] = 3
    request_id: str
    new_block_ids: list[int]  # appended to the block table, or the whole table if resumed
    num_computed_tokens: int
    num_scheduled_tokens: int
    # True after a preemption: new_block_ids replaces the table (KV is recomputed from
    # num_computed_tokens, which then counts only prefix-cache hits).
    resumed: bool = False


@dataclass(slots=True)
class Step:
    """One forward pass: prefill chunks and decodes together.

    The worker samples a token for a scheduled request exactly when its chunk reaches the end
    of its known tokens (num_computed + num_scheduled == len(token_ids)); a partial prefill
    chunk samples nothing.
    """

    TAG: ClassVar[int] = 4
    step_id: int
    new_requests: list[NewRequest]
    cached_requests: list[CachedRequest]
    # Requests that finished or were aborted since the last step: drop their worker state.
    finished_request_ids: list[str]


@dataclass(slots=True)
class Shutdown:
    TAG: ClassVar[int] = 5


@dataclass(slots=True)
class Ready:
    TAG: ClassVar[int] = 6
    worker_id: int
    device: str
    num_kv_blocks: int
    block_size: int
    max_model_len: int
    # An encoder worker's components (vision_encoder, audio_encoder, ...); empty for an LLM.
    components: list[str] = field(default_factory=list)


@dataclass(slots=True)
class SampledToken:
    TAG: ClassVar[int] = 7
    request_id: str
    token_id: int
    logprob: float | None = None
    # [(token_id, logprob), ...] best first, when logprobs > 0 was asked for
    top_logprobs: list[list[Any]] | None = None


@dataclass(slots=True)
class StepResult:
    TAG: ClassVar[int] = 8
    step_id: int
    sampled: list[SampledToken]
    # [request_id, reason] of requests dropped from this step before the forward (their
    # injected embeddings could not be read); the server fails just those.
    failed: list[list[str]] = field(default_factory=list)


@dataclass(slots=True)
class WorkerError:
    """The worker could not run a step (or could not start); fatal ones end the worker."""

    TAG: ClassVar[int] = 9
    message: str
    step_id: int | None = None
    fatal: bool = False


@dataclass(slots=True)
class EncodeItem:
    """One media item for one encoder component; the worker decodes the bytes itself."""

    TAG: ClassVar[int] = 11
    item_id: int
    component: str  # vision_encoder | audio_encoder | image_tokenizer | audio_tokenizer
    kind: str  # image | video | audio
    key: str  # where the output goes in the artifact store
    data: bytes  # the media as the client sent it (image/audio/video file bytes)
    fmt: str | None  # the client's audio format name, if any
    param: str  # the request field it came from, e.g. "messages[0].content[1]", for errors


@dataclass(slots=True)
class EncodeBatch:
    TAG: ClassVar[int] = 12
    batch_id: int
    items: list[EncodeItem]


@dataclass(slots=True)
class EncodedItem:
    TAG: ClassVar[int] = 13
    item_id: int
    num_rows: int  # embedding rows (continuous components) or codes (discrete ones)
    codes: list[int] | None = None  # discrete components only
    error: str | None = None  # the media could not be decoded: a client error naming param
    store_error: str | None = None  # decoded and encoded, but the store refused the output


@dataclass(slots=True)
class EncodeResult:
    TAG: ClassVar[int] = 14
    batch_id: int
    items: list[EncodedItem]
    # (component, items encoded together, seconds of preprocessing + forward) per forward
    forwards: list[list[Any]] = field(default_factory=list)
    # the artifact-store writes of this batch: seconds for all of them (they run
    # concurrently), and how many failed
    store_put_seconds: float = 0.0
    store_put_failures: int = 0


Message = (
    SamplingOptions
    | NewRequest
    | CachedRequest
    | Step
    | Shutdown
    | Ready
    | SampledToken
    | StepResult
    | WorkerError
    | MediaRef
    | EncodeItem
    | EncodeBatch
    | EncodedItem
    | EncodeResult
)

_TYPES: dict[int, type] = {
    cls.TAG: cls
    for cls in (
        SamplingOptions,
        NewRequest,
        CachedRequest,
        Step,
        Shutdown,
        Ready,
        SampledToken,
        StepResult,
        WorkerError,
        MediaRef,
        EncodeItem,
        EncodeBatch,
        EncodedItem,
        EncodeResult,
    )
}
_TAG_OF: dict[type, int] = {cls: tag for tag, cls in _TYPES.items()}
_FIELDS: dict[type, tuple[str, ...]] = {
    cls: tuple(f.name for f in dataclasses.fields(cls)) for cls in _TYPES.values()
}
_NESTED = frozenset(_TYPES.values())


def _to_wire(value: Any) -> Any:
    cls = type(value)
    if cls in _NESTED:
        return [cls.TAG, *(_to_wire(getattr(value, name)) for name in _FIELDS[cls])]
    if cls is list or cls is tuple:
        return [_to_wire(v) for v in value]
    return value


def encode(message: Message) -> bytes:
    return msgpack.packb(_to_wire(message), use_bin_type=True)


def _decode_as(cls: type, items: list[Any]) -> Any:
    names = _FIELDS[cls]
    if len(items) != len(names):
        raise ValueError(f"{cls.__name__}: expected {len(names)} fields, got {len(items)}")
    values = []
    for name, item in zip(names, items):
        sub = _SUBTYPES.get((cls, name))
        if sub is None or item is None:
            values.append(item)
        elif sub[1]:  # a list of messages
            values.append([_decode_as(sub[0], _check_tag(sub[0], x)) for x in item])
        else:
            values.append(_decode_as(sub[0], _check_tag(sub[0], item)))
    return cls(*values)


def _check_tag(cls: type, item: list[Any]) -> list[Any]:
    tag = _TAG_OF[cls]
    if not isinstance(item, list) or not item or item[0] != tag:
        raise ValueError(f"expected a {cls.__name__} message")
    return item[1:]


# Which fields hold nested messages: (owner, field) -> (type, is_list).
_SUBTYPES: dict[tuple[type, str], tuple[type, bool]] = {
    (NewRequest, "sampling"): (SamplingOptions, False),
    (NewRequest, "media"): (MediaRef, True),
    (EncodeBatch, "items"): (EncodeItem, True),
    (EncodeResult, "items"): (EncodedItem, True),
    (Step, "new_requests"): (NewRequest, True),
    (Step, "cached_requests"): (CachedRequest, True),
    (StepResult, "sampled"): (SampledToken, True),
}


def decode(data: bytes) -> Message:
    items = msgpack.unpackb(data, raw=False, strict_map_key=True)
    if not isinstance(items, list) or not items or items[0] not in _TYPES:
        raise ValueError("not an omni-serve message")
    cls = _TYPES[items[0]]
    return _decode_as(cls, items[1:])  # type: ignore[no-any-return]
