"""The compiled decode step: the model's forward for decode-only batches through torch.compile
(inductor; on CUDA with CUDA graphs), chosen by --compile-decode, off with --enforce-eager.

A step whose every chunk is one new token of a running sequence, at most max_num_seqs of them
and without injected media, takes this path; every other step (prefill chunks, mixed batches)
runs the model eagerly as before. Inside the compiled code:

- RMSNorm, RoPE, SiLU*mul, the residual adds and the attention's softmax are plain torch ops
  that inductor fuses into a few loops per layer; multipliers equal to 1.0 are never applied
  (models/llama.py skips them);
- on CPU the layers run as the model's own forward runs them (models/registry.py:CausalLM):
  `layer_inputs`, then each of `layers` through the compiled layer, then `finish`;
- the oneDNN-packed linears on CPU are one opaque op each (models/packed_linear.py);
- attention reads the paged cache in place (attention/compiled_decode.py): on CUDA through the
  attention backend's own library (attention/library_decode.py: FlashInfer's decode wrapper in
  CUDA-graph mode, planned on the host before each replay, or flash-attn's block_table call), the
  kernel the eager path runs, one opaque op; inductor's "gather" only where the backend has no
  paged library kernel (torch_sdpa); on the CPU by default the paged kernel of
  attention/cpu_paged.py. Each layer's new K/V come out of the graph, written into the cache by
  one index_copy after the forward.

The KV cache is marked a static address (torch._dynamo.mark_static_address): CUDA-graph trees
copy every graph input that is neither a parameter, a buffer or module tensor (which dynamo
marks itself) nor so marked into graph-owned memory before each replay, so an unmarked cache
would be duplicated per recorded shape. What is left unmarked is the step's staged inputs (ids,
positions, lengths, slots, the block table: a few KB, each step new): those are copied.

On CPU one decoder layer is compiled, with the batch and the block table's width dynamic: that
code serves every layer and every batch size (one compile per process; CPU steps are
compute-bound, so batches are not padded, except 1 to 2, as dynamo specialises size 1). On CUDA
the whole forward is compiled with mode="reduce-overhead" (CUDA graphs), batches padded to
buckets (powers of two up to max_num_seqs, and max_num_seqs) and the table's width rounded up
to a power of two, so graphs are recorded for a few shapes only; a step's inputs go over in
one pinned host buffer copied non_blocking. Padding rows' slots and block tables point at a
scratch block no request owns (the runner allocates it past the blocks it reports).

The compile happens at start (warm_up, before the worker reports ready) and is logged with its
time. inductor's FX graph and AOT autograd caches keep the compiled code on disk across
restarts (TORCHINDUCTOR_CACHE_DIR, by default ~/.cache/omni-serve/inductor): a warm start still
traces with dynamo but skips inductor's code generation and C++ compiles.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_workers.attention import cpu_paged, library_decode
from gpu_workers.attention.backend import HeadShape
from gpu_workers.attention.compiled_decode import DECODE_KERNELS, DecodeGraphMetadata, default_kernel, write_new_kv
from gpu_workers.models.registry import CausalLM
from gpu_workers.staging import HostStaging

log = logging.getLogger("omni.llm_runner.decode_graph")

MIN_TABLE_WIDTH = 2
MIN_ROWS = 2
CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


def default_cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "omni-serve" / "inductor"


def use_disk_cache() -> str:
    """Point inductor's on-disk caches at omni-serve's cache directory unless the environment
    names another; the directory in use. (inductor writes its default, a directory under /tmp,
    into the environment the first time it looks, so that one counts as unset.)"""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir as inductor_default

    current = os.environ.get(CACHE_ENV)
    if not current or os.path.abspath(current) == os.path.abspath(inductor_default()):
        os.environ[CACHE_ENV] = str(default_cache_dir())
    return os.environ[CACHE_ENV]


def decode_buckets(max_num_seqs: int) -> list[int]:
    """1, 2, 4, ... below max_num_seqs, then max_num_seqs."""
    if max_num_seqs < 1:
        raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
    out = []
    b = 1
    while b < max_num_seqs:
        out.append(b)
        b *= 2
    return [*out, max_num_seqs]


def table_widths(max_model_len: int, block_size: int) -> list[int]:
    """The block-table widths CUDA steps record graphs at (DecodeGraph._width rounds a step's up):
    powers of two from MIN_TABLE_WIDTH to the first that holds max_model_len tokens."""
    blocks = -(-max_model_len // block_size)
    out = [MIN_TABLE_WIDTH]
    while out[-1] < blocks:
        out.append(2 * out[-1])
    return out


def graph_kernel(attention_backend: str | None, device: torch.device, k_cache: torch.Tensor) -> str:
    """The compiled step's attention kernel by default: on CUDA the eager attention backend's
    library where it has a paged decode kernel (the same choice eager makes), else "gather";
    on the CPU "paged" where its kernel reads this (one layer's) cache, else "gather"."""
    if device.type == "cuda":
        return attention_backend if attention_backend in library_decode.CUDA_LIBRARY_KERNELS else "gather"
    return default_kernel(k_cache)


class DecodeGraph:
    """Runs decode-only batches of `model` through compiled code.

    On CPU one decoder layer is compiled with a dynamic batch and table width, and that code
    serves every layer and every batch size (inductor's compile time is the cost that matters
    there, and CPU steps are compute-bound: padding a batch would only add work; a batch of 1
    is padded to 2, as dynamo specialises size 1). On CUDA the whole forward is captured as
    CUDA graphs per bucket (mode="reduce-overhead"), batches padded to their bucket.
    """

    def __init__(
        self,
        model: CausalLM,
        kv_cache: torch.Tensor,  # (L, 2, num_blocks, block_size, Hkv, D); the last block is scratch
        *,
        max_num_seqs: int,
        kernel: str | None = None,  # default: graph_kernel(attention_backend, the cache)
        pad_to_buckets: bool | None = None,  # default: on CUDA only
        attention_backend: str | None = None,  # the eager path's (attention/registry.py name)
        max_model_len: int | None = None,  # sizes a library kernel's index buffers; default: the model's limit
        whole_graph: bool | None = None,  # the whole forward as one graph; default: on CUDA only
    ) -> None:
        known = (*DECODE_KERNELS, *library_decode.LIBRARY_KERNELS)
        if kernel is not None and kernel not in known:
            raise ValueError(f"unknown decode kernel {kernel!r}; known: {', '.join(known)}")
        layer_cache = kv_cache[0, 0]
        if kernel == "paged" and not cpu_paged.supports(layer_cache):
            log.warning("the paged decode kernel cannot read this cache here; using gather")
            kernel = "gather"
        self.model = model
        self.kv_cache = kv_cache
        self.block_size = kv_cache.shape[3]
        self.scratch_block = kv_cache.shape[2] - 1
        self.device = kv_cache.device
        self.kernel = kernel or graph_kernel(attention_backend, self.device, layer_cache)
        self.cuda = self.device.type == "cuda"
        self.whole = self.cuda if whole_graph is None else whole_graph
        self._staging = HostStaging(self.device)  # the step's inputs: one (pinned, on CUDA) copy
        self.pad = self.cuda if pad_to_buckets is None else pad_to_buckets
        self.buckets = decode_buckets(max_num_seqs) if self.pad else [max(MIN_ROWS, max_num_seqs)]
        # never copied into graph memory (the module docstring): set before the first compile
        torch._dynamo.mark_static_address(kv_cache, guard=False)
        self.library: library_decode.DecodeKernel | None = None
        self._meta_kernel = self.kernel  # what the graphs' metadata names: a library kernel's key
        if self.kernel == library_decode.FlashInferDecode.name and not self.pad:
            raise ValueError("the flashinfer decode kernel needs batches padded to buckets (fixed-size wrappers)")
        if self.kernel in library_decode.LIBRARY_KERNELS:
            mc = model.config
            max_len = max_model_len or mc.max_position_embeddings  # the runner's default max_model_len
            try:
                self.library = library_decode.create_decode_kernel(
                    self.kernel, buckets=self.buckets, max_blocks_per_row=-(-max_len // self.block_size),
                    heads=HeadShape(mc.num_heads, mc.num_kv_heads, mc.head_dim), kv_cache=layer_cache,
                    scale=mc.attention_scale,
                )  # fmt: skip
                self._meta_kernel = library_decode.register(self.library)
            except Exception as exc:  # noqa: BLE001 - an import or a wrapper refusing: still serve, gathering
                log.warning("the %s decode kernel is unavailable for the graphs (%s); they gather", self.kernel, exc)
                self.kernel = self._meta_kernel = "gather"
        log.info("compiled decode step: attention by %s", self.describe_kernel())
        self.cache_dir = use_disk_cache()
        # Each model shape and kernel in one process is an entry of the compiled layer's cache
        # (a worker has one; a test process several); fullgraph=True makes the limit an error.
        torch._dynamo.config.recompile_limit = max(32, torch._dynamo.config.recompile_limit)
        self._whole: Callable[..., tuple[torch.Tensor, torch.Tensor]] = torch.compile(
            self._forward, fullgraph=True, mode="reduce-overhead" if self.cuda else None
        )  # on CUDA: CUDA graphs
        self._layer_step: Callable[..., tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = torch.compile(
            self._layer, fullgraph=True
        )
        self.compile_seconds: dict[str, float] = {}

    def _forward(
        self, ids: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        meta = DecodeGraphMetadata(table, lens, self.block_size, self._meta_kernel)
        caches = [(kv[i, 0], kv[i, 1]) for i in range(kv.shape[0])]
        hidden = self.model(ids, positions, caches, meta)  # (B, H)
        new_kv = torch.stack([torch.stack(pair) for pair in meta.new_kv])  # (L, 2, B, Hkv, D)
        return hidden, new_kv

    def _layer(
        self,
        layer: torch.nn.Module,
        h: torch.Tensor,
        shared: tuple[torch.Tensor, ...],
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        table: torch.Tensor,
        lens: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        meta = DecodeGraphMetadata(table, lens, self.block_size, self._meta_kernel)
        h = layer(h, *shared, (k_cache, v_cache), meta)
        k, v = meta.new_kv[0]
        return h, k, v

    def _by_layer(
        self, ids: torch.Tensor, positions: torch.Tensor, table: torch.Tensor, lens: torch.Tensor, kv: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The model's own forward (CausalLM.forward: layer_inputs, the layers, finish), each
        layer through the compiled layer."""
        m = self.model
        h, shared = m.layer_inputs(m.embed(ids), positions)  # (B, H), what every layer reads
        for x in (h, *shared, table, lens):
            torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(table, 1)
        new = []
        for i, layer in enumerate(m.layers):
            h, k, v = self._layer_step(layer, h, shared, kv[i, 0], kv[i, 1], table, lens)
            new.append(torch.stack((k, v)))
        return m.finish(h), torch.stack(new)

    def bucket(self, rows: int) -> int | None:
        if not self.pad:
            return max(MIN_ROWS, rows) if rows <= self.buckets[-1] else None
        return next((b for b in self.buckets if b >= rows), None)

    def _width(self, blocks: int) -> int:
        w = max(MIN_TABLE_WIDTH, blocks)
        return 1 << (w - 1).bit_length() if self.whole else w

    def describe_kernel(self) -> str:
        if self.library is not None:
            return self.library.describe()
        why = "" if self.kernel == "paged" or not self.cuda else " (no paged library kernel for this attention backend)"
        return f"{self.kernel}{why}"

    def forward(self, ids: list[int], positions: list[int], block_tables: list[list[int]]) -> torch.Tensor:
        """Final-normed hidden states (n, H) of n decode rows: token ids, positions (each row's
        context is positions + 1 tokens, the last its own) and block tables."""
        n = len(ids)
        b = self.bucket(n)
        if b is None:
            raise ValueError(f"{n} decode rows exceed the largest bucket {self.buckets[-1]}")
        bs, scratch = self.block_size, self.scratch_block
        needed = [p // bs + 1 for p in positions]
        width = self._width(max(needed))
        pad = b - n
        table = [t[:k] + [scratch] * (width - k) for t, k in zip(block_tables, needed)]
        table += [[scratch] * width] * pad
        slots = [t[p // bs] * bs + p % bs for t, p in zip(block_tables, positions)] + [scratch * bs] * pad
        host = np.array(
            [*ids, *[0] * pad, *positions, *[0] * pad, *[p + 1 for p in positions], *[1] * pad, *slots,
             *(x for row in table for x in row)],
            dtype=np.int64,
        )  # fmt: skip
        dev = self._staging.stage({"inputs": host})["inputs"]
        ids_t, pos_t, lens_t, slots_t = dev[: 4 * b].view(4, b)
        table_t = dev[4 * b :].view(b, width)
        if self.library is not None:  # outside the graph: what its kernel reads that is no input
            self.library.plan(b, table, [*positions, *[0] * pad])
        if self.whole:
            torch._dynamo.mark_dynamic(table_t, 1)
            hidden, new_kv = self._whole(ids_t, pos_t, table_t, lens_t, self.kv_cache)
        else:
            hidden, new_kv = self._by_layer(ids_t, pos_t, table_t, lens_t, self.kv_cache)
        write_new_kv(self.kv_cache, new_kv, slots_t)
        return hidden[:n]

    def warm_up(self) -> None:
        """Compile now, before the worker reports ready: every bucket (on CPU, the one dynamic
        graph), at two table widths, with padding rows only, so only the scratch block is
        written. Sizes differ from each other when traced (no two dynamic sizes share a symbol)."""
        scratch = self.scratch_block
        total = time.perf_counter()
        for b in self.buckets:
            t = time.perf_counter()
            for width in (MIN_TABLE_WIDTH + 1, MIN_TABLE_WIDTH + 2):
                rows = b if self.pad else MIN_ROWS
                pos = (width - 1) * self.block_size
                with torch.inference_mode():
                    self.forward([0] * rows, [pos] * rows, [[scratch] * width] * rows)
            label = f"bucket {b}" if self.pad else "every batch size"
            self.compile_seconds[label] = time.perf_counter() - t
            log.info("compiled decode step, %s: %.1f s", label, self.compile_seconds[label])
        log.info(
            "compiled decode step ready in %.1f s (kernel %s, cache %s)",
            time.perf_counter() - total, self.describe_kernel(), self.cache_dir,
        )  # fmt: skip

    def record_largest(self, max_model_len: int) -> None:
        """Run the largest step this graph can take, the largest bucket with every row at
        max_model_len over the scratch block only (step_memory.py measures it before the KV cache
        is sized). Twice: CUDA-graph trees run a new shape once before they record it."""
        pos = max_model_len - 1
        rows, table = self.buckets[-1], [self.scratch_block] * (pos // self.block_size + 1)
        for _ in range(2):
            with torch.inference_mode():
                self.forward([0] * rows, [pos] * rows, [table] * rows)

    def stats(self) -> dict[str, Any]:
        return {"buckets": self.buckets, "compile_seconds": dict(self.compile_seconds), "kernel": self.kernel}
