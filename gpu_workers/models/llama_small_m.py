"""The llama family's decode steps of a few rows on the CPU, through small_m_linear's fused ops.

At M = 1 eager torch spends more in its ~40 calls a decoder layer (norms, RoPE, SiLU, residuals,
each with its dispatch and allocation) than in reading the layer's weights. Two paths replace
them where every linear of a layer has a small-M form (PackedLinear, Int8Linear and GgufLinear
give one: `small_m_form()`) and the activations are on the CPU:

- `layer_forward`: one layer as two C++ calls (attn_in; the attention backend; attn_out_mlp),
  for any step of up to `rows_for(forms)` rows (DecoderLayer.forward asks it first);
- `model_forward`: every layer of a decode step in one C++ call (decode_layers), the paged
  attention kernel called through its address between each layer's halves, where the attention
  backend gives a PagedDecodePlan for the step (LlamaForCausalLM.native_layers).

Both round where the eager ops round (small_m_linear.cpp); tests/gpu_workers/models/
test_small_m_layer.py holds them to the eager layer and the layer-by-layer runner.
"""

from __future__ import annotations

from typing import Any

import torch

from gpu_workers.attention.backend import KVCache
from gpu_workers.models import small_m_linear
from gpu_workers.models.small_m_linear import Form

# models/llama.py's DecoderLayer and LlamaForCausalLM, named without importing them (llama.py
# imports this module): their attributes are read as the classes define them
DecoderLayer = Any
LlamaForCausalLM = Any

Forms = tuple[Form, Form, Form, Form]  # q|k|v, o, gate|up, down


def rows_for(forms: Forms) -> int:
    """The most rows the small-M paths take over these linears: MAX_ROWS_LAYER, or MAX_ROWS_INT8
    where one of them is int8 (its kernel was measured against the split GEMM up to there)."""
    if any(f[0].dtype == torch.int8 for f in forms):
        return min(small_m_linear.MAX_ROWS_LAYER, small_m_linear.MAX_ROWS_INT8)
    return small_m_linear.MAX_ROWS_LAYER


def layer_forms(layer: DecoderLayer, dtype: torch.dtype) -> Forms | None:
    """The layer's q|k|v, o, gate|up and down as the fused ops take them for activations of
    `dtype`; None where one has no small-M form (an nn.Linear, a GPU, int8 under float32
    activations). Read once per dtype and kept on the layer: the linears are swapped at load."""
    cache: dict[torch.dtype, Forms | None] = layer.__dict__.setdefault("_small_m_forms", {})
    if dtype not in cache:
        mods = (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj)
        forms = [getattr(m, "small_m_form", lambda: None)() for m in mods]
        # a weight in the activations' dtype, int8 (under bf16 activations) or GGUF blocks (any)
        ok = all(f is not None and (f[0].dtype in (dtype, torch.uint8) or (f[0].dtype == torch.int8 and dtype == torch.bfloat16))
                 for f in forms)  # fmt: skip
        cache[dtype] = tuple(forms) if ok else None  # type: ignore[assignment]
    return cache[dtype]


def layer_forward(
    layer: DecoderLayer, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None, meta: Any
) -> torch.Tensor | None:
    """layer.forward()'s result through the two fused halves; None where they do not serve."""
    if h.shape[0] > small_m_linear.MAX_ROWS_LAYER or h.device.type != "cpu" or torch.compiler.is_compiling():
        return None
    forms = layer_forms(layer, h.dtype)
    if forms is None or h.shape[0] > rows_for(forms):
        return None
    qkv, o, gate_up, down = forms
    attn = layer.self_attn
    c = attn.config
    eps = layer.input_layernorm.eps
    q, k, v = small_m_linear.attn_in(h, layer.input_layernorm.weight, eps, qkv, cos, sin, c.num_heads, c.num_kv_heads, c.head_dim)
    a = attn.backend.forward(q, k, v, kv_cache, meta, c.attention_scale)  # (T, Hq, D)
    post1, post2 = layer.post_norm1, layer.post_norm2
    return small_m_linear.attn_out_mlp(
        h, a.reshape(h.shape[0], c.q_size), o, None if post1 is None else post1.weight, layer.residual_multiplier,
        layer.post_attention_layernorm.weight, eps, gate_up, c.intermediate_size, down,
        None if post2 is None else post2.weight,
    )  # fmt: skip


def model_rows(model: LlamaForCausalLM, dtype: torch.dtype) -> int:
    """The most rows of a decode step model_forward takes (0: none)."""
    if model.embed_tokens.weight.device.type != "cpu" or _model_weights(model, dtype) is None:
        return 0
    forms = layer_forms(model.layers[0], dtype)  # type: ignore[arg-type]
    return 0 if forms is None else rows_for(forms)


def model_forward(
    model: LlamaForCausalLM, h: torch.Tensor, shared: tuple[torch.Tensor, ...], kv_caches: list[KVCache], meta: Any
) -> torch.Tensor | None:
    """Every layer's output for a decode step in one decode_layers call; None where it does not
    serve (too many rows, a form missing, a cache in another dtype, no PagedDecodePlan)."""
    if h.shape[0] > model_rows(model, h.dtype) or torch.compiler.is_compiling() or kv_caches[0][0].dtype != h.dtype:
        return None
    weights = _model_weights(model, h.dtype)
    if weights is None:
        return None
    first: DecoderLayer = model.layers[0]  # type: ignore[assignment]
    plan = first.self_attn.backend.paged_decode_plan(meta, kv_caches[0])
    if plan is None:
        return None
    c = model.config
    cos, sin = shared
    return torch.ops.omni_small_m.decode_layers(  # type: ignore[no-any-return]
        h, cos, sin, weights, [kv[0] for kv in kv_caches], [kv[1] for kv in kv_caches], plan.block_table,
        plan.context_lens, plan.slots, plan.entry, c.attention_scale, c.rms_norm_eps, c.residual_multiplier,
        c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
    )  # fmt: skip


def _model_weights(model: LlamaForCausalLM, dtype: torch.dtype) -> list[torch.Tensor | None] | None:
    # decode_layers' flat list, 16 a layer (small_m_linear.cpp says the order); None where a
    # layer has no forms. Built once per dtype and kept on the model, the norms' weights as the
    # C++ reads them in place each step (float32: bf16 ones widened once, exactly).
    cache: dict[torch.dtype, list[torch.Tensor | None] | None] = model.__dict__.setdefault("_small_m_weights", {})
    if dtype not in cache:
        flat: list[torch.Tensor | None] | None = []
        for module in model.layers:
            layer: DecoderLayer = module  # type: ignore[assignment]
            forms = layer_forms(layer, dtype)
            if forms is None or flat is None:
                flat = None
                break
            qkv, o, gate_up, down = forms
            post1, post2 = layer.post_norm1, layer.post_norm2
            flat += [_norm(layer.input_layernorm), *qkv, *o, None if post1 is None else _norm(post1),
                     _norm(layer.post_attention_layernorm), *gate_up, *down, None if post2 is None else _norm(post2)]  # fmt: skip
        cache[dtype] = flat
    return cache[dtype]


def _norm(norm: torch.nn.Module) -> torch.Tensor:
    return norm.weight.detach().float().contiguous()  # type: ignore[operator]
