from __future__ import annotations

from typing import Any

import pytest
import torch

from gpu_workers.models.llama import LlamaFamilyConfig, rope_inv_freq

BASE: dict[str, Any] = {
    "model_type": "llama",
    "vocab_size": 128,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}


def test_defaults_and_derived_values() -> None:
    c = LlamaFamilyConfig.from_hf(BASE)
    assert (c.head_dim, c.q_size, c.kv_size) == (16, 64, 32)
    assert c.attention_scale == 16**-0.5
    assert (c.rope_type, c.rope_theta) == ("default", 10000.0)
    assert not (c.qkv_bias or c.o_bias or c.mlp_bias or c.tie_word_embeddings or c.use_post_norm)


def test_qwen2_has_qkv_bias_only() -> None:
    c = LlamaFamilyConfig.from_hf(BASE | {"model_type": "qwen2", "attention_bias": False})
    assert (c.qkv_bias, c.o_bias, c.mlp_bias) == (True, False, False)


def test_mup_fields_only_for_granite_and_hyperclovax() -> None:
    mup = {"embedding_multiplier": 12.0, "attention_multiplier": 0.5, "residual_multiplier": 0.2, "logits_scaling": 8.0}
    g = LlamaFamilyConfig.from_hf(BASE | mup | {"model_type": "granite", "use_post_norm": True})
    assert (g.embedding_multiplier, g.attention_scale, g.residual_multiplier, g.logits_scaling) == (12.0, 0.5, 0.2, 8.0)
    assert not g.use_post_norm  # Peri-LN is hyperclovax's
    h = LlamaFamilyConfig.from_hf(BASE | mup | {"model_type": "hyperclovax", "use_post_norm": True})
    assert h.use_post_norm and h.attention_scale == 0.5
    plain = LlamaFamilyConfig.from_hf(BASE | mup)
    assert (plain.embedding_multiplier, plain.logits_scaling, plain.attention_scale) == (1.0, 1.0, 0.25)


def test_hyperclovax_needs_use_post_norm_and_defaults_the_multipliers() -> None:
    # transformers' HyperCLOVAXConfig defaults use_post_norm to True, NAVER's vLLM plugin to False
    hcx = BASE | {"model_type": "hyperclovax"}
    for missing in (hcx, hcx | {"use_post_norm": None}, hcx | {"use_post_norm": "yes"}):
        with pytest.raises(ValueError, match="use_post_norm must be given"):
            LlamaFamilyConfig.from_hf(missing)
    # where the two agree, their default: 1.0, and head_dim ** -0.5 for the softmax scale
    nulls = dict.fromkeys(("embedding_multiplier", "attention_multiplier", "residual_multiplier", "logits_scaling"))
    for config in (hcx | {"use_post_norm": False}, hcx | nulls | {"use_post_norm": False}):
        c = LlamaFamilyConfig.from_hf(config)
        assert (c.embedding_multiplier, c.residual_multiplier, c.logits_scaling) == (1.0, 1.0, 1.0)
        assert c.attention_scale == 16**-0.5 and not c.use_post_norm
    # NAVER's plugin also multiplies by a logit_scale field, which transformers ignores
    assert LlamaFamilyConfig.from_hf(hcx | {"use_post_norm": True, "logit_scale": 1.0}).logits_scaling == 1.0
    with pytest.raises(ValueError, match="logit_scale 2.0 is not supported"):
        LlamaFamilyConfig.from_hf(hcx | {"use_post_norm": True, "logit_scale": 2.0})


def test_old_and_new_rope_keys_agree() -> None:
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    old = LlamaFamilyConfig.from_hf(BASE | {"rope_theta": 5e5, "rope_scaling": {"type": "llama3", **scaling}})
    new = LlamaFamilyConfig.from_hf(BASE | {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5, **scaling}})
    assert old == new and new.rope_type == "llama3" and new.rope_theta == 5e5


def test_llama3_inv_freq_matches_transformers() -> None:
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    rope = {"rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64}  # fmt: skip
    hf = LlamaConfig(hidden_size=256, num_attention_heads=2, rope_parameters=rope)
    expected, _ = ROPE_INIT_FUNCTIONS["llama3"](hf, torch.device("cpu"))
    ours = rope_inv_freq(LlamaFamilyConfig.from_hf(BASE | {"hidden_size": 256, "num_attention_heads": 2,
                                                            "num_key_value_heads": 2, "rope_parameters": rope}))  # fmt: skip
    torch.testing.assert_close(ours, expected.float())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"model_type": "mistral"}, "unsupported model_type 'mistral'"),
        ({"model_type": None}, "unsupported model_type None"),
        ({"hidden_size": None}, "hidden_size must be a positive int"),
        ({"num_key_value_heads": 3}, "must divide num_attention_heads"),
        ({"hidden_size": 66}, "not divisible"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_parameters": {"rope_type": "yarn", "factor": 4.0}}, "rope_type 'yarn'"),
        ({"rope_parameters": {"rope_type": "llama3", "factor": 4.0}}, "llama3 rope scaling lacks"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "sliding-window"),
    ],
)
def test_malformed_configs_are_rejected(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        LlamaFamilyConfig.from_hf(BASE | change)
