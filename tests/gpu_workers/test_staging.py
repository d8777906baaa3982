"""HostStaging: many host arrays, one copy, the same values on the device (review C3)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gpu_workers.staging import HostStaging

DEVICES = ["cpu", pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])]


def arrays(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "ids": rng.integers(0, 1 << 40, size=7 + seed, dtype=np.int64),
        "temps": rng.random(3).astype(np.float32),
        "words": rng.integers(-(1 << 31), 1 << 31, size=(3, 5), dtype=np.int64).astype(np.int32),  # odd byte count
        "flags": rng.random(5) < 0.5,  # bool, 5 bytes: the next one starts aligned anyway
        "empty": np.zeros(0, dtype=np.int64),
        "after": np.arange(4, dtype=np.int64),
    }


@pytest.mark.parametrize("device", DEVICES)
def test_every_array_arrives_whole_after_one_copy_per_call(device: str) -> None:
    staging = HostStaging(device)
    kept = []
    for seed in range(5):  # buffers are reused (and grown): earlier results stay intact
        host = arrays(seed)
        staged = staging.stage(host)
        kept.append((host, staged))
        assert staging.num_copies == seed + 1
    for host, staged in kept:
        assert staged.keys() == host.keys()
        for name, a in host.items():
            t = staged[name]
            assert t.device.type == device and tuple(t.shape) == a.shape
            assert np.array_equal(t.cpu().numpy(), a), name


def test_the_buffer_is_pinned_only_for_cuda() -> None:
    staging = HostStaging("cpu")
    staging.stage({"x": np.arange(3, dtype=np.int64)})
    assert not staging.pinned
    with pytest.raises(TypeError, match="float64"):
        staging.stage({"y": np.zeros(2)})


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_the_host_buffer_is_pinned_and_the_copy_does_not_wait() -> None:
    staging = HostStaging("cuda")
    big = torch.randn(4096, 4096, device="cuda")
    for _ in range(8):
        big = big @ big  # a queue of work ahead of the copy
        big /= big.norm()
    staged = staging.stage({"x": np.arange(10, dtype=np.int64)})
    pending = not torch.cuda.current_stream().query()  # the CPU got here before the GPU finished
    assert staging._buffers[0] is not None and staging._buffers[0].is_pinned()
    assert staged["x"].tolist() == list(range(10))
    assert pending, "a pageable copy would have waited for the queued matmuls"
