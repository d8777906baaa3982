"""Host pages: madvise(MADV_HUGEPAGE) over exactly the whole 2 MiB pages of a region."""

from __future__ import annotations

import sys

import pytest
import torch

from gpu_workers.host_pages import HUGE_PAGE, advise_huge_pages


def test_a_region_without_a_whole_huge_page_is_not_advised() -> None:
    buffer = torch.empty(HUGE_PAGE * 3, dtype=torch.uint8)
    start = buffer.data_ptr() + -buffer.data_ptr() % HUGE_PAGE
    assert not advise_huge_pages(start, 4096)
    assert not advise_huge_pages(start + 4096, HUGE_PAGE)  # straddles two pages: neither whole


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise is Linux's")
def test_a_region_with_whole_huge_pages_is_advised() -> None:
    buffer = torch.empty(HUGE_PAGE * 9, dtype=torch.uint8)
    assert advise_huge_pages(buffer.data_ptr(), buffer.numel())  # the whole pages inside it: 8
    start = buffer.data_ptr() + -buffer.data_ptr() % HUGE_PAGE
    assert advise_huge_pages(start, HUGE_PAGE)
