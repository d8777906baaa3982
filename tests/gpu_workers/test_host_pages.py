"""Host pages: a lazily committed, zeroed, huge-page-advised CPU tensor, and the advice itself."""

from __future__ import annotations

import ctypes
import gc
import mmap
import sys
from pathlib import Path

import pytest
import torch

from gpu_workers import host_pages
from gpu_workers.host_pages import HUGE_PAGE, advise_huge_pages, lazy_zeros

linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mincore and madvise are Linux's")


def resident_bytes(tensor: torch.Tensor) -> int:
    """How much of a CPU tensor's memory is resident: mincore over its pages."""
    page = mmap.PAGESIZE
    start = tensor.data_ptr() // page * page
    length = tensor.data_ptr() + tensor.numel() * tensor.element_size() - start
    vec = (ctypes.c_ubyte * -(-length // page))()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    assert libc.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) == 0, ctypes.get_errno()
    return sum(b & 1 for b in vec) * page


def anonymous_bytes(address: int) -> int:
    """The `Anonymous:` bytes of the mapping holding `address` (/proc/self/smaps)."""
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo <= address < hi
        elif inside and head == "Anonymous:":
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no mapping holds {address:#x}")


def test_lazy_zeros_are_zeros_of_the_shape_and_dtype_asked_on_a_huge_page_boundary() -> None:
    cache = lazy_zeros((4, 2, 64, 16, 4, 64), torch.bfloat16)
    assert cache.shape == (4, 2, 64, 16, 4, 64) and cache.dtype == torch.bfloat16
    assert cache.is_contiguous() and cache.data_ptr() % HUGE_PAGE == 0
    assert not cache.any()
    cache[1, 0, 3] = 1.5  # writable, and a write lands where it was put
    assert cache.sum().item() == 1.5 * 16 * 4 * 64


@linux_only
def test_lazy_zeros_cost_nothing_until_written_then_what_was_written() -> None:
    cache = lazy_zeros((64, 1024, 1024), torch.float32)  # 256 MiB reserved
    assert resident_bytes(cache) == 0
    cache[0].fill_(1.0)  # 4 MiB written
    resident = resident_bytes(cache)
    assert 4 << 20 <= resident <= 8 << 20  # what the write touched, to a huge page either side
    assert cache[1:].count_nonzero() == 0
    # private anonymous memory, which transparent huge pages back (a shared mapping is shmem: none)
    assert anonymous_bytes(cache.data_ptr()) >= 4 << 20


def test_the_mapping_lives_as_long_as_a_view_of_it() -> None:
    view = lazy_zeros((8, 1024), torch.float32)[2:4]
    gc.collect()  # nothing but the view holds the mapping now
    view.fill_(3.0)
    assert view.sum().item() == 3.0 * 2 * 1024


@linux_only
def test_lazy_zeros_ask_huge_pages_over_exactly_their_whole_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    advised: list[tuple[int, int]] = []

    def spy(address: int, size: int) -> bool:
        advised.append((address, size))
        return advise_huge_pages(address, size)

    monkeypatch.setattr(host_pages, "advise_huge_pages", spy)
    cache = lazy_zeros((8 << 20,), torch.uint8)
    assert advised == [(cache.data_ptr(), 8 << 20)]
    assert advise_huge_pages(cache.data_ptr(), 8 << 20)  # a Linux kernel takes the advice
    assert not advise_huge_pages(cache.data_ptr(), 4096)  # no whole 2 MiB page inside: nothing to advise
    assert not advise_huge_pages(cache.data_ptr() + 4096, HUGE_PAGE)  # straddles two: neither whole
