from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """torch on one thread, as the decoder's ranks run (spec.num_threads): the machine's 2 cores
    are shared with other tests, and 2 threads that wait on each other cost more than they give
    on these small tensors."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
