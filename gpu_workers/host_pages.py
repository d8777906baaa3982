"""Host memory for the CPU path's large tensors: zeroed pages that cost nothing until written,
and transparent huge pages where the kernel gives them.

A CPU KV cache is sized up front (2 GiB by default) but a server fills it only as far as its
requests reach. `lazy_zeros` maps it anonymously: the kernel hands out zeroed pages on first
write, so an idle or lightly used server holds what it used, not what it reserved (a read of an
untouched page sees the kernel's shared zero page). The mapping is advised MADV_HUGEPAGE before
anything touches it, so each first write faults in a whole 2 MiB page where the THP setting
allows (`madvise`, the default): decode reads scattered blocks, and on 4 KiB pages nearly every
block is a TLB miss (docs/BENCHMARKS.md: the paged CPU kernel 18 % faster in bf16)."""

from __future__ import annotations

import ctypes
import math
import mmap
import sys

import torch

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


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor of zeros over its own anonymous mapping, 2 MiB aligned and advised for huge
    pages; its memory is committed page by page as it is written. The tensor holds the mapping
    (torch.frombuffer keeps its buffer alive), which is unmapped when the last view is freed."""
    nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
    # private and anonymous (mmap's default, shared, would be shmem: no THP): zero-filled on demand
    pages = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    raw = torch.frombuffer(pages, dtype=torch.uint8)
    skip = -raw.data_ptr() % HUGE_PAGE
    advise_huge_pages(raw.data_ptr() + skip, nbytes)
    return raw[skip : skip + nbytes].view(dtype).view(shape)
