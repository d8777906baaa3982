"""The messages a worker and the server exchange, per worker kind.

A request travels in full once (NewRequest) and as deltas afterwards (CachedRequest). Every
nested structure is a message of its own, so nothing crosses the pipe as an untyped list.
Tags are unique across the whole protocol: this module holds 1-19 and 40 on, specs.py 20-39;
the wire format is wire.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from omni.shared.protocol.wire import message

# ---- common ------------------------------------------------------------------------------


@message
@dataclass(slots=True)
class Shutdown:
    TAG: ClassVar[int] = 5


@message
@dataclass(slots=True)
class WorkerError:
    """The worker could not run a job (or could not start); fatal ones end the worker."""

    TAG: ClassVar[int] = 9
    message: str
    job_id: int | None = None  # the Step's step_id or the EncodeBatch's batch_id
    fatal: bool = False


# ---- the LLM worker ----------------------------------------------------------------------


@message
@dataclass(slots=True)
class SamplingOptions:
    """What the worker's sampler needs of a request's SamplingParams (omni/engines/step.py
    derives it, in one place)."""

    TAG: ClassVar[int] = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int | None = None
    seed: int | None = None
    # None: no logprobs. 0: sampled token only. k > 0: also the top k alternatives.
    logprobs: int | None = None
    # The fields below are scheduler/request.py SamplingParams' own; their defaults do nothing.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    # logit_bias as two parallel lists (msgpack maps would need int keys decoded as such).
    logit_bias_token_ids: list[int] = field(default_factory=list)
    logit_bias_values: list[float] = field(default_factory=list)
    min_p: float = 0.0
    allowed_token_ids: list[int] | None = None  # None: every token may be sampled
    bad_words_token_ids: list[list[int]] = field(default_factory=list)
    min_tokens: int = 0
    # EOS and the stop ids: the sampler bans them while fewer than min_tokens are out (the
    # scheduler still decides when a request ends). Empty when min_tokens is 0.
    min_tokens_stop_ids: list[int] = field(default_factory=list)
    # None: no prompt logprobs. k: each prompt token's logprob and rank, and the top k
    # alternatives at its position, sent back as PromptLogprobs with the steps that compute them.
    prompt_logprobs: int | None = None
    # max_tokens 0: compute the prompt (for its prompt logprobs) and sample nothing.
    prefill_only: bool = False
    # The worker may draft tokens for it (speculative decoding is on, the request did not opt
    # out, and any grammar it has is a plain one; gpu_workers/spec/drafts.py has the rules).
    speculate: bool = False


@message
@dataclass(slots=True)
class MediaRef:
    """An encoder output injected at prompt positions [offset, offset + num_rows): the rows
    of the artifact stored under key replace the placeholder tokens' embeddings there."""

    TAG: ClassVar[int] = 10
    key: str
    offset: int
    num_rows: int


@message
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


@message
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


@message
@dataclass(slots=True)
class TokenMask:
    """The tokens a request may sample this step (its grammar's next-token set): bit t of the
    little-endian int32 words is set when token t is allowed; tokens past the mask's end are
    not. Sent only for constrained requests that sample in this step. A request verifying d
    drafts samples d + 1 rows: bitmask is then their rows' masks, one after another (row j's
    after the grammar took drafts[:j])."""

    TAG: ClassVar[int] = 19
    request_id: str
    bitmask: bytes
    rows: int = 1


@message
@dataclass(slots=True)
class Step:
    """One forward pass: prefill chunks and decodes together.

    The worker samples a token for a scheduled request exactly when its chunk reaches the end
    of its known tokens (num_computed + num_scheduled == len(token_ids)); a partial prefill
    chunk samples nothing.
    """

    TAG: ClassVar[int] = 4
    step_id: int  # the scheduler's (SchedulerOutput.step_id): the one step counter
    new_requests: list[NewRequest]
    cached_requests: list[CachedRequest]
    # Requests that finished or were aborted since the last step: drop their worker state.
    finished_request_ids: list[str]
    token_masks: list[TokenMask] = field(default_factory=list)
    # Artifact keys of requests placed on this worker since the last step and not scheduled in
    # this one: the worker starts reading them now, so their first step does not wait for the store.
    media_prefetch: list[str] = field(default_factory=list)
    # The step's grammar masks come next, in a StepMasks: the server fills them while the worker
    # runs the forward, which reads them just before it samples (review C5).
    masks_follow: bool = False

    @property
    def job_id(self) -> int:
        return self.step_id


@message
@dataclass(slots=True)
class StepMasks:
    """The grammar masks of the Step sent just before it with masks_follow, for its constrained
    requests that sample. error: the server could not fill them; the worker samples nothing
    unconstrained, it fails the step (the server fails the step's requests, as it would have)."""

    TAG: ClassVar[int] = 54
    step_id: int
    token_masks: list[TokenMask]
    error: str | None = None


@message
@dataclass(slots=True)
class LLMReady:
    """An LLM worker has loaded: the KV cache it could allocate bounds the scheduler."""

    TAG: ClassVar[int] = 6
    worker_id: int
    device: str
    num_kv_blocks: int
    block_size: int
    max_model_len: int


@message
@dataclass(slots=True)
class TopLogprob:
    TAG: ClassVar[int] = 15
    token_id: int
    logprob: float


@message
@dataclass(slots=True)
class SampledToken:
    TAG: ClassVar[int] = 7
    request_id: str
    token_id: int
    logprob: float | None = None
    # best first, when logprobs > 0 was asked for
    top_logprobs: list[TopLogprob] | None = None


@message
@dataclass(slots=True)
class PromptLogprobs:
    """Logprobs of the prompt tokens at positions [start, start + len(token_logprobs)), each
    from the raw logits of the position before it (so start >= 1: nothing predicts token 0).
    A chunked prefill sends one per chunk, in order; a prompt recomputed after a preemption
    sends nothing twice."""

    TAG: ClassVar[int] = 40
    request_id: str
    start: int
    token_logprobs: list[float]
    # 1 + how many other tokens are at least as likely as the prompt token (vLLM's rank)
    ranks: list[int]
    # per position, the k most likely tokens and their logprobs, best first ([] when k is 0)
    top_token_ids: list[list[int]]
    top_logprobs: list[list[float]]


@message
@dataclass(slots=True)
class FailedRequest:
    """A request dropped from a step before the forward (its injected embeddings could not be
    read); the server fails just it."""

    TAG: ClassVar[int] = 16
    request_id: str
    reason: str


@message
@dataclass(slots=True)
class Drafted:
    """Draft tokens a worker holds for a request's next step (speculative decoding): the
    scheduler may schedule up to num_tokens of them after the request's next token (the
    server reads the tokens to check a constrained request's drafts against its grammar)."""

    TAG: ClassVar[int] = 55
    request_id: str
    token_ids: list[int]

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@message
@dataclass(slots=True)
class StepResult:
    """sampled: each request's new tokens in order, one per request, or with speculative
    decoding the accepted drafts and the token after them (a request verifying d drafts gets
    1 to d + 1 entries)."""

    TAG: ClassVar[int] = 8
    step_id: int
    sampled: list[SampledToken]
    failed: list[FailedRequest] = field(default_factory=list)
    prompt_logprobs: list[PromptLogprobs] = field(default_factory=list)
    drafted: list[Drafted] = field(default_factory=list)


# ---- the encoder worker ------------------------------------------------------------------


@message
@dataclass(slots=True)
class EncodeItem:
    """One media item for one encoder component; the worker decodes the bytes itself."""

    TAG: ClassVar[int] = 11
    item_id: int
    component: str  # vision_encoder | audio_encoder | image_tokenizer | audio_tokenizer
    kind: str  # the media kind: image | video | audio
    key: str  # where the output goes in the artifact store
    data: bytes  # the media as the client sent it (image/audio/video file bytes)
    fmt: str | None  # the client's audio format name, if any
    param: str  # the request field it came from, e.g. "messages[0].content[1]", for errors


@message
@dataclass(slots=True)
class EncodeBatch:
    TAG: ClassVar[int] = 12
    batch_id: int
    items: list[EncodeItem]

    @property
    def job_id(self) -> int:
        return self.batch_id


@message
@dataclass(slots=True)
class EncodedItem:
    TAG: ClassVar[int] = 13
    item_id: int
    num_rows: int  # embedding rows (continuous components) or codes (discrete ones)
    codes: list[int] | None = None  # discrete components only
    error: str | None = None  # the media could not be decoded: a client error naming param
    store_error: str | None = None  # decoded and encoded, but the store refused the output


@message
@dataclass(slots=True)
class ForwardTiming:
    """One component's forward over a batch: how many items it took and how long
    (preprocessing + forward)."""

    TAG: ClassVar[int] = 17
    component: str
    num_items: int
    seconds: float


@message
@dataclass(slots=True)
class EncodeResult:
    TAG: ClassVar[int] = 14
    batch_id: int
    items: list[EncodedItem]
    forwards: list[ForwardTiming] = field(default_factory=list)
    # the artifact-store writes of this batch: seconds for all of them (they run
    # concurrently), and how many failed
    store_put_seconds: float = 0.0
    store_put_failures: int = 0


@message
@dataclass(slots=True)
class EncoderReady:
    """An encoder worker has loaded: the components it found under its model directory."""

    TAG: ClassVar[int] = 18
    worker_id: int
    device: str
    components: list[str]


# ---- the vision decoder (image output) -----------------------------------------------------


@message
@dataclass(slots=True)
class ImageJob:
    """One image to draw from the codes of one span. Jobs of one DecodeImages batch share
    width, height and steps, so they run as one batch through every step."""

    TAG: ClassVar[int] = 41
    job_id: int
    codes: list[int]  # grid_rows * grid_cols codes, row-major, as the model wrote them
    width: int  # pixels; a size of the decoder's table
    height: int
    steps: int
    seed: int
    guidance_scale: float | None = None  # None: the checkpoint's default
    output_format: str = "png"  # png | jpeg | webp
    quality: int | None = None  # jpeg / webp quality, 0 to 100 (None: the encoder's default)
    partial_images: int = 0  # intermediate previews to send before the image (0 to 3)
    # First-block cache: the DiT's other blocks are skipped at a step whose first block's
    # residual moved less than this, relatively, since the last computed step (0: off)
    step_cache: float = 0.0


@message
@dataclass(slots=True)
class DecodeImages:
    """The vision decoder's job: a batch of compatible ImageJobs."""

    TAG: ClassVar[int] = 42
    batch_id: int
    jobs: list[ImageJob]

    @property
    def job_id(self) -> int:
        return self.batch_id


@message
@dataclass(slots=True)
class PartialImage:
    """A preview of one job, sent before the batch's DecodeResult: the image the denoiser
    predicts at an intermediate step, encoded like the final one."""

    TAG: ClassVar[int] = 43
    batch_id: int
    job_id: int
    index: int  # 0-based, in the order they are sent
    data: bytes


@message
@dataclass(slots=True)
class DecodedImage:
    TAG: ClassVar[int] = 44
    job_id: int
    data: bytes  # the encoded image (output_format)
    width: int
    height: int
    error: str | None = None  # this job could not be drawn (its codes or sizes): a client error
    # DiT block computations of this image, every pass of every guidance model; skipped: the
    # blocks the step cache did not run
    blocks_computed: int = 0
    blocks_skipped: int = 0


@message
@dataclass(slots=True)
class DecodeResult:
    TAG: ClassVar[int] = 45
    batch_id: int
    images: list[DecodedImage]
    step_seconds: float = 0.0  # mean seconds of one denoising step of the batch (all passes)
    vae_seconds: float = 0.0  # the VAE decode and image encoding of the whole batch


@message
@dataclass(slots=True)
class VisionDecoderReady:
    """A vision decoder group has loaded on every rank."""

    TAG: ClassVar[int] = 46
    worker_id: int
    device: str
    world_size: int
    grid_rows: int  # codes per span: grid_rows x grid_cols
    grid_cols: int
    num_codes: int  # codebook entries
    guidance: str  # "autoguidance" | "cfg" | "none"
    default_guidance_scale: float
    sizes: list[str]  # the "WxH" sizes it draws


# ---- the audio decoder (speech output) -----------------------------------------------------


@message
@dataclass(slots=True)
class AudioChunk:
    """The next units of one audio stream (one span the model is writing). The worker keeps
    each open stream's vocoder state between chunks, so a stream's chunks must be sent in
    order; `last` frees the state once this chunk is decoded."""

    TAG: ClassVar[int] = 47
    stream_id: int
    units: list[int]  # unit ids (<|audioNNNN|> -> NNNN), 25 per second of audio
    # Opening chunk only (later chunks reuse the stream's): a speaker of the checkpoint's table,
    # or a float32 embedding taken from a reference recording (SpeakerEmbedding.embedding).
    speaker: int = 0
    speaker_embedding: bytes | None = None
    first: bool = False  # opens the stream: the worker starts it from a fresh state
    last: bool = False


@message
@dataclass(slots=True)
class DecodeAudio:
    """The audio decoder's job: at most one chunk per stream, decoded as one batch; streams
    the server has given up on (their client left) are closed first."""

    TAG: ClassVar[int] = 48
    batch_id: int
    chunks: list[AudioChunk]
    closed: list[int] = field(default_factory=list)

    @property
    def job_id(self) -> int:
        return self.batch_id


@message
@dataclass(slots=True)
class DecodedAudio:
    TAG: ClassVar[int] = 49
    stream_id: int
    samples: bytes  # float32 little-endian, mono, len(units) * hop of them
    error: str | None = None  # this stream failed (a unit out of range, no such speaker): it is closed


@message
@dataclass(slots=True)
class AudioDecodeResult:
    TAG: ClassVar[int] = 50
    batch_id: int
    chunks: list[DecodedAudio]
    seconds: float = 0.0  # the vocoder's time for the whole batch


@message
@dataclass(slots=True)
class EmbedSpeaker:
    """A voice from a reference recording (zero-shot): mono float32 samples at sample_rate."""

    TAG: ClassVar[int] = 51
    job_id: int
    samples: bytes
    sample_rate: int


@message
@dataclass(slots=True)
class SpeakerEmbedding:
    TAG: ClassVar[int] = 52
    job_id: int
    embedding: bytes  # float32, the speaker table's width; empty with an error
    error: str | None = None


@message
@dataclass(slots=True)
class AudioDecoderReady:
    TAG: ClassVar[int] = 53
    worker_id: int
    device: str
    sample_rate: int  # 24,000 in the reference
    hop: int  # samples per unit (960: 25 units a second)
    num_units: int
    speakers: list[str]  # the checkpoint's named voices, in table order
    speaker_encoder: bool  # voices can be taken from a reference recording
    speaker_sample_rate: int = 16000  # what EmbedSpeaker's samples must be at
