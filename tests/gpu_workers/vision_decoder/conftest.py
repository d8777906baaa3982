from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.gpu_workers.vision_decoder import cases


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread, as the decoder's ranks run (spec.num_threads): the machine's 2 cores
    are shared with other tests, and 2 threads that wait on each other cost more than they give
    on these small tensors."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def by_ranks(tmp_path_factory: pytest.TempPathFactory) -> dict[int | str, dict[str, dict[str, Any]]]:
    """cases.by_ranks: one spawn of 4 gloo ranks for test_decoder.py's Ulysses tests and
    test_guidance_parallel.py's (starting torch in 4 processes costs seconds here)."""
    root: Path = tmp_path_factory.mktemp("vision_decoder_ranks")
    return cases.by_ranks(root)
