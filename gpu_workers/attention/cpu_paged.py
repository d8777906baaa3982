"""Attention on the CPU that reads the paged KV cache in place, for decode rows and for prefill
chunks that continue a sequence: a small C kernel.

Per (sequence, KV head) the kernel streams the sequence's cache blocks once through its block
table: each key is dotted with the G query heads of its KV group, an online softmax keeps a
running max and sum per query head, and V is accumulated on the fly. A continuing chunk (a later
chunk of a long prompt, or the rest of a prompt after a prefix-cache hit) is split into tiles of
its tokens; a tile's G x tokens rows score each block together while it sits in L1, each token
causal over the cache up to its own position (attend_chunks; no copy of the context and no mask:
1.1-1.4x the copied-context SDPA it replaces up to 512 tokens of context, 1.08-1.16x in bf16 at
1-2k, and 0.91-0.97x in fp32 at 1-2k, where SDPA's GEMMs pull ahead of our dot products:
docs/BENCHMARKS.md, session 12). A decode row's own new token (k_new, v_new, not yet written to
the cache in the compiled step) is merged as one more key, so the kernel returns the final
output; in the eager step the kernel's call also writes the rows' own K/V first.

fp32 and bf16 caches (bf16 widened to fp32; scores and sums in fp32; a bf16 q against a bf16
cache takes the CPU's bf16 dot product where it has one, AVX512_BF16, which keeps the keys as
stored: exact products, fp32 sums), head dims that are multiples of 8 up to 256 (unrolled for
16, 32, 64, 128), any block size and G. Tasks run in parallel over (sequence x KV head), or
(chunk x KV head x tile), on torch.get_num_threads() OpenMP threads, and the next block's rows
are prefetched (the blocks are scattered; 1.6x on this CPU). Only the visible tokens are read: a
padding row of a bucket (nothing cached, its table full of the scratch block) reads no block.

Why our own kernel: no maintained one fits torch 2.13 on the CPU. intel-extension-for-pytorch's
paged attention (its last release, 2.8, pins torch 2.8); vLLM's CPU paged-attention ops and
sgl-kernel's CPU ops (no CPU wheels: a source build of the whole project); torch's
flex_attention with a paged block mask (slower than SDPA over the padded copy in bf16 eager, and
refused by inductor's CPU lowering inside the compiled step with return_lse). Nor does inductor
on its own: compiled_decode.py's reduction ("gather") reads the cache in place but takes 2.3-2.9x
this kernel's time (bench/paged_attention_bench.py: one layer at issue 23's shape, 1-2 threads,
fp32 and bf16), and the scores as a matmul over the gathered blocks inside the same graph took
2.5x gather's (bf16, 1 thread; inductor copies the blocks out, then calls the matmul).

Build: the C source (cpu_paged.c, beside this file) is compiled at first use with the system C
compiler (`cc`, or $CC) as `-O3 -march=native -fopenmp`, linked against torch's own libgomp so
one OpenMP runtime is loaded, and loaded with ctypes (no torch headers: 3-7 s on the shared
2-core EPYC, once per machine; at a worker's warm-up, before it reports ready). The shared object
is cached under ~/.cache/omni-serve/kernels (XDG_CACHE_HOME) keyed by a hash of the source,
compiler, flags and the CPU's flags; it is written to a temporary name and renamed, so workers
building at once do not see each other's half-written files. No compiler, a failed or slow
(> BUILD_TIMEOUT_S) build, or a result that disagrees with the plain-torch one: `available()` is
False, with one log line, and callers keep the gather kernel (compiled step) or the padded
gather (eager).

The op `omni::paged_decode_attention` is a torch custom op, so the compiled decode step calls it
as one opaque op inside its inductor graph.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import subprocess
import tempfile
import time
from pathlib import Path

import torch

log = logging.getLogger("omni.worker.cpu_paged")

BUILD_TIMEOUT_S = 60
FLAGS = ["-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-std=gnu11"]

SOURCE = (Path(__file__).parent / "cpu_paged.c").read_text()  # the kernel, C11 with GCC vector extensions

_lib: ctypes.CDLL | None = None
_tried = False


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "omni-serve" / "kernels"


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def build(compiler: str | None = None) -> Path:
    """The kernel's shared object, compiled now unless the cache has it; raises on failure."""
    cc = compiler or os.environ.get("CC") or "cc"
    version = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10, check=True).stdout
    torch_lib = Path(torch.__file__).parent / "lib"
    flags = [*FLAGS, f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}"]
    key = hashlib.sha256("\0".join([SOURCE, cc, version, *flags, _cpu_flags()]).encode()).hexdigest()[:20]
    out = cache_dir() / f"paged_decode_{key}.so"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=out.parent, prefix=".build-", suffix=".so")
    os.close(fd)
    tmp = Path(tmp_name)
    src = tmp.with_suffix(".c")
    try:
        src.write_text(SOURCE)
        t = time.perf_counter()
        subprocess.run([cc, *flags, str(src), "-o", str(tmp), "-lm"], capture_output=True, text=True,
                       timeout=BUILD_TIMEOUT_S, check=True)  # fmt: skip
        os.replace(tmp, out)  # atomic: a concurrent builder's rename lands the same bytes
        log.info("built the paged CPU attention kernel in %.1f s: %s", time.perf_counter() - t, out)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out


def _load(compiler: str | None = None) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(build(compiler)))
    fn = lib.paged_decode
    i64, ptr = ctypes.c_int64, ctypes.c_void_p
    fn.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_int, ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64,
                   ctypes.c_float, ctypes.c_int, ptr, ptr, i64, i64, ptr, ctypes.c_int]  # fmt: skip
    lib.paged_bf16_dot.argtypes = [i64]
    fn.restype = None
    fn = lib.paged_prefill
    fn.argtypes = [ptr, ptr, ptr, ptr, ctypes.c_int, ptr, i64, ptr, ptr, ptr, ptr, i64, i64, i64, i64, i64,
                   ctypes.c_float, ctypes.c_int]  # fmt: skip
    fn.restype = None
    return lib


def available() -> bool:
    """Whether the kernel is built, loaded and agrees with plain torch (built on the first call);
    False, with one log line, otherwise."""
    global _lib, _tried
    if not _tried:
        _tried = True
        try:
            _lib = _load()
            _self_check()
        except (OSError, subprocess.SubprocessError, AssertionError, RuntimeError) as exc:
            detail = getattr(exc, "stderr", None) or exc
            log.warning("paged CPU attention kernel unavailable (%s); decode attention gathers the context instead",
                        str(detail).strip().splitlines()[-1] if str(detail).strip() else type(exc).__name__)  # fmt: skip
            _lib = None
    return _lib is not None


def decode_entry() -> int:
    """paged_decode's address, for native callers (models/small_m_linear.cpp's decode_layers); the
    library stays loaded for the process. Check supports() first."""
    if _lib is None and not available():
        raise RuntimeError("the paged CPU attention kernel could not be built (see the log); check available() first")
    assert _lib is not None
    return int(ctypes.cast(_lib.paged_decode, ctypes.c_void_p).value or 0)


def supports(k_cache: torch.Tensor) -> bool:
    """Whether the kernel is there and reads this cache: on the CPU, fp32 or bf16, contiguous,
    a head dim that is a multiple of 8 up to 256."""
    d = k_cache.shape[-1]
    return (
        k_cache.device.type == "cpu"
        and k_cache.dtype in (torch.float32, torch.bfloat16)
        and k_cache.is_contiguous()
        and d % 8 == 0
        and d <= 256
        and available()
    )


def _inputs(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, fp32_q: bool
) -> tuple[ctypes.CDLL, torch.Tensor | None, torch.Tensor | None]:
    """The loaded kernel, q in fp32, and q in bf16 where it is exactly that (the kernel may then
    dot it with bf16 keys as they are stored). fp32_q False: the caller reads the fp32 q only
    where the bf16 one is not dotted as stored (a decode without an own token to merge), so
    none is made where it would be; raises where the kernel cannot serve the caches."""
    if _lib is None and not available():
        raise RuntimeError("the paged CPU attention kernel could not be built (see the log); check available() first")
    assert _lib is not None
    if not (k_cache.is_contiguous() and v_cache.is_contiguous() and k_cache.dtype == v_cache.dtype):
        raise ValueError("the paged kernel reads contiguous K/V caches of one dtype")
    if q.dtype != torch.bfloat16:
        return _lib, q.float().contiguous(), None
    dot_only = k_cache.dtype == torch.bfloat16 and not fp32_q and _bf16_dot(q.shape[-1])
    return _lib, None if dot_only else q.float().contiguous(), q.contiguous()


@functools.cache
def _bf16_dot(head_dim: int) -> bool:
    assert _lib is not None
    return bool(_lib.paged_bf16_dot(head_dim))


def attend(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    scale: float,
    write: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """The kernel called directly (eager code; the op below wraps it for compiled graphs): see the
    op. write = (k, v, slots): the rows' own K/V (B, Hkv, D) in the cache's dtype, written to the
    cache at slots (B,) int64 first, in the same call (the eager step's write_kv). out_dtype
    torch.bfloat16: the output rounded to bf16 by the kernel (as torch's conversion rounds)."""
    b, h, g, d = q.shape
    lib, q32, qh = _inputs(q, k_cache, v_cache, fp32_q=k_new is not None)
    table = block_table.to(torch.int64).contiguous()
    lens = num_cached.to(torch.int64).contiguous()
    kn = None if k_new is None else k_new.float().contiguous()
    vn = None if v_new is None else v_new.float().contiguous()
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"the kernel writes float32 or bfloat16, not {out_dtype}")
    out = torch.empty(b, h, g, d, dtype=out_dtype)
    rows: tuple[int | None, int | None, int, int, int | None] = (None, None, 0, 0, None)
    if write is not None:
        k_rows, v_rows, slots = write
        for x in (k_rows, v_rows):
            if x.dtype != k_cache.dtype or x.shape != (b, h, d) or x.stride()[1:] != (d, 1):
                raise ValueError("the rows to write are (B, Hkv, D) in the cache's dtype, each row contiguous")
        if slots.dtype != torch.int64 or not slots.is_contiguous() or slots.shape != (b,):
            raise ValueError("slots: (B,) contiguous int64")
        size = k_cache.element_size()
        rows = (k_rows.data_ptr(), v_rows.data_ptr(), k_rows.stride(0) * size, v_rows.stride(0) * size, slots.data_ptr())
    lib.paged_decode(
        None if q32 is None else q32.data_ptr(), None if qh is None else qh.data_ptr(), k_cache.data_ptr(),
        v_cache.data_ptr(), int(k_cache.dtype == torch.bfloat16), table.data_ptr(), table.shape[1], lens.data_ptr(),
        None if kn is None else kn.data_ptr(), None if vn is None else vn.data_ptr(), out.data_ptr(), b, h, g, d,
        k_cache.shape[1], scale, torch.get_num_threads(), *rows, int(out_dtype == torch.bfloat16),
    )  # fmt: skip
    return out


def attend_chunks(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    q_start: torch.Tensor,
    q_len: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Continuing prefill chunks read in place: q (T, Hkv, G, D) holds packed rows of a step;
    chunk c is rows [q_start[c], q_start[c] + q_len[c]) at positions [context_lens[c] - q_len[c],
    context_lens[c]), causal over the first context_lens[c] tokens of the cache through
    block_table[c] (the chunk's own K/V written already). (T, Hkv, G, D) float32, with only the
    chunks' rows written."""
    t, h, g, d = q.shape
    lib, q32, qh = _inputs(q, k_cache, v_cache, fp32_q=True)  # the chunk kernel copies the fp32 q
    assert q32 is not None
    table = block_table.to(torch.int64).contiguous()
    starts, lens, ctx = (x.to(torch.int64).contiguous() for x in (q_start, q_len, context_lens))
    out = torch.empty(t, h, g, d, dtype=torch.float32)
    lib.paged_prefill(
        q32.data_ptr(), None if qh is None else qh.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(),
        int(k_cache.dtype == torch.bfloat16), table.data_ptr(), table.shape[1], starts.data_ptr(), lens.data_ptr(),
        ctx.data_ptr(), out.data_ptr(), table.shape[0], h, g, d, k_cache.shape[1], scale, torch.get_num_threads(),
    )  # fmt: skip
    return out


@torch.library.custom_op("omni::paged_decode_attention", mutates_args=())
def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_table: torch.Tensor,
    num_cached: torch.Tensor,
    k_new: torch.Tensor | None,
    v_new: torch.Tensor | None,
    scale: float,
) -> torch.Tensor:
    """Attention of q (B, Hkv, G, D) over each row's first num_cached[b] tokens of the paged
    cache (blocks through block_table (B, M)) and, when given, its own k_new, v_new (B, Hkv, D);
    (B, Hkv, G, D) float32. A row with nothing visible gets zeros."""
    return attend(q, k_cache, v_cache, block_table, num_cached, k_new, v_new, scale)


@paged_decode_attention.register_fake
def _paged_decode_attention_shape(q: torch.Tensor, *_: object) -> torch.Tensor:
    return q.new_empty(q.shape, dtype=torch.float32)  # the shape and dtype are q's alone


def _self_check() -> None:
    """The kernel against a dense softmax on a small random cache, once after loading."""
    gen = torch.Generator().manual_seed(0)
    kc, vc = torch.randn(2, 6, 3, 2, 8, generator=gen).unbind(0)  # 6 blocks of 3, 2 KV heads, D 8
    q = torch.randn(2, 2, 2, 8, generator=gen)
    kn, vn = torch.randn(2, 2, 2, 8, generator=gen).unbind(0)
    table = torch.tensor([[4, 1, 5], [0, 5, 5]])
    got = attend(q, kc, vc, table, torch.tensor([7, 2]), kn, vn, 0.5)
    for row, n in ((0, 7), (1, 2)):
        keys = torch.cat([kc[table[row]].flatten(0, 1)[:n], kn[row, None]])  # (n + 1, H, D)
        values = torch.cat([vc[table[row]].flatten(0, 1)[:n], vn[row, None]])
        p = torch.softmax(torch.einsum("hgd,thd->hgt", q[row], keys) * 0.5, -1)
        want = torch.einsum("hgt,thd->hgd", p, values)
        if not torch.allclose(got[row], want, atol=1e-4):
            raise RuntimeError(f"the kernel disagrees with torch by {(got[row] - want).abs().max().item():.3g}")
    # continuing chunks: rows 1-3 (3 tokens after 4 cached) and row 5 (1 token after 1 cached)
    qc = torch.randn(6, 2, 2, 8, generator=gen)
    got = attend_chunks(qc, kc, vc, table, torch.tensor([1, 5]), torch.tensor([3, 1]), torch.tensor([7, 2]), 0.5)
    for row, (chunk, i, visible) in {1: (0, 0, 5), 2: (0, 1, 6), 3: (0, 2, 7), 5: (1, 0, 2)}.items():
        keys = kc[table[chunk]].flatten(0, 1)[:visible]
        values = vc[table[chunk]].flatten(0, 1)[:visible]
        want = torch.einsum("hgt,thd->hgd", torch.softmax(torch.einsum("hgd,thd->hgt", qc[row], keys) * 0.5, -1), values)
        if not torch.allclose(got[row], want, atol=1e-4):
            raise RuntimeError(f"the chunk kernel disagrees with torch by {(got[row] - want).abs().max().item():.3g}")
