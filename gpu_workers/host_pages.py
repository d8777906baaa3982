"""Transparent huge pages for the CPU path's large, hot host tensors: the KV cache
(llm/memory.py) and the small-M weight copies (models/small_m_linear.py). Both are read
scattered or streamed every step, and on 4 KiB pages nearly every block is a TLB miss
(docs/BENCHMARKS.md: the paged CPU kernel 18 % faster in bf16, SmolLM2's layers 19 -> 25 GB/s).
This machine's THP setting is `madvise`: a region gets huge pages only when asked, before its
first touch."""

from __future__ import annotations

import ctypes
import sys

HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14  # linux/mman.h


def advise_huge_pages(address: int, size: int) -> bool:
    """madvise(MADV_HUGEPAGE) over the whole 2 MiB pages inside [address, address + size);
    False where there are none, off Linux, or where the kernel refuses."""
    start = -(-address // HUGE_PAGE) * HUGE_PAGE
    end = (address + size) // HUGE_PAGE * HUGE_PAGE
    if end <= start or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        return bool(libc.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE) == 0)
    except (OSError, AttributeError):
        return False
