"""Llama-family causal LM over a packed batch: llama, qwen2, granite and hyperclovax.

The forward takes every scheduled token of a step as one packed sequence of T rows
(input_ids (T,), positions (T,)); the attention backend knows from its metadata which rows
belong to which request and where their KV lives in the paged cache. Variants differ only in
config values read by `LlamaFamilyConfig.from_hf`:

    llama        the base architecture
    qwen2        + biases on q/k/v (never on o)
    granite      + muP: embedding_multiplier, attention_multiplier (the softmax scale),
                   residual_multiplier, logits_scaling (logits are DIVIDED by it)
    hyperclovax  the same muP fields, except that logits are MULTIPLIED by logits_scaling
                 (transformers' HyperCLOVAXForCausalLM and NAVER's vLLM plugin both multiply),
                 + Peri-LN when `use_post_norm`: an RMSNorm on the attention output and on the
                 MLP output before each residual add, stored as model.layers.N.post_norm1.weight
                 and model.layers.N.post_norm2.weight

A hyperclovax config must say `use_post_norm`: transformers' HyperCLOVAXConfig defaults it to
True and the reference's vLLM plugin to False, so a missing value is an error, not a guess. The
muP multipliers default (absent or null) to what both of those agree on: 1.0, and
head_dim ** -0.5 for attention_multiplier. A multiplier of exactly 1.0 costs nothing. The plugin
also multiplies by a `logit_scale` field that transformers ignores: only 1.0 is accepted.

Parameter names follow the HF layout without the "model." prefix, except that q/k/v and
gate/up are fused at load time (`STACKED_PARAMS` says how; gpu_workers/llm/loader.py does it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.attention.backend import AttentionBackend, KVCache
from gpu_workers.models import llama_small_m
from gpu_workers.models.registry import CausalLM, MergedLinear, register_architecture

# model_type -> the class name config.json's `architectures` gives it (the registry's keys)
ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "granite": "GraniteForCausalLM",
    "hyperclovax": "HyperCLOVAXForCausalLM",
}
SUPPORTED_MODEL_TYPES = tuple(ARCHITECTURES)
_ROPE_TYPES = ("default", "llama3")


@dataclass(frozen=True, slots=True)
class LlamaFamilyConfig:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    o_bias: bool
    mlp_bias: bool
    rope_theta: float
    attention_scale: float  # softmax scale: 1/sqrt(head_dim), or granite's attention_multiplier
    rope_type: str = "default"  # "default" | "llama3"
    # llama3 rope scaling; ignored for "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_position_embeddings: int = 8192
    # muP (granite, hyperclovax); plain llama values elsewhere
    embedding_multiplier: float = 1.0
    residual_multiplier: float = 1.0
    logits_scaling: float = 1.0
    use_post_norm: bool = False

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, config: dict[str, Any]) -> LlamaFamilyConfig:
        """Read a HF config.json dict (transformers 4.x or 5.x key layout)."""
        try:
            return cls._from_hf(config)
        except TypeError as e:  # e.g. float(None) for a null field
            raise ValueError(f"{config.get('model_type')} config: malformed value ({e})") from None

    @classmethod
    def _from_hf(cls, config: dict[str, Any]) -> LlamaFamilyConfig:
        if not isinstance(config, dict):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        model_type = config.get("model_type")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"unsupported model_type {model_type!r}; supported: {', '.join(SUPPORTED_MODEL_TYPES)}"
            )

        def require_int(key: str) -> int:
            value = config.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{model_type} config: {key} must be a positive int, got {value!r}")
            return value

        hidden = require_int("hidden_size")
        num_heads = require_int("num_attention_heads")
        num_kv_heads = config.get("num_key_value_heads") or num_heads
        if not isinstance(num_kv_heads, int) or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise ValueError(
                f"{model_type} config: num_key_value_heads ({num_kv_heads!r}) must divide "
                f"num_attention_heads ({num_heads})"
            )
        head_dim = config.get("head_dim")
        if head_dim is None:
            if hidden % num_heads:
                raise ValueError(
                    f"{model_type} config: hidden_size {hidden} is not divisible by "
                    f"num_attention_heads {num_heads} and no head_dim is given"
                )
            head_dim = hidden // num_heads
        if not isinstance(head_dim, int) or head_dim <= 0 or head_dim % 2:
            raise ValueError(f"{model_type} config: head_dim must be a positive even int, got {head_dim!r}")
        act = config.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"{model_type} config: hidden_act {act!r} is not supported (only silu)")
        if config.get("use_sliding_window"):
            raise ValueError(f"{model_type} config: sliding-window attention is not supported")

        if model_type == "qwen2":
            qkv_bias, o_bias, mlp_bias = True, False, False
        else:
            qkv_bias = o_bias = bool(config.get("attention_bias", False))
            mlp_bias = bool(config.get("mlp_bias", False))

        rope = _rope_from_hf(config, model_type)
        if model_type == "granite":
            # Granite's config class defaults attention_multiplier to 1.0 (transformers writes
            # it out explicitly).
            mup: dict[str, Any] = {
                "embedding_multiplier": float(config.get("embedding_multiplier", 1.0)),
                "attention_scale": float(config.get("attention_multiplier", 1.0)),
                "residual_multiplier": float(config.get("residual_multiplier", 1.0)),
                "logits_scaling": float(config.get("logits_scaling", 1.0)),
            }
            if mup["logits_scaling"] == 0.0:
                raise ValueError(f"{model_type} config: logits_scaling must not be 0 (logits are divided by it)")
        elif model_type == "hyperclovax":
            mup = _hyperclovax_mup(config, head_dim)
        else:
            mup = {"attention_scale": head_dim**-0.5}

        return cls(
            model_type=model_type,
            vocab_size=require_int("vocab_size"),
            hidden_size=hidden,
            intermediate_size=require_int("intermediate_size"),
            num_layers=require_int("num_hidden_layers"),
            num_heads=num_heads,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=int(config.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            mlp_bias=mlp_bias,
            **rope,
            **mup,
        )


def _hyperclovax_mup(config: dict[str, Any], head_dim: int) -> dict[str, Any]:
    """muP and Peri-LN of a hyperclovax config, read as transformers 5's HyperCLOVAXConfig and
    NAVER's vLLM plugin read them where the two agree, and refused where they do not."""
    use_post_norm = config.get("use_post_norm")
    if not isinstance(use_post_norm, bool):
        raise ValueError(  # noqa: TRY004 - a config error, reported as every other one is
            "hyperclovax config: use_post_norm must be given as true or false, got "
            f"{'nothing' if use_post_norm is None else repr(use_post_norm)} (transformers' HyperCLOVAXConfig "
            "defaults it to true, the reference's vLLM plugin to false; omni-serve does not guess)"
        )

    def multiplier(key: str, default: float) -> float:
        value = config.get(key)
        return default if value is None else float(value)

    if multiplier("logit_scale", 1.0) != 1.0:
        # the plugin multiplies the logits by logit_scale too; transformers ignores it
        raise ValueError(f"hyperclovax config: logit_scale {config['logit_scale']!r} is not supported (only 1.0)")

    return {
        "embedding_multiplier": multiplier("embedding_multiplier", 1.0),
        "attention_scale": multiplier("attention_multiplier", head_dim**-0.5),
        "residual_multiplier": multiplier("residual_multiplier", 1.0),
        "logits_scaling": multiplier("logits_scaling", 1.0),
        "use_post_norm": use_post_norm,
    }


def _rope_from_hf(config: dict[str, Any], model_type: str) -> dict[str, Any]:
    # transformers 5 writes rope_parameters (with rope_theta inside); 4.x wrote rope_theta at
    # the top level and an optional rope_scaling dict (older ones spell rope_type as "type").
    params = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(params, dict) or any(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{model_type} config: unsupported rope parameters {params!r}")
    theta = float(params.get("rope_theta", config.get("rope_theta", 10000.0)))
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in _ROPE_TYPES:
        raise ValueError(
            f"{model_type} config: rope_type {rope_type!r} is not supported ({', '.join(_ROPE_TYPES)})"
        )
    out: dict[str, Any] = {"rope_theta": theta, "rope_type": rope_type}
    if rope_type == "llama3":
        try:
            out.update(
                rope_factor=float(params["factor"]),
                rope_low_freq_factor=float(params["low_freq_factor"]),
                rope_high_freq_factor=float(params["high_freq_factor"]),
                rope_original_max_position_embeddings=int(params["original_max_position_embeddings"]),
            )
        except KeyError as e:
            raise ValueError(f"{model_type} config: llama3 rope scaling lacks {e.args[0]!r}") from None
    return out


def rope_inv_freq(config: LlamaFamilyConfig) -> torch.Tensor:
    """(D/2,) float32 inverse frequencies, as transformers computes them."""
    d = config.head_dim
    # device="cpu" explicitly: the loader builds modules under a meta-device context
    exponents = torch.arange(0, d, 2, dtype=torch.int64, device="cpu").float() / d
    inv_freq = 1.0 / (config.rope_theta**exponents)
    if config.rope_type == "llama3":
        factor = config.rope_factor
        low, high = config.rope_low_freq_factor, config.rope_high_freq_factor
        old_len = config.rope_original_max_position_embeddings
        wavelen = 2 * math.pi / inv_freq
        # long wavelengths are slowed down by `factor`, short ones kept, the middle blended
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        is_medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
        inv_freq = torch.where(is_medium, blended, scaled)
    return inv_freq


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (T, H); statistics in float32 like the reference
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        # A plain attribute, not a buffer: the loader builds modules on the meta device, and
        # this must stay real. It follows the positions' device on first use.
        self.inv_freq = rope_inv_freq(config)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if self.inv_freq.device != positions.device:
            self.inv_freq = self.inv_freq.to(positions.device)
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # (T, D/2)
        emb = torch.cat((freqs, freqs), dim=-1)  # (T, D)
        return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x (T, heads, D); cos, sin (T, D); halves rotated (the HF "rotate_half" layout)
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class Attention(nn.Module):
    def __init__(self, config: LlamaFamilyConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config = config
        self.backend = backend
        self.qkv_proj = MergedLinear(
            config.hidden_size, (config.q_size, config.kv_size, config.kv_size), bias=config.qkv_bias
        )
        self.o_proj = nn.Linear(config.q_size, config.hidden_size, bias=config.o_bias)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache | None,
        attn_metadata: Any,
    ) -> torch.Tensor:
        c = self.config
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split((c.q_size, c.kv_size, c.kv_size), dim=-1)
        q = apply_rotary(q.view(t, c.num_heads, c.head_dim), cos, sin)  # (T, Hq, D)
        k = apply_rotary(k.view(t, c.num_kv_heads, c.head_dim), cos, sin)  # (T, Hkv, D)
        v = v.view(t, c.num_kv_heads, c.head_dim)  # (T, Hkv, D)
        out = self.backend.forward(q, k, v, kv_cache, attn_metadata, c.attention_scale)  # (T, Hq, D)
        return self.o_proj(out.reshape(t, c.q_size))  # (T, H)


class MLP(nn.Module):
    def __init__(self, config: LlamaFamilyConfig) -> None:
        super().__init__()
        i = config.intermediate_size
        self.gate_up_proj = MergedLinear(config.hidden_size, (i, i), bias=config.mlp_bias)
        self.down_proj = nn.Linear(i, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)  # (T, I) each
        return self.down_proj(F.silu(gate) * up)  # (T, H)


class DecoderLayer(nn.Module):
    def __init__(self, config: LlamaFamilyConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.residual_multiplier = config.residual_multiplier
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, backend)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        # Peri-LN: outputs are normalised before they join the residual stream
        self.post_norm1 = RMSNorm(config.hidden_size, config.rms_norm_eps) if config.use_post_norm else None
        self.post_norm2 = RMSNorm(config.hidden_size, config.rms_norm_eps) if config.use_post_norm else None

    def small_m_forward(
        self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv_cache: KVCache | None, attn_metadata: Any
    ) -> torch.Tensor | None:
        """forward()'s result as two C++ calls around the attention at small M on the CPU, or None
        where they do not serve (models/llama_small_m.py)."""
        return llama_small_m.layer_forward(self, h, cos, sin, kv_cache, attn_metadata)

    def forward(
        self,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        kv_cache: KVCache | None,
        attn_metadata: Any,
    ) -> torch.Tensor:
        fused = self.small_m_forward(h, cos, sin, kv_cache, attn_metadata)
        if fused is not None:
            return fused
        a = self.self_attn(self.input_layernorm(h), cos, sin, kv_cache, attn_metadata)  # (T, H)
        if self.post_norm1 is not None:
            a = self.post_norm1(a)
        if self.residual_multiplier != 1.0:
            a = a * self.residual_multiplier
        h = h + a
        m = self.mlp(self.post_attention_layernorm(h))  # (T, H)
        if self.post_norm2 is not None:
            m = self.post_norm2(m)
        if self.residual_multiplier != 1.0:
            m = m * self.residual_multiplier
        return h + m


@register_architecture(ARCHITECTURES, LlamaFamilyConfig.from_hf)
class LlamaForCausalLM(CausalLM):
    # checkpoint module name -> (our fused module, shard index); see MergedLinear
    STACKED_PARAMS: ClassVar[dict[str, tuple[str, int]]] = {
        "q_proj": ("qkv_proj", 0),
        "k_proj": ("qkv_proj", 1),
        "v_proj": ("qkv_proj", 2),
        "gate_proj": ("gate_up_proj", 0),
        "up_proj": ("gate_up_proj", 1),
    }
    # under int8, the fused q|k|v and the MLP's down projection stay in the serving dtype
    INT8_KEEP: ClassVar[tuple[str, ...]] = ("qkv_proj", "down_proj")

    def __init__(self, config: LlamaFamilyConfig, backend: AttentionBackend) -> None:
        super().__init__()
        self.config: LlamaFamilyConfig = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.rotary = RotaryEmbedding(config)
        self.layers = nn.ModuleList(DecoderLayer(config, backend) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        # tied: compute_logits reads embed_tokens.weight, so there is no second parameter
        self.lm_head = (
            None
            if config.tie_word_embeddings
            else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        )

    def native_layers(
        self, h: torch.Tensor, shared: tuple[torch.Tensor, ...], kv_caches: list[KVCache], attn_metadata: Any
    ) -> torch.Tensor | None:
        """A decode step of a few rows on the CPU, every layer in one C++ call (models/llama_small_m.py)."""
        return llama_small_m.model_forward(self, h, shared, kv_caches, attn_metadata)

    def native_rows(self, dtype: torch.dtype) -> int:
        return llama_small_m.model_rows(self, dtype)

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Raw embedding rows (T, H); layer_inputs applies embedding_multiplier to these and to
        any injected inputs_embeds alike, as the reference model does."""
        return self.embed_tokens(input_ids)

    def layer_inputs(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        # h (T, H) -> the first layer's input, and RoPE's (cos, sin), (T, D) each, for every layer
        if self.config.embedding_multiplier != 1.0:
            h = h * self.config.embedding_multiplier
        return h, self.rotary(positions, h.dtype)

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        return self.norm(h)  # (T, H)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        # hidden (N, H) -> float32 logits (N, V)
        if self.lm_head is None:  # tied: the embedding table is the output projection
            logits = F.linear(hidden, self.embed_tokens.weight)
        else:
            logits = self.lm_head(hidden)
        scaling = self.config.logits_scaling
        if scaling != 1.0:
            # muP: hyperclovax multiplies, granite divides (as each reference model does)
            logits = logits * scaling if self.config.model_type == "hyperclovax" else logits / scaling
        return logits.float()
