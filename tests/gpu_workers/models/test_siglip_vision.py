"""The SigLIP vision tower (TA-Tok's image features) against transformers' SiglipVisionModel on
tiny random weights: the hidden state a feature layer picks, loading bare and prefixed full
checkpoints, and the config defaults transformers fills in."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers import SiglipVisionConfig as HFSiglipVisionConfig
from transformers import SiglipVisionModel

from gpu_workers.models.siglip_vision import SiglipVisionConfig, SiglipVisionTower
from tests.gpu_workers.models.test_ta_tok import random_pixels

# 6 x 6 patches, 4 layers: hidden_states has 5 entries, [-2] is layer 2's output
HF_VISION: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_channels": 3,
    "image_size": 84,
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
}


@pytest.fixture(scope="module")
def hf_model() -> SiglipVisionModel:
    torch.manual_seed(0)
    config = HFSiglipVisionConfig(**HF_VISION, vision_use_head=True)
    config._attn_implementation = "eager"  # an attention path independent of the SDPA call under test
    model = SiglipVisionModel(config).eval()
    # The default init (std 0.02, unit norms, zero biases) barely moves activations.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


@pytest.mark.parametrize("feature_layer", [-2, -1, 1])
def test_tower_matches_transformers_hidden_state(hf_model: SiglipVisionModel, feature_layer: int) -> None:
    tower = SiglipVisionTower(SiglipVisionConfig.from_hf(HF_VISION), feature_layer).eval()
    tower.load_hf_state_dict(hf_model.state_dict())  # bare 5.x names, with the unused rest
    assert len(tower.encoder.layers) == [3, 4, 1][[-2, -1, 1].index(feature_layer)]
    pixels = random_pixels(2, 84, seed=1)
    with torch.inference_mode():
        want = hf_model(pixels, output_hidden_states=True).hidden_states[feature_layer]
        got = tower(pixels)
    assert got.shape == (2, 36, 64)
    assert want.std() > 0.5  # a live signal, not one the residual stream swamps
    assert (got - want).abs().max().item() < 1e-4


def test_tower_loads_prefixed_full_checkpoints_and_rejects_gaps(hf_model: SiglipVisionModel) -> None:
    full = hf_model.state_dict()
    tower = SiglipVisionTower(SiglipVisionConfig.from_hf({"vision_config": HF_VISION}), -2).eval()
    pixels = random_pixels(1, 84, seed=2)
    with torch.inference_mode():
        want = hf_model(pixels, output_hidden_states=True).hidden_states[-2]
    for prefix in ("vision_model.", "model.vision_model."):
        weights = {prefix + k: v for k, v in full.items()}
        weights["text_model.embeddings.token_embedding.weight"] = torch.zeros(4, 8)  # another tower
        weights["logit_scale"] = torch.zeros(1)
        tower.load_hf_state_dict(weights)
        with torch.inference_mode():
            assert (tower(pixels) - want).abs().max().item() < 1e-4

    missing = {k: v for k, v in full.items() if k != "encoder.layers.2.mlp.fc1.bias"}
    with pytest.raises(ValueError, match=r"missing \['encoder.layers.2.mlp.fc1.bias'\]"):
        tower.load_hf_state_dict(missing)
    # layer 4 does not exist in a 4-layer config: a wrong checkpoint, not an unused layer
    extra = {**full, "encoder.layers.4.mlp.fc1.bias": torch.zeros(128)}
    with pytest.raises(ValueError, match=r"unexpected \['encoder.layers.4.mlp.fc1.bias'\]"):
        tower.load_hf_state_dict(extra)
    wrong = {**full, "embeddings.position_embedding.weight": torch.zeros(49, 64)}
    with pytest.raises(ValueError, match="shape"):
        tower.load_hf_state_dict(wrong)


def test_config_defaults_follow_transformers() -> None:
    # config.json files saved by transformers omit default values, as so400m's does
    so400m: dict[str, Any] = {"hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
                              "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14}  # fmt: skip
    ours, hf = SiglipVisionConfig.from_hf({"vision_config": so400m}), HFSiglipVisionConfig(**so400m)
    for field in SiglipVisionConfig.__dataclass_fields__:
        assert getattr(ours, field) == getattr(hf, field), field
    assert ours.grid_size == 27  # 384 // 14: the conv leaves the last 6 pixel rows and columns out
    with pytest.raises(ValueError, match="divisible"):
        SiglipVisionConfig.from_hf({**so400m, "num_attention_heads": 7})
