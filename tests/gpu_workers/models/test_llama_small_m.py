"""models/llama_small_m.py: a decoder layer's fused small-M halves (small_m_linear.cpp's attn_in
and attn_out_mlp, reached through DecoderLayer.small_m_forward) against the same layer's eager ops,
for every llama-family variant (qwen2's q|k|v bias, granite's and hyperclovax's residual
multiplier, hyperclovax's post norms), bf16 and float32 activations, int8 linears, and M = 1..4.

Bounds: the halves round where the eager ops round, so in bf16 they differ from eager only where
a sum's order tips a rounding (the norms' sums of squares; oneDNN's GEMM above MAX_ROWS rows):
at most 2 bf16 steps (2^-7 relative) on any element, and on at most 2 % of them. In float32 the
difference is summation order: 1e-5 of the output's scale."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.models import llama_small_m, small_m_linear
from gpu_workers.models.int8_linear import quantize_linears
from gpu_workers.models.llama import DecoderLayer, LlamaFamilyConfig, RotaryEmbedding
from gpu_workers.models.packed_linear import pack_linears

pytestmark = pytest.mark.skipif(
    not small_m_linear.load(), reason="small-M kernels not built here (no compiler or CPU path)"
)

VARIANTS: dict[str, dict[str, Any]] = {
    "llama": {},
    "qwen2": {},
    "granite": {"residual_multiplier": 0.5, "attention_multiplier": 0.1},
    "hyperclovax": {"use_post_norm": True, "residual_multiplier": 0.7},
}


class MixingBackend:
    """Stands in for attention: a fixed mix of q, k and v, so the test sees both halves' outputs."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kv_cache: Any, meta: Any, scale: float) -> torch.Tensor:
        g = q.shape[1] // k.shape[1]
        return q * scale + k.repeat_interleave(g, 1) - 0.5 * v.repeat_interleave(g, 1)


def make_layer(model_type: str, dtype: torch.dtype, int8: bool, seed: int = 0) -> tuple[DecoderLayer, LlamaFamilyConfig]:
    config = LlamaFamilyConfig.from_hf({
        "model_type": model_type, "vocab_size": 64, "hidden_size": 96, "intermediate_size": 200,
        "num_hidden_layers": 1, "num_attention_heads": 6, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
        **VARIANTS[model_type],
    })  # fmt: skip
    torch.manual_seed(seed)
    layer = DecoderLayer(config, MixingBackend()).to(dtype)  # type: ignore[arg-type]
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.2)
        for name, p in layer.named_parameters():
            if "norm" in name:
                p.normal_(1, 0.1)
    if int8:
        quantize_linears(layer, keep=("qkv_proj", "down_proj"))
    pack_linears(layer, device=torch.device("cpu"), dtype=dtype)
    return layer, config


def both_ways(layer: DecoderLayer, config: LlamaFamilyConfig, rows: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> tuple[torch.Tensor, torch.Tensor]:
    h = torch.randn(rows, config.hidden_size).to(dtype)
    cos, sin = RotaryEmbedding(config)(torch.arange(rows) * 7 + 3, dtype)
    with torch.no_grad():
        fused = layer.small_m_forward(h, cos, sin, None, None)
        assert fused is not None, "the fused halves did not serve"
        assert torch.equal(layer(h, cos, sin, None, None), fused)  # forward() takes them
        monkeypatch.setattr(small_m_linear, "MAX_ROWS_LAYER", 0)
        assert layer.small_m_forward(h, cos, sin, None, None) is None
        eager = layer(h, cos, sin, None, None)
        monkeypatch.undo()
    return fused, eager


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 6, 8])
@pytest.mark.parametrize("model_type", list(VARIANTS))
@pytest.mark.parametrize(("dtype", "int8"), [(torch.bfloat16, False), (torch.bfloat16, True), (torch.float32, False)])
def test_fused_halves_match_the_eager_layer(model_type: str, dtype: torch.dtype, int8: bool, rows: int, monkeypatch: pytest.MonkeyPatch) -> None:
    layer, config = make_layer(model_type, dtype, int8)
    if int8 and rows > small_m_linear.MAX_ROWS_INT8:  # past the int8 kernel's reach: the eager layer
        h = torch.randn(rows, config.hidden_size).to(dtype)
        cos, sin = RotaryEmbedding(config)(torch.arange(rows), dtype)
        assert layer.small_m_forward(h, cos, sin, None, None) is None
        return
    fused, eager = both_ways(layer, config, rows, dtype, monkeypatch)
    assert fused.dtype == eager.dtype and fused.shape == eager.shape
    diff = (fused.float() - eager.float()).abs()
    if dtype == torch.float32:
        assert diff.max() <= 1e-5 * eager.abs().max()
    else:
        assert (diff <= 2 * 2**-7 * eager.float().abs()).all()
        assert (diff > 0).float().mean() <= 0.02


def test_the_avx2_path_matches_too(monkeypatch: pytest.MonkeyPatch) -> None:
    if small_m_linear.isa() == "avx2":
        pytest.skip("the default path here is avx2 already")
    layer, config = make_layer("qwen2", torch.bfloat16, False, seed=1)
    torch.ops.omni_small_m.set_isa("avx2")
    try:
        fused, eager = both_ways(layer, config, 3, torch.bfloat16, monkeypatch)
    finally:
        torch.ops.omni_small_m.set_isa("auto")
    diff = (fused.float() - eager.float()).abs()
    assert (diff <= 2 * 2**-7 * eager.float().abs()).all()


def test_no_small_m_form_keeps_the_eager_layer() -> None:
    # unpacked nn.Linears (a GPU, or oneDNN absent) have no small-M form: forward() is the eager one
    config = LlamaFamilyConfig.from_hf({
        "model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 40,
        "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2,
    })  # fmt: skip
    layer = DecoderLayer(config, MixingBackend())  # type: ignore[arg-type]
    h = torch.randn(1, 32)
    cos, sin = RotaryEmbedding(config)(torch.tensor([5]), torch.float32)
    assert layer.small_m_forward(h, cos, sin, None, None) is None
    assert llama_small_m.layer_forms(layer, torch.float32) is None


def test_int8_linears_under_float32_activations_keep_the_eager_layer() -> None:
    # the int8 kernel rounds activations to bf16: float32 rows must keep their precision
    layer, _ = make_layer("llama", torch.float32, True)
    assert layer.mlp.gate_up_proj.small_m_form() is not None  # an int8 form it has, for bf16 rows
    assert llama_small_m.layer_forms(layer, torch.float32) is None


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("model_type", list(VARIANTS))
def test_a_decode_step_in_one_native_call_matches_layer_by_layer(
    hf_checkpoint: Any, model_type: str, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The runner's decode steps through decode_layers (every layer in one call, the paged kernel
    writing and reading the cache) sample what the layer-by-layer eager steps sample, with the
    same logprobs and the same cache, for one sequence and for a batch of three; a prefill step
    never takes it."""
    from gpu_workers.attention import cpu_paged
    from gpu_workers.llm.runner import LLMRunner
    from gpu_workers.models.llama import LlamaForCausalLM
    from omni.shared import protocol

    if not cpu_paged.available():
        pytest.skip("the paged CPU attention kernel is not built here")
    model_dir = hf_checkpoint(model_type)[0]
    greedy = protocol.SamplingOptions(temperature=0.0, logprobs=2)
    native_rows: list[int] = []
    real = LlamaForCausalLM.native_layers

    def counted(self: LlamaForCausalLM, h: torch.Tensor, *args: Any) -> torch.Tensor | None:
        out = real(self, h, *args)
        if out is not None:
            native_rows.append(h.shape[0])
        return out

    monkeypatch.setattr(LlamaForCausalLM, "native_layers", counted)

    def run() -> tuple[list[tuple[int, float]], torch.Tensor]:
        runner = LLMRunner(model_dir, dtype=dtype, block_size=4, num_kv_blocks=32)
        prompts = {"a": [3, 1, 4, 1, 5, 9, 2], "b": [2, 7, 1, 8], "c": [1, 6, 1, 8, 0, 3]}
        new = [protocol.NewRequest(r, p, greedy, [4 * i + j for j in range(4)], 0, len(p)) for i, (r, p) in enumerate(prompts.items())]
        out = runner.execute(protocol.Step(0, new[:1], [], []))
        sampled = [(s.token_id, s.logprob) for s in out.sampled]
        computed = {"a": 7}
        for step in range(1, 4):  # a alone: one row
            out = runner.execute(protocol.Step(step, [], [protocol.CachedRequest("a", [], computed["a"], 1)], []))
            computed["a"] += 1
            sampled += [(s.token_id, s.logprob) for s in out.sampled]
        runner.execute(protocol.Step(4, new[1:], [], []))  # b and c's prompts
        computed.update(b=4, c=6)
        for step in range(5, 9):  # a, b and c: three rows
            cached = [protocol.CachedRequest(r, [], computed[r], 1) for r in ("a", "b", "c")]
            out = runner.execute(protocol.Step(step, [], cached, []))
            for r in computed:
                computed[r] += 1
            sampled += [(s.token_id, s.logprob) for s in out.sampled]
        return sampled, runner.kv_cache.clone()

    native = run()
    assert native_rows == [1, 1, 1, 3, 3, 3, 3]  # the decode steps; prefills went layer by layer
    monkeypatch.setattr(small_m_linear, "MAX_ROWS_LAYER", 0)
    native_rows.clear()
    eager = run()
    assert native_rows == []
    assert [t for t, _ in native[0]] == [t for t, _ in eager[0]]
    # float32: summation order; bf16: where a rounding tips (oneDNN's GEMM sums M > 1 rows in
    # another order than the small-M kernel): a bf16 step in the cache, 1e-3 in a logprob
    logprobs = [torch.tensor([p for _, p in run[0]]) for run in (native, eager)]
    torch.testing.assert_close(*logprobs, rtol=1e-3, atol=1e-5 if dtype == torch.float32 else 1e-3)
    torch.testing.assert_close(native[1], eager[1], rtol=1e-5 if dtype == torch.float32 else 2**-7, atol=1e-5 if dtype == torch.float32 else 2e-3)
