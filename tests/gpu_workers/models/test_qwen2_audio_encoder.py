"""The Qwen2-Audio encoder against transformers, on tiny random weights and random noise clips
(its log-mel features: tests/gpu_workers/preprocess/test_audio.py)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from transformers.masking_utils import create_bidirectional_mask
from transformers.models.qwen2_audio.configuration_qwen2_audio import Qwen2AudioEncoderConfig
from transformers.models.qwen2_audio.modeling_qwen2_audio import Qwen2AudioEncoder as HFQwen2AudioEncoder

from gpu_workers.models.qwen2_audio_encoder import AudioEncoderConfig, Qwen2AudioEncoder, output_lengths
from gpu_workers.preprocess.audio import LogMelExtractor
from tests.gpu_workers.preprocess import test_audio

# the features' module-scoped fixtures: the same clips, through the same extractor
extractor, clips = test_audio.extractor, test_audio.clips
HF_AUDIO: dict[str, Any] = {
    "num_mel_bins": 128,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 128,
    "d_model": 64,
    "max_source_positions": 1500,
    "activation_function": "gelu",
}


@pytest.fixture(scope="module")
def hf_model() -> HFQwen2AudioEncoder:
    torch.manual_seed(0)
    config = Qwen2AudioEncoderConfig(**HF_AUDIO)
    config._attn_implementation = "eager"
    model = HFQwen2AudioEncoder(config).eval()
    # The default init (std 0.02, unit norms, zero biases) barely moves activations.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "layer_norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def ours(hf_model: HFQwen2AudioEncoder) -> Qwen2AudioEncoder:
    model = Qwen2AudioEncoder(AudioEncoderConfig.from_hf(HF_AUDIO)).eval()
    model.load_hf_state_dict({f"model.audio_tower.{k}": v for k, v in hf_model.state_dict().items()})
    return model


def hf_encode(model: HFQwen2AudioEncoder, features: torch.Tensor, valid_frames: torch.Tensor) -> list[torch.Tensor]:
    """What Qwen2AudioModel does: mask keys past the conv2 length, keep the first N rows."""
    conv_rows, num_tokens = model._get_feat_extract_output_lengths(valid_frames)  # type: ignore[arg-type]
    max_rows = (features.shape[-1] - 2) // 2 + 1
    mask_2d = (torch.arange(max_rows)[None, :] < conv_rows[:, None]).long()
    mask = create_bidirectional_mask(
        config=model.config, inputs_embeds=torch.zeros(features.shape[0], max_rows, 1), attention_mask=mask_2d
    )
    with torch.no_grad():
        out = model(features, attention_mask=mask).last_hidden_state
    return [out[i, :n] for i, n in enumerate(num_tokens.tolist())]


# ---------------------------------------------------------------------------------------------
# Encoder


def test_output_lengths_match_transformers(hf_model: HFQwen2AudioEncoder) -> None:
    valid = torch.arange(1, 3001)
    want_lengths = hf_model._get_feat_extract_output_lengths(valid)  # type: ignore[arg-type]
    for got, want in zip(output_lengths(valid), want_lengths):
        assert torch.equal(got, want)
    assert output_lengths(torch.tensor([3000]))[1].item() == 750  # 25 tokens a second


def test_encoder_matches_transformers(
    hf_model: HFQwen2AudioEncoder, ours: Qwen2AudioEncoder, extractor: LogMelExtractor, clips: list[np.ndarray]
) -> None:
    batch = extractor(clips)  # windows of 300, 3000, 100 and 51 valid frames
    want = hf_encode(hf_model, batch.features, batch.valid_frames)
    with torch.no_grad():
        got, num_tokens = ours(batch.features, batch.valid_frames)
    assert num_tokens == [75, 750, 25, 13]
    assert got.shape == (sum(num_tokens), 64)
    torch.testing.assert_close(got, torch.cat(want), rtol=0, atol=1e-4)


def test_batch_equals_each_window_alone(
    ours: Qwen2AudioEncoder, extractor: LogMelExtractor, clips: list[np.ndarray]
) -> None:
    batch = extractor([clips[0], clips[2]])
    with torch.no_grad():
        together, num_tokens = ours(batch.features, batch.valid_frames)
        alone = [ours(batch.features[i : i + 1], batch.valid_frames[i : i + 1])[0] for i in range(2)]
    assert num_tokens == [75, 13]
    torch.testing.assert_close(together, torch.cat(alone), rtol=0, atol=1e-5)


def test_projector(hf_model: HFQwen2AudioEncoder, extractor: LogMelExtractor, clips: list[np.ndarray]) -> None:
    model = Qwen2AudioEncoder(AudioEncoderConfig.from_hf({"audio_config": HF_AUDIO, "projector_hidden_size": 96}))
    assert model.config.output_size == 96
    state = {f"audio_tower.{k}": v for k, v in hf_model.state_dict().items()}
    gen = torch.Generator().manual_seed(1)
    projector = {
        "audio_tower.projector.0.weight": torch.randn(64, 64, generator=gen) * 0.1,
        "audio_tower.projector.0.bias": torch.randn(64, generator=gen) * 0.1,
        "audio_tower.projector.2.weight": torch.randn(96, 64, generator=gen) * 0.1,
        "audio_tower.projector.2.bias": torch.randn(96, generator=gen) * 0.1,
    }
    model.load_hf_state_dict({**state, **projector, "language_model.lm_head.weight": torch.zeros(1)})
    batch = extractor([clips[0]])
    (encoded,) = hf_encode(hf_model, batch.features, batch.valid_frames)
    p = {k.removeprefix("audio_tower.projector."): v for k, v in projector.items()}
    want = torch.nn.functional.gelu(encoded @ p["0.weight"].T + p["0.bias"]) @ p["2.weight"].T + p["2.bias"]
    with torch.no_grad():
        got, num_tokens = model.eval()(batch.features, batch.valid_frames)
    assert num_tokens == [75] and got.shape == (75, 96)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4)


def test_loader_errors(hf_model: HFQwen2AudioEncoder) -> None:
    state = dict(hf_model.state_dict())
    model = Qwen2AudioEncoder(AudioEncoderConfig.from_hf(HF_AUDIO))
    model.load_hf_state_dict(state)  # bare names load

    missing = {k: v for k, v in state.items() if k != "layers.1.fc2.bias"}
    with pytest.raises(ValueError, match=r"missing \['layers.1.fc2.bias'\]"):
        model.load_hf_state_dict(missing)
    with pytest.raises(ValueError, match=r"unexpected \['layers.0.self_attn.k_proj.bias'\]"):
        model.load_hf_state_dict({**state, "audio_tower.layers.0.self_attn.k_proj.bias": torch.zeros(64)})
    with_projector = Qwen2AudioEncoder(AudioEncoderConfig.from_hf({**HF_AUDIO, "projector_hidden_size": 8}))
    with pytest.raises(ValueError, match=r"missing \['projector.0.bias'"):
        with_projector.load_hf_state_dict(state)
    with pytest.raises(ValueError, match="shape"):
        model.load_hf_state_dict({**state, "embed_positions.weight": torch.zeros(100, 64)})


def test_config_and_input_errors(ours: Qwen2AudioEncoder) -> None:
    with pytest.raises(ValueError, match="divisible"):
        AudioEncoderConfig.from_hf({**HF_AUDIO, "encoder_attention_heads": 5})
    with pytest.raises(ValueError, match="activation_function"):
        AudioEncoderConfig.from_hf({**HF_AUDIO, "activation_function": "swish2"})
    with pytest.raises(ValueError, match="encoder_layers"):
        AudioEncoderConfig.from_hf({k: v for k, v in HF_AUDIO.items() if k != "encoder_layers"})
    with pytest.raises(ValueError, match="want"):
        ours(torch.zeros(1, 128, 2999), torch.tensor([10]))
    with pytest.raises(ValueError, match=r"\[1, 3000\]"):
        ours(torch.zeros(2, 128, 3000), torch.tensor([0, 10]))
