from __future__ import annotations

import pytest
import torch
from torch import nn

from gpu_workers.models.packed_linear import PackedLinear, _ops_available, pack_linears, packed_linear

pytestmark = pytest.mark.skipif(not _ops_available(), reason="torch built without oneDNN")


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 32, 100])
def test_packed_linear_matches_torch(bias: bool, rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 160, bias=bias)
    x = torch.randn(rows, 96)
    with torch.inference_mode():
        torch.testing.assert_close(PackedLinear(linear)(x), linear(x), rtol=1e-5, atol=1e-5)


def test_pack_linears_replaces_every_linear_and_keeps_outputs() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.SiLU(), nn.Sequential(nn.Linear(64, 8, bias=False)))
    x = torch.randn(5, 32)
    with torch.inference_mode():
        want = model(x)
        assert pack_linears(model, device=torch.device("cpu"), dtype=torch.float32) == 2
        got = model(x)
    assert not any(isinstance(m, nn.Linear) for m in model.modules())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pack_linears_leaves_other_devices_and_dtypes_alone() -> None:
    model = nn.Sequential(nn.Linear(4, 4))
    assert pack_linears(model, device=torch.device("cuda"), dtype=torch.float32) == 0
    assert pack_linears(model, device=torch.device("cpu"), dtype=torch.float16) == 0
    assert isinstance(model[0], nn.Linear)


def test_the_op_compiled_graphs_call_finds_its_weights_by_handle() -> None:
    lin = nn.Linear(16, 24)
    packed = PackedLinear(lin)
    x = torch.randn(5, 16)
    got = packed_linear(x, packed.handle, 24)
    assert (got - lin(x)).abs().max().item() < 1e-4  # fp32, oneDNN vs MKL summation order
