"""FlashInfer's kernels built before the server starts: `bin/setup gpu` runs

    python -m gpu_workers.attention.flashinfer_build [--model DIR]... [--head-dims 64,128] [--dtype bfloat16]

FlashInfer 0.7.4 ships no prebuilt attention kernels on PyPI (flashinfer-cubin stops at 0.6.13;
its jit-cache wheels are on flashinfer.ai's own index, for some CUDA builds only), so a kernel is
compiled with nvcc at its first use, into FlashInfer's JIT cache (~/.cache/flashinfer/<version>/
<arch>/cached_ops, per GPU architecture), where every later process finds it. This builds, for
the GPU it finds and each head size it is given, exactly what a worker would, through the
worker's own code: FlashInferBackend.prepare with each prefill kernel alone (FA3 on sm90, FA2),
on the short-row and the long-chunk shape, and the paged decode wrapper the CUDA-graph decode
step calls. A module is keyed by kernel, dtypes, head_dim and features (0.7.4's prefill.py:
get_batch_prefill_module), not by the number of heads or the block size, so one build serves
every model of that head size. It prints each build's time, and which failed: a failure here is
a warning, as it is at start-up, where the worker falls back (FA3 -> FA2 -> torch SDPA).

Head sizes: those of --model's config (or OMNI_SETUP_MODEL's, through bin/setup); else the
project's default models': 64 (the 100M bench checkpoint, 768 / 12 heads; SmolLM2-135M, 576 / 9).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from gpu_workers.attention.backend import HeadShape
from gpu_workers.attention.flashinfer_backend import HEAD_DIMS, FlashInferBackend, jit_modules, kernels_for

DEFAULT_HEAD_DIMS = (64,)
DEFAULT_HEADS = (8, 2)  # query and KV heads of the builds' test calls; the modules do not depend on them
_DECODE_WORKSPACE_BYTES = 128 << 20


@dataclass(frozen=True, slots=True)
class KernelBuild:
    kernel: str  # "prefill fa3", "prefill fa2", "decode"
    head_dim: int
    dtype: torch.dtype
    seconds: float
    built: tuple[str, ...]  # the modules this build added to FlashInfer's JIT cache
    error: str | None = None

    def describe(self) -> str:
        what = f"{self.kernel:<12} head_dim {self.head_dim:<3} {str(self.dtype).removeprefix('torch.')}"
        if self.error is not None:
            return f"{what}: FAILED after {self.seconds:.1f} s ({self.error})"
        if self.built:
            return f"{what}: built {len(self.built)} module(s) in {self.seconds:.1f} s"
        return f"{what}: cached already ({self.seconds:.2f} s)"


def timed(kernel: str, head_dim: int, dtype: torch.dtype, run: Callable[[], None]) -> KernelBuild:
    before = jit_modules()
    started = time.perf_counter()
    error = None
    try:
        run()
    except Exception as e:  # noqa: BLE001 - nvcc's failure or any other: reported, the next build goes on
        error = f"{type(e).__name__}: {e}"
    return KernelBuild(kernel, head_dim, dtype, time.perf_counter() - started, tuple(sorted(jit_modules() - before)), error)


def build_prefill(kernel: str, device: torch.device, heads: HeadShape, dtype: torch.dtype, block_size: int) -> KernelBuild:
    """The prefill kernel as a worker prepares it (both shapes), with that kernel alone."""
    return timed(f"prefill {kernel}", heads.head_dim, dtype,
                 lambda: FlashInferBackend(block_size, device, kernels=(kernel,)).prepare(dtype, heads))  # fmt: skip


def run_decode(device: torch.device, heads: HeadShape, dtype: torch.dtype, block_size: int) -> None:
    """One call of BatchDecodeWithPagedKVCacheWrapper (what the CUDA-graph decode step calls) on
    two rows of a scratch cache: builds its module (0.7.4's decode.py: get_batch_decode_module)."""
    import flashinfer

    workspace = torch.zeros(_DECODE_WORKSPACE_BYTES, dtype=torch.uint8, device=device)
    # as the graphs make theirs (attention/library_decode.py: tensor cores, FA2), so the module
    # this builds is the one they load
    wrapper = flashinfer.BatchDecodeWithPagedKVCacheWrapper(workspace, kv_layout="NHD", use_tensor_cores=True, backend="fa2")
    kv = torch.zeros(2, 2, block_size, heads.num_kv_heads, heads.head_dim, dtype=dtype, device=device)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    # two requests of one page each: block 0 holds 1 token, block 1 a full page
    wrapper.plan(
        indptr=i32([0, 1, 2]), indices=i32([0, 1]), last_page_len=i32([1, block_size]), num_qo_heads=heads.num_heads,
        num_kv_heads=heads.num_kv_heads, head_dim=heads.head_dim, page_size=block_size,
        q_data_type=dtype, kv_data_type=dtype, sm_scale=heads.head_dim**-0.5,
    )  # fmt: skip
    wrapper.run(torch.zeros(2, heads.num_heads, heads.head_dim, dtype=dtype, device=device), paged_kv_cache=(kv[0], kv[1]))


def build_decode(device: torch.device, heads: HeadShape, dtype: torch.dtype, block_size: int) -> KernelBuild:
    return timed("decode", heads.head_dim, dtype, lambda: run_decode(device, heads, dtype, block_size))


def build_all(device: torch.device, shapes: Sequence[HeadShape], dtype: torch.dtype, block_size: int, *,
              decode: bool = True, report: Callable[[str], None] = print) -> list[KernelBuild]:  # fmt: skip
    builds = []
    for heads in shapes:
        for kernel in kernels_for(device):
            builds.append(build_prefill(kernel, device, heads, dtype, block_size))
            report(builds[-1].describe())
        if decode:
            builds.append(build_decode(device, heads, dtype, block_size))
            report(builds[-1].describe())
    return builds


def head_shapes(models: Sequence[Path], head_dims: Sequence[int]) -> tuple[list[HeadShape], list[str]]:
    """The shapes to build for, and why any model was left out."""
    shapes, skipped = [HeadShape(*DEFAULT_HEADS, d) for d in head_dims], []
    for model in models:
        from gpu_workers.llm.loader import read_model_config

        c = read_model_config(model)
        if c.head_dim not in HEAD_DIMS:
            skipped.append(f"{model}: head_dim {c.head_dim} (FlashInfer's kernels take {', '.join(map(str, HEAD_DIMS))})")
        else:
            shapes.append(HeadShape(c.num_heads, c.num_kv_heads, c.head_dim))
    unique = {s.head_dim: s for s in reversed(shapes)}  # one build per head size: the model's shape where given
    return sorted(unique.values(), key=lambda s: s.head_dim), skipped


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Build FlashInfer's attention kernels for this GPU before the server starts.")
    p.add_argument("--model", type=Path, action="append", default=[], help="a checkpoint to build for (its head size)")
    p.add_argument("--head-dims", default=None, help="comma-separated head sizes (default: 64 when no --model)")
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16"), help="the served dtype")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-decode", action="store_true", help="skip the CUDA-graph decode step's kernel")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("flashinfer_build: no CUDA device; nothing to build", file=sys.stderr)
        return 1
    missing = FlashInferBackend.importable()
    if missing is not None:
        print(f"flashinfer_build: {missing}", file=sys.stderr)
        return 1
    dims = [int(d) for d in args.head_dims.split(",")] if args.head_dims else ([] if args.model else list(DEFAULT_HEAD_DIMS))
    shapes, skipped = head_shapes(args.model, dims)
    for line in skipped:
        print(f"flashinfer_build: not built for {line}; that model is served with another backend", file=sys.stderr)
    device = torch.device("cuda", torch.cuda.current_device())
    major, minor = torch.cuda.get_device_capability(device)
    print(f"FlashInfer kernels for {torch.cuda.get_device_name(device)} (sm{major}{minor}): "
          f"{', '.join(kernels_for(device))}, head_dim {', '.join(str(s.head_dim) for s in shapes)}, {args.dtype}")  # fmt: skip
    started = time.perf_counter()
    builds = build_all(device, shapes, getattr(torch, args.dtype), args.block_size, decode=not args.no_decode)
    failed = [b for b in builds if b.error is not None]
    print(f"FlashInfer kernels: {sum(len(b.built) for b in builds)} module(s) built, {len(failed)} build(s) failed, "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
    # a failed FA3 leaves FA2 to serve; without a prefill kernel for some head size, torch SDPA serves it
    served = {b.head_dim for b in builds if b.kernel.startswith("prefill") and b.error is None}
    return 0 if all(s.head_dim in served for s in shapes) else 1


if __name__ == "__main__":
    sys.exit(main())
