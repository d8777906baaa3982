"""Linear layers for decode steps of 1 to a few rows on x86 CPUs (small_m_linear.cpp).

At M <= 8 rows a linear layer reads each weight once for a few multiply-adds, so its floor is the
weight bytes over the memory bandwidth. oneDNN's packed GEMM (models/packed_linear.py) and torch's
GEMV reach well under that floor at M = 1 on this kind of CPU (docs/BENCHMARKS.md, Session 14);
the kernels in small_m_linear.cpp stream a weight laid out once in 16-channel blocks and serve
every row from each load: avx512bf16 dot products for bf16 weights, int8 weights widened to bf16
(weight-only int8, per-channel scales), fp32 FMAs, and an avx2 path for bf16 and fp32; and a
GGUF file's Q8_0/Q4_0/Q4_1 blocks through AVX512-VNNI (models/gguf_linear.py). The copies live
in one buffer on transparent huge pages (gather_into_huge_pages).

Around the kernels, the same extension runs a llama-family decoder layer at small M without
torch's per-op costs: attn_in (input norm, q|k|v, RoPE) and attn_out_mlp (o, residual, norm,
gate|up, SiLU * up, down, residual) as one call each, rounded where the eager ops round; and
decode_layers, every layer of a decode step in one call, the paged attention kernel called
through its address between the halves (models/llama.py's native_layers). At M = 1 eager torch
spent more in its ~40 calls a layer than in the weights' reads (docs/BENCHMARKS.md, session 15).

The extension is built on first use with the C++ compiler torch's cpp_extension finds, into a
cache directory keyed by the source and torch version (~/.cache/omni-serve/kernels, under
XDG_CACHE_HOME; $OMNI_KERNEL_CACHE overrides), so later processes load it in about a second;
bin/setup builds it once. The build takes about 20 s on the shared 2-core machine (torch's
headers); processes building at once wait on cpp_extension's lock in the build directory. It is
never required: without a compiler, on a non-x86 CPU or one without avx2, or with
OMNI_SMALL_M_LINEAR=0, `load()` returns False and callers keep their other path (eager torch,
oneDNN; --quantization gguf is then refused with the reason).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

import torch

from gpu_workers.host_pages import HUGE_PAGE, advise_huge_pages

log = logging.getLogger("omni.worker.small_m_linear")

SOURCE = Path(__file__).with_name("small_m_linear.cpp")
# The most rows a layer sends to the kernels (they take any M, in passes of 8), measured over
# SmolLM2's 30 layers and head as served (bench/small_m_linear.py --chain, docs/BENCHMARKS.md
# Session 14): bf16 weights 15.4 ms against oneDNN's 17.8 at 1 row, even at 2, behind from 4;
# int8 ahead of the split GEMM at 1 (15.7 against 19.8 ms), 2 and 4.
MAX_ROWS = 1
MAX_ROWS_INT8 = 4
# The most rows a decoder layer runs through its fused halves (attn_in, attn_out_mlp: one call
# each instead of ~20 torch ops; models/llama.py's DecoderLayer.small_m_forward) and a decode step
# through decode_layers (LlamaForCausalLM.native_layers). Measured on SmolLM2 bf16, the forward of
# a decode step, native against layer by layer (docs/BENCHMARKS.md, session 15): 1 row 10.7 ms
# against 18.8, 4 rows 15.8 against 26.7, 8 rows 23.9 against 28.7. Layers with int8 linears
# take MAX_ROWS_INT8 (their kernel's measured reach).
MAX_ROWS_LAYER = 8

BUILD_FLAGS_VERSION = b"openmp"  # part of the cache key: a change of build flags rebuilds
_lock = threading.Lock()
_state: dict[str, bool] = {}


def cache_dir() -> Path:
    # beside the paged attention kernel's (attention/cpu_paged.py); $OMNI_KERNEL_CACHE overrides
    override = os.environ.get("OMNI_KERNEL_CACHE")
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    root = Path(override) if override else xdg / "omni-serve" / "kernels"
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + BUILD_FLAGS_VERSION).hexdigest()[:16]
    return root / f"small_m_linear-{key}"


def _build() -> bool:
    if os.environ.get("OMNI_SMALL_M_LINEAR", "1") == "0":
        return False
    import platform

    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        from torch.utils import cpp_extension

        torch_lib = Path(torch.__file__).parent / "lib"
        build = cache_dir()
        build.mkdir(parents=True, exist_ok=True)
        cpp_extension.load(
            name="omni_small_m_linear",
            sources=[str(SOURCE)],
            build_directory=str(build),
            # -fopenmp: at::parallel_for is OpenMP in torch's headers, serial without it. Linked
            # against torch's own libgomp, so one OpenMP runtime is loaded (as attention/cpu_paged.py)
            extra_cflags=["-O3", "-fopenmp"],
            extra_ldflags=["-fopenmp", f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}"],
            is_python_module=False,
            verbose=False,
        )
    except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, a failed build: serve without it
        log.info("small-M linear kernels unavailable (%s); using oneDNN's", exc)
        return False
    return bool(torch.ops.omni_small_m.isa() != "none")


def load() -> bool:
    """Whether the kernels are built, loaded and have a path for this CPU (built on first call)."""
    with _lock:
        if "ok" not in _state:
            _state["ok"] = _build()
        return _state["ok"]


def isa() -> str:
    """The kernels' instruction set here: "avx512bf16", "avx2" or "none"."""
    return str(torch.ops.omni_small_m.isa()) if load() else "none"


def pack_gguf(raw: torch.Tensor, kind: str) -> torch.Tensor:
    """(N, K / 32 * block bytes) uint8 rows of a GGUF tensor's blocks ("q8_0", "q4_0", "q4_1") ->
    the kernels' GGUF layout (uint8; small_m_linear.cpp says how)."""
    return torch.ops.omni_small_m.pack_gguf(raw, kind)  # type: ignore[no-any-return]


def pack(weight: torch.Tensor) -> torch.Tensor:
    """(N, K) bf16, int8 or fp32 -> the kernels' blocked layout (a new tensor, same dtype)."""
    return torch.ops.omni_small_m.pack(weight.detach().contiguous())  # type: ignore[no-any-return]


def linear(
    x: torch.Tensor,
    packed: torch.Tensor,
    out_features: int,
    scale: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """x (M, K) -> (M, out_features) in out_dtype (default x's): x @ W.T * scale + bias.

    bf16 weights take bf16 x, fp32 weights fp32 x; int8 weights take x rounded to bf16 and need
    their float32 per-channel scales; GGUF blocks (uint8) take either, quantized per block of 32.
    scale, bias: float32 (N,)."""
    out_dtype = out_dtype or x.dtype
    if packed.dtype == torch.uint8:
        out_dtype = out_dtype if out_dtype in (torch.float32, torch.bfloat16) else torch.float32
    elif packed.dtype == torch.int8 and x.dtype != torch.bfloat16:
        x = x.to(torch.bfloat16)
    y = torch.ops.omni_small_m.linear(x, packed, out_features, scale, bias, out_dtype == torch.float32)
    return y if y.dtype == out_dtype else y.to(out_dtype)


Form = tuple[torch.Tensor, "torch.Tensor | None", "torch.Tensor | None"]  # packed, scale, bias (float32)


def attn_in(
    h: torch.Tensor,
    norm_w: torch.Tensor,
    eps: float,
    qkv: Form,
    cos: torch.Tensor,
    sin: torch.Tensor,
    heads: int,
    kv_heads: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A decoder layer's first half at small M: h (M, H) -> q (M, heads, D), k, v (M, kv_heads, D)
    through the input RMSNorm, the fused q|k|v (a `form`: packed, scale, bias) and RoPE."""
    return torch.ops.omni_small_m.attn_in(h, norm_w, eps, *qkv, cos, sin, heads, kv_heads, head_dim)  # type: ignore[no-any-return]


def attn_out_mlp(
    h: torch.Tensor,
    a: torch.Tensor,
    o: Form,
    post1_w: torch.Tensor | None,
    mult: float,
    norm_w: torch.Tensor,
    eps: float,
    gate_up: Form,
    inter: int,
    down: Form,
    post2_w: torch.Tensor | None,
) -> torch.Tensor:
    """A decoder layer's second half at small M: h (M, H) and attention's output a (M, Hq * D) ->
    the layer's output (M, H): o, [post norm], [x mult], + h, RMSNorm, gate|up, SiLU(gate) * up,
    down, [post norm], [x mult], + the residual."""
    return torch.ops.omni_small_m.attn_out_mlp(  # type: ignore[no-any-return]
        h, a, *o, post1_w, mult, norm_w, eps, gate_up[0], inter, *gate_up[1:], *down, post2_w
    )


def gather_into_huge_pages(model: torch.nn.Module) -> int:
    """Move every small-M weight copy of `model` (each module's `small`) into one buffer that the
    kernel backs with transparent huge pages where it can (madvise: this machine's THP setting
    is "madvise"); the bytes moved (0: none to move).

    A decode step streams every weight once: on 4 KiB pages each page is a TLB miss and a stop
    for the hardware's stream prefetcher, and SmolLM2's layers read at 19 GB/s; on 2 MiB pages
    at 25 (docs/BENCHMARKS.md, session 15). Each weight starts on a 4 KiB boundary. The moved
    copies are views of the buffer; the old ones are freed. Call it before the first forward
    (DecoderLayer reads the copies once) and with the model not yet shared across threads."""
    owners = [m for m in model.modules() if isinstance(getattr(m, "small", None), torch.Tensor)]
    if not owners:
        return 0
    page = 4096
    copies: list[torch.Tensor] = [m.small for m in owners]  # type: ignore[misc]
    sizes = [-(-c.nbytes // page) * page for c in copies]
    total = sum(sizes)
    buffer = torch.empty(total + HUGE_PAGE, dtype=torch.uint8)
    skip = -buffer.data_ptr() % HUGE_PAGE
    huge = advise_huge_pages(buffer.data_ptr() + skip, total // HUGE_PAGE * HUGE_PAGE)
    offset = skip
    for m, old, size in zip(owners, copies, sizes):
        view = buffer[offset : offset + old.nbytes].view(old.dtype).view(old.shape)
        view.copy_(old)
        m.small = view
        offset += size
    log.info("small-M weights: %.1f MB in one buffer%s", total / 1e6, ", huge pages advised" if huge else "")
    return total


def main() -> None:
    """`python -m gpu_workers.models.small_m_linear`: build the kernels now (bin/setup runs it)."""
    import time

    t = time.perf_counter()
    ok = load()
    print(
        f"small_m_linear: {'built, ' + isa() if ok else 'unavailable'} ({time.perf_counter() - t:.1f} s, {cache_dir()})"
    )


if __name__ == "__main__":
    main()
