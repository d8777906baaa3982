"""The small-M linear kernels (gpu_workers/models/small_m_linear.cpp) against F.linear in float32
on the same weights, on every ISA path this CPU can run, and the fallback when they are absent.

Bounds: the kernels accumulate in float32, so against a float32 reference on the same (rounded)
inputs the error is summation order only: |err| <= 1e-5 * sum_k |x_k w_k| + (the output's own
rounding: 2^-8 relative for bf16 outputs). int8 is checked against its dequantized weight with
the activations rounded to bf16, as the kernel computes."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models import packed_linear, small_m_linear
from gpu_workers.models.int8_linear import quantize_per_channel
from gpu_workers.models.packed_linear import PackedLinear, pack_linears

pytestmark = pytest.mark.skipif(
    not small_m_linear.load(), reason="small-M kernels not built here (no compiler or CPU path)"
)

# (K, N): SmolLM2's o shape, and ones that are no multiple of 2, 16, 32 or 64
SHAPES = [(576, 576), (37, 53), (1, 1), (129, 1000), (66, 17)]
ISAS = [isa for isa in ("avx512bf16", "avx2") if small_m_linear.load() and small_m_linear.isa() in ("avx512bf16", isa)]


@pytest.fixture(params=ISAS)
def isa(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    torch.ops.omni_small_m.set_isa(request.param)
    yield request.param
    torch.ops.omni_small_m.set_isa("auto")


def check(got: torch.Tensor, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None, out_rel: float) -> None:
    want = F.linear(x.float(), w.float(), bias)
    bound = 1e-5 * (x.float().abs() @ w.float().abs().T) + out_rel * want.abs() + 1e-6
    assert got.shape == want.shape
    assert ((got.float() - want).abs() <= bound).all(), (got.float() - want).abs().max().item()


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 8, 11])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_float_weights_match_a_float32_linear(isa: str, k: int, n: int, rows: int, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(k * 1000 + n + rows)
    w, x, bias = (
        torch.randn(n, k, generator=g).to(dtype),
        torch.randn(rows, k, generator=g).to(dtype),
        torch.randn(n, generator=g),
    )
    packed = small_m_linear.pack(w)
    check(small_m_linear.linear(x, packed, n, bias=bias, out_dtype=torch.float32), x, w, bias, 0.0)
    y = small_m_linear.linear(x, packed, n)  # out in x's dtype
    assert y.dtype == dtype
    check(y, x, w, None, 2**-8 if dtype == torch.bfloat16 else 0.0)


@pytest.mark.parametrize("k,n", SHAPES)
@pytest.mark.parametrize("rows", [1, 3, 8])
@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_int8_weights_match_their_dequantized_linear(k: int, n: int, rows: int, out_dtype: torch.dtype) -> None:
    if small_m_linear.isa() != "avx512bf16":
        pytest.skip("int8 weights need avx512bf16")
    g = torch.Generator().manual_seed(k + n + rows)
    q, scale = quantize_per_channel(torch.randn(n, k, generator=g))
    x, bias = torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    y = small_m_linear.linear(x, small_m_linear.pack(q), n, scale=scale, bias=bias, out_dtype=out_dtype)
    assert y.dtype == out_dtype
    check(y, x.bfloat16(), q.float() * scale[:, None], bias, 2**-8 if out_dtype == torch.bfloat16 else 0.0)


def test_int8_refuses_the_avx2_path(isa: str) -> None:
    q, scale = quantize_per_channel(torch.randn(16, 32))
    if isa == "avx2":
        with pytest.raises(RuntimeError, match="avx512bf16"):
            small_m_linear.linear(torch.randn(1, 32), small_m_linear.pack(q), 16, scale=scale)


@pytest.mark.parametrize("rows", [1, small_m_linear.MAX_ROWS + 1, 5, 40])
def test_packed_linear_chooses_by_rows_and_agrees_either_side(rows: int) -> None:
    torch.manual_seed(0)
    linear = nn.Linear(70, 90).to(torch.bfloat16)
    layer = PackedLinear(linear)
    assert layer.small is not None
    x = torch.randn(rows, 70, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = layer(x)
        via_op = packed_linear.packed_linear(x, layer.handle, 90)  # what a compiled step calls
    check(got, x, linear.weight, linear.bias.float(), 2**-7)
    assert torch.equal(got, via_op)


def test_without_the_extension_packed_linear_serves_through_onednn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(small_m_linear, "load", lambda: False)
    torch.manual_seed(0)
    linear = nn.Linear(32, 48)
    layer = PackedLinear(linear)
    assert layer.small is None and "small-M" not in layer.extra_repr()
    x = torch.randn(1, 32)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), linear(x), rtol=1e-4, atol=1e-4)


def test_switched_off_the_build_is_not_attempted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMNI_SMALL_M_LINEAR", "0")
    assert small_m_linear._build() is False


def test_a_failed_build_is_unavailable_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    def broken(**kwargs: object) -> None:
        raise RuntimeError("no compiler")

    monkeypatch.setattr(cpp_extension, "load", broken)
    assert small_m_linear._build() is False


class TiedModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(100, 24)
        self.proj = nn.Linear(24, 24)
        self.lm_head: nn.Module | None = None

    def compute_logits(self, h: torch.Tensor) -> torch.Tensor:
        if self.lm_head is None:
            return F.linear(h, self.embed_tokens.weight)
        return self.lm_head(h)  # type: ignore[no-any-return]


def test_pack_linears_gives_a_tied_head_its_own_packed_linear() -> None:
    torch.manual_seed(0)
    model = TiedModel().to(torch.bfloat16)
    h = torch.randn(2, 24, dtype=torch.bfloat16)
    with torch.inference_mode():
        want = model.compute_logits(h)
        assert pack_linears(model, device=torch.device("cpu"), dtype=torch.bfloat16) == 2
        got = model.compute_logits(h)
    assert isinstance(model.lm_head, PackedLinear) and model.lm_head.small is not None
    assert isinstance(model.embed_tokens, nn.Embedding)  # the lookup keeps its table
    check(got, h, model.embed_tokens.weight, None, 2**-7)
    torch.testing.assert_close(got.float(), want.float(), rtol=2**-7, atol=1e-2)


@pytest.mark.parametrize("rows", [1, small_m_linear.MAX_ROWS_INT8, small_m_linear.MAX_ROWS_INT8 + 1])
def test_int8_linear_takes_the_kernel_at_small_m_with_bf16_rows(rows: int) -> None:
    from gpu_workers.models.int8_linear import Int8Linear, onednn_available, onednn_int8_mm, split_rows

    if not onednn_available() or small_m_linear.isa() != "avx512bf16":
        pytest.skip("needs oneDNN's int8 ops and avx512bf16")
    torch.manual_seed(0)
    linear = nn.Linear(70, 90, bias=False).to(torch.bfloat16)
    layer = Int8Linear(linear)
    assert layer.small is not None
    x = torch.randn(rows, 70, dtype=torch.bfloat16)
    with torch.inference_mode():
        got = layer(x)
        q, scale = split_rows(x)
        via_op = onednn_int8_mm(x, q, scale, layer.handle, 90).to(torch.bfloat16)  # the compiled step's op
    w = layer.dequantized_weight()
    check(got, x, w, None, 2**-7 if rows <= small_m_linear.MAX_ROWS_INT8 else 2**-6)
    assert torch.equal(got, via_op)
