"""LLMRunner: holds the LLM weights, the paged KV cache and per-request state; runs Steps.

The server sends each request in full once (NewRequest) and then deltas (CachedRequest);
the runner keeps token ids (prompt + everything it sampled), the block table, sampling
options and the request's RNG. One Step is one forward over a packed batch: for every
scheduled request the tokens

    token_ids[num_computed_tokens : num_computed_tokens + num_scheduled_tokens]

at positions [num_computed_tokens, num_computed_tokens + num_scheduled_tokens). A token is
sampled for a request exactly when its chunk ends at len(token_ids), unless it is prefill-only.
A request that wants prompt logprobs gets those of every prompt token its chunk predicts.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from gpu_workers.artifacts import embeddings_from_bytes
from gpu_workers.attention.backend import HeadShape, KVCache, SequenceChunk
from gpu_workers.attention.compiled_decode import DecodeGraphBackend
from gpu_workers.attention.registry import create_attention_backend
from gpu_workers.distributed import GroupMember
from gpu_workers.llm.decode_graph import DecodeGraph
from gpu_workers.llm.loader import load_model, read_model_config
from gpu_workers.llm.memory import MemoryReader, kv_cache_budget, kv_cache_zeros, profile_peak, reader_for
from gpu_workers.llm.step_memory import StepShape, prompt_slice_rows, step_items
from gpu_workers.models import small_m_linear
from gpu_workers.models.packed_linear import pack_linears
from gpu_workers.models.registry import CausalLMConfig
from gpu_workers.runner import Runner, register_runner
from gpu_workers.sample.penalties import TokenHistory
from gpu_workers.sample.sampler import Sampler, position_generators, validate_options
from gpu_workers.sample.token_masks import StepMaskReader, row_masks
from gpu_workers.spec.drafts import Drafter, draft_next, emitted
from gpu_workers.staging import HostStaging
from gpu_workers.store_client import LRUBytes, StoreClient
from omni.shared import protocol

log = logging.getLogger("omni.llm_runner")

# Reads an encoder artifact's bytes by key (the artifact store); raises when it cannot.
ArtifactReader = Callable[[str], bytes]
DEFAULT_EMBEDDING_CACHE_BYTES = 1024**3
# request id -> [(first row within its chunk, embedding rows to put there)]
MediaRows = dict[str, list[tuple[int, torch.Tensor]]]
# Artifact reads started ahead (at placement) and not yet collected by a step: beyond this
# many, the oldest finished ones (of requests that left before they ran) are forgotten.
MAX_PENDING_FETCHES = 256


def kv_bytes_per_block(model: CausalLMConfig, block_size: int, dtype: torch.dtype) -> int:
    # K and V, every layer
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * model.num_layers * block_size * model.num_kv_heads * model.head_dim * elem


# The KV cache on the CPU when no size is given. On a GPU it is what the worker's share of the
# device leaves once its largest batch has run (gpu_workers/llm/memory.py).
CPU_KV_CACHE_BYTES = 2 * 1024**3


@dataclass(slots=True)
class RequestState:
    token_ids: list[int]  # prompt, then every sampled token
    block_ids: list[int]
    sampling: protocol.SamplingOptions
    media: list[protocol.MediaRef] = field(default_factory=list)
    # token_ids[:num_prompt_tokens] is the prompt: a NewRequest comes once, at a request's first
    # schedule, before any output (a resumed one comes back as a CachedRequest).
    num_prompt_tokens: int = field(init=False)
    # Prompt positions [1, prompt_logprobs_end) have had their logprobs sent: a prompt that
    # is recomputed after a preemption sends none twice.
    prompt_logprobs_end: int = 1
    draft: list[int] = field(default_factory=list)  # speculative decoding's, after token_ids
    backoff: tuple[int, int, int] = (0, 0, 0)  # drafting's (drafts.draft_next): misses, next at, cap
    generators: list[torch.Generator] = field(default_factory=list)  # a seeded request's, per row

    def __post_init__(self) -> None:
        self.num_prompt_tokens = len(self.token_ids)


@dataclass(frozen=True, slots=True)
class _PromptRows:
    """Prompt positions [start, start + count) of one request, whose logprobs come from the
    hidden states of the packed rows [row, row + count) (positions start - 1 ...)."""

    request_id: str
    row: int
    start: int
    count: int


@dataclass(frozen=True, slots=True)
class _Scheduled:
    request_id: str
    num_computed_tokens: int
    num_scheduled_tokens: int


@register_runner
class LLMRunner(Runner):
    SPEC = protocol.LLMWorkerSpec
    JOB = protocol.Step

    def __init__(
        self,
        model_dir: Path | str,
        *,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        block_size: int = 16,
        num_kv_blocks: int | None = None,  # wins over kv_cache_memory_bytes when both are given
        kv_cache_memory_bytes: int | None = None,
        gpu_memory_utilization: float | None = None,  # on GPU, when no size is given
        max_model_len: int | None = None,  # default: the model's max_position_embeddings
        attention_backend: str = "auto",  # a name in attention.registry, or "auto"
        pack_cpu_weights: bool = True,  # oneDNN-packed linears on CPU (models/packed_linear.py)
        quantization: str | None = None,  # "int8": int8 Linear weights (models/int8_linear.py)
        read_artifact: ArtifactReader | None = None,  # needed only for requests with media
        embedding_cache_bytes: int = DEFAULT_EMBEDDING_CACHE_BYTES,
        profile_tokens: int = 0,  # the largest step's tokens, run once before sizing the KV cache
        memory_shares: int = 1,  # LLM workers of this device still to size theirs, this one included
        memory: MemoryReader | None = None,  # default: CUDA's counters on a GPU, none on the CPU
        compile_decode: bool = False,  # decode-only steps through the compiled step (llm/decode_graph.py)
        max_num_seqs: int = 64,  # the largest decode bucket
        decode_kernel: str | None = None,  # the compiled step's attention; None: compiled_decode's default
        drafter: Drafter | None = None,  # speculative decoding's drafts (gpu_workers/spec/drafts.py)
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.device = torch.device(device)
        self.dtype = dtype
        self.block_size = block_size
        config = read_model_config(Path(model_dir))
        heads = HeadShape(config.num_heads, config.num_kv_heads, config.head_dim)
        # a cache the backend's kernel cannot take is an error here, at start, naming what
        self.attention_backend = create_attention_backend(
            attention_backend, block_size=block_size, device=self.device, dtype=dtype, heads=heads
        )
        # the model's layers see the compiled step's attention first, when there is one
        model_backend = DecodeGraphBackend(self.attention_backend) if compile_decode else self.attention_backend
        self.model = load_model(
            Path(model_dir), device=self.device, dtype=dtype, backend=model_backend, quantization=quantization
        )
        if pack_cpu_weights:
            with torch.inference_mode():
                pack_linears(self.model, device=self.device, dtype=dtype)
        if self.device.type == "cpu":
            small_m_linear.gather_into_huge_pages(self.model)  # the small-M copies (int8's too)
        # decode steps of up to this many rows run every layer in one native call (small_m_linear)
        self.native_rows = self.model.native_rows(dtype)
        mc = self.model.config
        self.max_model_len = max_model_len or mc.max_position_embeddings
        if self.max_model_len > mc.max_position_embeddings:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings "
                f"{mc.max_position_embeddings}"
            )
        self.sampler = Sampler()
        self.drafter = drafter
        self.requests: dict[str, RequestState] = {}
        self.read_artifact = read_artifact
        # Injected embeddings by store key, already on the device in the model's dtype.
        self.embeddings = LRUBytes(embedding_cache_bytes)
        self._readers = concurrent.futures.ThreadPoolExecutor(8, thread_name_prefix="artifact-read")
        # Reads under way, by key: started when a request is placed, collected by its step.
        self._fetches: dict[str, concurrent.futures.Future[bytes]] = {}
        self._staging = HostStaging(self.device)  # ids, positions and sample rows: one copy a step
        self.decode_graph: DecodeGraph | None = None  # made once the KV cache has its size
        self._scratch_blocks = int(compile_decode)
        memory = memory or reader_for(self.device)
        held = 0  # reserved for the steps once the KV cache is made (llm/memory.py)
        if num_kv_blocks is None and kv_cache_memory_bytes is None and memory is not None:
            activations = self._profile(memory, min(profile_tokens, self.max_model_len)) if profile_tokens else 0
            shape = StepShape(max_num_seqs, self.max_model_len, block_size, profile_tokens, compile_decode,
                              decode_kernel, drafter, self.attention_backend.name)  # fmt: skip
            items = step_items(memory, self.model, dtype, shape)  # the budget releases all scratch first
            budget = kv_cache_budget(memory, activations, gpu_memory_utilization, memory_shares, items)
            kv_cache_memory_bytes, held = budget.kv_bytes, budget.held
        if num_kv_blocks is None:
            if kv_cache_memory_bytes is None:
                kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
            num_kv_blocks = kv_cache_memory_bytes // kv_bytes_per_block(mc, block_size, dtype)
        if num_kv_blocks < 1:
            raise ValueError(f"the KV cache must hold at least one block, got {num_kv_blocks}")
        self._allocate_kv_cache(num_kv_blocks)
        self.attention_backend.check_cache(self.kv_caches[0], heads)
        if compile_decode:  # its attention: decode_kernel, else the eager backend's library kernel (or gather)
            self.decode_graph = DecodeGraph(self.model, self.kv_cache, max_num_seqs=max_num_seqs, kernel=decode_kernel,
                                            attention_backend=self.attention_backend.name)  # fmt: skip
        if memory is not None:
            memory.hold(held)

    def _allocate_kv_cache(self, num_kv_blocks: int) -> None:
        mc = self.model.config
        self.num_kv_blocks = num_kv_blocks
        # (layers, K|V, blocks, block_size, kv_heads, head_dim). Zeros, not empty: padded
        # decode gathers read unused slots, and masked-out NaN garbage would still poison
        # softmax(scores) @ V. The compiled decode step's padding rows write into one more
        # block, past those the scheduler is told of.
        shape = (mc.num_layers, 2, num_kv_blocks + self._scratch_blocks, self.block_size, mc.num_kv_heads, mc.head_dim)
        self.kv_cache = kv_cache_zeros(shape, self.dtype, self.device)
        self.kv_caches: list[KVCache] = [(layer[0], layer[1]) for layer in self.kv_cache]

    def _profile(self, memory: MemoryReader, num_tokens: int) -> int:
        """The activation peak of the largest step (one prefill of num_tokens) over a KV cache
        just large enough for it, which is freed again; the allocator keeps the peak reserved
        for the steps to come (review A7)."""
        num_blocks = -(-num_tokens // self.block_size)
        self._allocate_kv_cache(num_blocks)
        request = protocol.NewRequest(
            "profile", [0] * num_tokens, protocol.SamplingOptions(temperature=0.0), list(range(num_blocks)), 0, num_tokens
        )
        try:  # the cache is allocated already: the peak above it is the step's own
            return profile_peak(memory, lambda: self.execute(protocol.Step(0, [request], [], [])))
        finally:  # finished as the scheduler finishes a request, so every per-request state goes
            self.execute(protocol.Step(1, [], [], [request.request_id]))
            del self.kv_cache, self.kv_caches

    @classmethod
    def from_spec(cls, spec: protocol.LLMWorkerSpec, group: GroupMember) -> LLMRunner:
        store = StoreClient.from_settings(spec.store) if spec.store is not None else None
        runner = cls(
            model_dir=spec.model_dir,
            device=spec.device,
            dtype=getattr(torch, spec.dtype),
            block_size=spec.block_size,
            num_kv_blocks=spec.num_kv_blocks,
            kv_cache_memory_bytes=spec.kv_cache_memory_bytes,
            gpu_memory_utilization=spec.gpu_memory_utilization,
            max_model_len=spec.max_model_len,
            attention_backend=spec.attention_backend,
            quantization=spec.quantization,
            read_artifact=store.get if store is not None else None,
            embedding_cache_bytes=spec.embedding_cache_bytes,
            profile_tokens=spec.profile_tokens,
            memory_shares=spec.memory_shares,
            compile_decode=spec.compile_decode,
            max_num_seqs=spec.max_num_seqs,
            drafter=Drafter.from_spec(spec),
        )
        # before the worker reports ready: the paged CPU kernel compiles here, not in a request
        mc = runner.model_config
        log.info("attention backend %s on %s (%s)", type(runner.attention_backend).__name__, runner.device, runner.dtype)
        runner.attention_backend.warm_up(runner.kv_caches[0], mc.num_heads, mc.attention_scale)
        if runner.decode_graph is not None:
            try:
                runner.decode_graph.warm_up()
            except Exception as exc:  # no C++ compiler, an op inductor cannot lower: serve eagerly
                log.warning("the compiled decode step is unavailable, decode runs eagerly: %s", exc)
                runner.decode_graph = None
        return runner

    def ready_message(self, spec: protocol.LLMWorkerSpec) -> protocol.LLMReady:
        return protocol.LLMReady(
            worker_id=spec.worker_id,
            device=spec.device,
            num_kv_blocks=self.num_kv_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
        )

    def run(self, job: protocol.Step) -> protocol.StepResult:
        return self.execute(job)

    def close(self) -> None:
        self._readers.shutdown(wait=False)

    @property
    def model_config(self) -> CausalLMConfig:
        return self.model.config

    def execute(self, step: protocol.Step) -> protocol.StepResult:
        masks = StepMaskReader(step, self.receive)
        try:
            return self._execute(step, masks)
        finally:
            masks.settle()  # a step that failed, or never sampled, still takes its masks off the pipe

    def _execute(self, step: protocol.Step, masks: StepMaskReader) -> protocol.StepResult:
        for request_id in step.finished_request_ids:
            self._release(request_id)  # unknown ids: nothing to drop
        # Requests placed on this worker but not yet scheduled: their reads run meanwhile.
        self._start_fetches(step.media_prefetch)
        scheduled = self._apply_deltas(step)
        # A request's first step starts reading all its media, later chunks' included.
        self._start_fetches(ref.key for r in step.new_requests for ref in r.media)
        failed, media = self._load_media(scheduled)
        if not scheduled:
            return protocol.StepResult(step.step_id, [], failed)
        with torch.inference_mode():
            sampled, prompt_logprobs = self._run(scheduled, media, masks)
        drafted = draft_next(self.drafter, self.requests, sampled, self.max_model_len)
        return protocol.StepResult(step.step_id, sampled, failed, prompt_logprobs, drafted)

    def _apply_deltas(self, step: protocol.Step) -> list[_Scheduled]:
        # Everything is checked before any state changes: a rejected step leaves the runner as it was.
        new_states: dict[str, RequestState] = {}
        tables: dict[str, list[int]] = {}
        scheduled: list[_Scheduled] = []
        for r in step.new_requests:
            if r.request_id in self.requests or r.request_id in new_states:
                raise ValueError(f"request {r.request_id!r} is already known")
            vocab = self.model_config.vocab_size
            validate_options(r.sampling, vocab)
            if not r.token_ids or not all(0 <= t < vocab for t in r.token_ids):
                raise ValueError(f"request {r.request_id!r}: token ids must be non-empty and in [0, {vocab})")
            self._check_block_ids(r.request_id, r.block_ids)
            self._check_media(r)
            new_states[r.request_id] = RequestState(list(r.token_ids), list(r.block_ids), r.sampling, list(r.media))
            tables[r.request_id] = new_states[r.request_id].block_ids
            scheduled.append(_Scheduled(r.request_id, r.num_computed_tokens, r.num_scheduled_tokens))
        for c in step.cached_requests:
            state = self.requests.get(c.request_id)
            if state is None or c.request_id in tables:
                raise ValueError(f"request {c.request_id!r}: unknown or scheduled twice")
            self._check_block_ids(c.request_id, c.new_block_ids)
            tables[c.request_id] = list(c.new_block_ids) if c.resumed else state.block_ids + c.new_block_ids
            scheduled.append(_Scheduled(c.request_id, c.num_computed_tokens, c.num_scheduled_tokens))
        for s in scheduled:
            state = new_states.get(s.request_id) or self.requests[s.request_id]
            end = s.num_computed_tokens + s.num_scheduled_tokens
            known = len(state.token_ids) + (len(state.draft) if s.num_computed_tokens == len(state.token_ids) - 1 else 0)
            if s.num_computed_tokens < 0 or s.num_scheduled_tokens < 1 or end > known:
                raise ValueError(
                    f"request {s.request_id!r}: cannot compute tokens [{s.num_computed_tokens}, {end}) "
                    f"of {len(state.token_ids)} (and {len(state.draft)} drafts)"
                )
            if end > self.max_model_len:
                raise ValueError(f"request {s.request_id!r}: {end} tokens exceed max_model_len {self.max_model_len}")
            if len(tables[s.request_id]) * self.block_size < end:
                raise ValueError(
                    f"request {s.request_id!r}: {len(tables[s.request_id])} blocks of {self.block_size} "
                    f"cannot hold {end} tokens"
                )
        self.requests.update(new_states)
        for request_id, table in tables.items():
            self.requests[request_id].block_ids = table
        return scheduled

    def _check_block_ids(self, request_id: str, block_ids: list[int]) -> None:
        if not all(0 <= b < self.num_kv_blocks for b in block_ids):
            raise ValueError(f"request {request_id!r}: block ids must be in [0, {self.num_kv_blocks})")

    def _check_media(self, r: protocol.NewRequest) -> None:
        end = 0
        for ref in r.media:
            if ref.offset < end or ref.num_rows < 1 or ref.offset + ref.num_rows > len(r.token_ids):
                raise ValueError(
                    f"request {r.request_id!r}: media spans must be sorted, disjoint and inside the prompt"
                )
            end = ref.offset + ref.num_rows
        if r.media and self.read_artifact is None:
            raise ValueError(f"request {r.request_id!r} has media but this worker has no artifact store")

    # ---- injected embeddings -----------------------------------------------------------
    def _chunk_media(self, s: _Scheduled) -> list[tuple[protocol.MediaRef, int, int]]:
        """(ref, lo, hi) for each item the chunk computes: prompt positions [lo, hi) =
        [start, end) & [offset, offset + num_rows). A chunk boundary may cut an item anywhere."""
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens
        spans = []
        for ref in self.requests[s.request_id].media:
            lo, hi = max(start, ref.offset), min(end, ref.offset + ref.num_rows)
            if lo < hi:
                spans.append((ref, lo, hi))
        return spans

    def _load_media(self, scheduled: list[_Scheduled]) -> tuple[list[protocol.FailedRequest], MediaRows]:
        """The embedding rows each chunk injects, by request: [(row in the chunk, rows)].

        A request whose artifact cannot be read leaves this step (and the runner) instead of
        failing everyone batched with it, and is reported as failed. So does a request that
        reads a block a dropped one was to write in this same step (the scheduler lets a
        newcomer hit blocks hashed earlier in the same schedule pass): that KV never exists.
        """
        wanted = {s.request_id: spans for s in scheduled if (spans := self._chunk_media(s))}
        if not wanted:
            return [], {}  # the text-only step: nothing to do
        self._start_fetches(ref.key for spans in wanted.values() for ref, _, _ in spans)  # resumed requests'
        failed: list[protocol.FailedRequest] = []
        rows: MediaRows = {}
        unwritten: set[int] = set()
        for s in [s for s in scheduled if s.request_id in wanted]:
            pieces = rows[s.request_id] = []
            for ref, lo, hi in wanted[s.request_id]:
                try:
                    x = self._embedding(ref)
                except Exception as exc:  # store down, key gone, or a malformed artifact
                    log.error("request %s: cannot read %s: %s", s.request_id, ref.key, exc)
                    failed.append(protocol.FailedRequest(s.request_id, f"cannot read encoder output {ref.key}: {exc}"))
                    del rows[s.request_id]
                    unwritten.update(self._drop(s, scheduled))
                    break
                pieces.append((lo - s.num_computed_tokens, x[lo - ref.offset : hi - ref.offset]))
        while unwritten:  # to a fixpoint: a dropped sharer's own writes go unwritten too
            more: set[int] = set()
            for s in list(scheduled):
                end = s.num_computed_tokens + s.num_scheduled_tokens
                if unwritten.intersection(self.requests[s.request_id].block_ids[: -(-end // self.block_size)]):
                    failed.append(
                        protocol.FailedRequest(s.request_id, "shares prompt blocks with a request that failed in the same step")
                    )
                    rows.pop(s.request_id, None)
                    more.update(self._drop(s, scheduled))
            unwritten = more
        return failed, rows

    def _drop(self, s: _Scheduled, scheduled: list[_Scheduled]) -> list[int]:
        """Take a request out of this step and the runner; the block ids it was to write."""
        start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens
        written = self.requests[s.request_id].block_ids[start // self.block_size : -(-end // self.block_size)]
        scheduled.remove(s)
        self._release(s.request_id)
        return written

    def _release(self, request_id: str) -> None:  # it leaves the runner: its state, the sampler's and the drafter's
        self.requests.pop(request_id, None)
        self.sampler.release(request_id)
        if self.drafter is not None:
            self.drafter.release(request_id)

    def _start_fetches(self, keys: Iterable[str]) -> None:
        """Start reading, on the reader threads, each artifact the cache lacks and no read is
        under way for. Called when requests are placed (review C5), so a step only waits for
        reads still running, and several images cost one store round trip, not one each."""
        read = self.read_artifact
        if read is None:
            return
        for key in keys:
            if key not in self._fetches and self.embeddings.get(key) is None:
                self._fetches[key] = self._readers.submit(read, key)
        if len(self._fetches) > MAX_PENDING_FETCHES:
            for key in [k for k, f in self._fetches.items() if f.done()][: len(self._fetches) - MAX_PENDING_FETCHES]:
                del self._fetches[key]

    def _cache_embedding(self, key: str, data: bytes) -> torch.Tensor:
        x = embeddings_from_bytes(data).to(self.device, self.dtype)
        self.embeddings.put(key, x, x.numel() * x.element_size())
        return x

    def _embedding(self, ref: protocol.MediaRef) -> torch.Tensor:
        x = self.embeddings.get(ref.key)
        if x is None:
            assert self.read_artifact is not None
            fetch = self._fetches.pop(ref.key, None)
            data = None
            if fetch is not None:
                with contextlib.suppress(Exception):  # read again below: it raises the error we report
                    data = fetch.result()
            x = self._cache_embedding(ref.key, data if data is not None else self.read_artifact(ref.key))
        hidden = self.model_config.hidden_size
        if tuple(x.shape) != (ref.num_rows, hidden):
            raise ValueError(f"{ref.key} holds {tuple(x.shape)} embeddings, the prompt wants ({ref.num_rows}, {hidden})")
        return x  # type: ignore[no-any-return]

    def _inputs_embeds(
        self, scheduled: list[_Scheduled], input_ids: torch.Tensor, media: MediaRows
    ) -> torch.Tensor | None:
        """Token embeddings with every media row in place, or None when no chunk has media."""
        if not any(media.values()):
            return None
        h = self.model.embed(input_ids)  # (T, H)
        row = 0  # the chunk's first row in the packed batch
        for s in scheduled:
            for first, rows in media.get(s.request_id, ()):
                h[row + first : row + first + rows.shape[0]] = rows
            row += s.num_scheduled_tokens
        return h

    def _run(
        self, scheduled: list[_Scheduled], media: MediaRows, step_masks: StepMaskReader | None = None
    ) -> tuple[list[protocol.SampledToken], list[protocol.PromptLogprobs]]:
        input_ids: list[int] = []
        positions: list[int] = []
        chunks: list[SequenceChunk] = []
        sample_rows: list[int] = []  # packed row whose hidden state predicts the next token
        sample_ids: list[str] = []  # per sampled row: a request verifying d drafts has d + 1 rows
        histories: list[TokenHistory] = []  # per sampled row: the request's tokens before it
        pending: list[list[int]] = []  # per sampled row: the drafts between those and it
        generators: list[torch.Generator | None] = []  # per sampled row: its seeded draw's
        prompt_rows: list[_PromptRows] = []
        for s in scheduled:
            state = self.requests[s.request_id]
            start, end = s.num_computed_tokens, s.num_computed_tokens + s.num_scheduled_tokens
            first_row = len(input_ids)
            known = len(state.token_ids)
            chunks.append(SequenceChunk(first_row, s.num_scheduled_tokens, start, state.block_ids, end > known))
            input_ids.extend(state.token_ids[start:end] + state.draft[: max(0, end - known)])  # drafts after the known
            positions.extend(range(start, end))
            if state.sampling.prompt_logprobs is not None:
                # The chunk's rows at positions [start, end) predict tokens [start + 1, end + 1);
                # those that are prompt tokens not yet sent: [lo, hi).
                lo = max(start + 1, state.prompt_logprobs_end)
                hi = min(end + 1, state.num_prompt_tokens)
                if lo < hi:
                    prompt_rows.append(_PromptRows(s.request_id, first_row + lo - 1 - start, lo, hi - lo))
                    state.prompt_logprobs_end = hi
            if end >= known and not state.sampling.prefill_only:
                drafts = end - known
                sample_rows.extend(range(len(input_ids) - 1 - drafts, len(input_ids)))
                sample_ids.extend([s.request_id] * (1 + drafts))
                histories += [state] * (1 + drafts)
                pending += [state.draft[:j] for j in range(1 + drafts)]
                generators += position_generators(state.sampling.seed, known, 1 + drafts, state.generators, self.device)
        if self._compiled_decode(chunks, media):
            assert self.decode_graph is not None  # it stages its own (padded) inputs
            staged = self._staging.stage({"sample_rows": np.asarray(sample_rows, dtype=np.int64)})
            hidden = self.decode_graph.forward(input_ids, positions, [c.block_ids for c in chunks])
        else:
            staged = self._stage_inputs(input_ids, positions, sample_rows)
            metadata = self.attention_backend.build_metadata(chunks)
            ids = staged["ids"]
            hidden = self.model(
                ids,
                staged["positions"],
                self.kv_caches,
                metadata,
                inputs_embeds=self._inputs_embeds(scheduled, ids, media),
            )  # (T, H)
        prompt_logprobs = [self._prompt_logprobs(hidden, p) for p in prompt_rows]
        if not sample_rows:
            return [], prompt_logprobs
        # Every row sampled (a decode-only step): the sample rows are 0..T-1 in order, so
        # hidden is its own selection and the step saves an index kernel.
        sampled_hidden = hidden if len(sample_rows) == hidden.shape[0] else hidden[staged["sample_rows"]]
        logits = self.model.compute_logits(sampled_hidden)  # (N, V)
        # Only now, with the forward queued (on a GPU, running), may sampling wait for the masks.
        masks = step_masks.masks() if step_masks is not None else {}
        states = [self.requests[r] for r in sample_ids]
        outputs = self.sampler.sample(
            logits,
            [s.sampling for s in states],
            generators,
            histories,
            masks=row_masks(sample_ids, masks),  # applied to logits, in place
            request_ids=sample_ids,
            pending=pending,
        )
        return emitted(sample_ids, states, outputs), prompt_logprobs

    def _stage_inputs(self, input_ids: list[int], positions: list[int], sample_rows: list[int]) -> dict[str, torch.Tensor]:
        """The step's token ids, positions and sampled rows on the device, in one copy (C3)."""
        return self._staging.stage(
            {
                "ids": np.asarray(input_ids, dtype=np.int64),
                "positions": np.asarray(positions, dtype=np.int64),
                "sample_rows": np.asarray(sample_rows, dtype=np.int64),
            }
        )

    def _compiled_decode(self, chunks: list[SequenceChunk], media: MediaRows) -> bool:
        """Whether the step goes through the compiled decode step: every chunk one new token
        of a running sequence, no media, a bucket that holds them, and more of them than the
        model's native decode takes (docs/BENCHMARKS.md, session 15)."""
        return (
            self.decode_graph is not None
            and len(chunks) > self.native_rows  # fewer: the model's native decode is faster
            and not any(media.values())
            and self.decode_graph.bucket(len(chunks)) is not None
            and all(c.is_decode for c in chunks)
        )

    def _prompt_logprobs(self, hidden: torch.Tensor, rows: _PromptRows) -> protocol.PromptLogprobs:
        """Log-softmax of the raw logits (as the sampler's logprobs) at the rows predicting
        prompt tokens [start, start + count): each token's logprob, its rank, the top k."""
        state = self.requests[rows.request_id]
        k = state.sampling.prompt_logprobs or 0
        targets = torch.tensor(state.token_ids[rows.start : rows.start + rows.count], device=self.device)
        vocab = self.model_config.vocab_size
        per_slice = prompt_slice_rows(rows.count, vocab)  # the rows step_memory.py counts
        chosen: list[float] = []
        ranks: list[int] = []
        top_ids: list[list[int]] = []
        top_values: list[list[float]] = []
        for i in range(0, rows.count, per_slice):
            n = min(per_slice, rows.count - i)
            logprobs = self.model.compute_logits(hidden[rows.row + i : rows.row + i + n]).log_softmax(dim=-1)  # (n, V)
            target = logprobs.gather(1, targets[i : i + n, None])  # (n, 1)
            chosen += target.squeeze(1).tolist()
            # vLLM's rank: how many tokens are at least as likely, the token itself included
            ranks += (logprobs >= target).sum(dim=-1).tolist()
            if k > 0:
                top = logprobs.topk(min(k, logprobs.shape[1]), dim=-1)
                top_ids += top.indices.tolist()
                top_values += top.values.tolist()
            else:
                top_ids += [[] for _ in range(n)]
                top_values += [[] for _ in range(n)]
        return protocol.PromptLogprobs(rows.request_id, rows.start, chosen, ranks, top_ids, top_values)
