"""The Qwen2.5-VL vision encoder against transformers, on tiny random weights and small random
images (its preprocessing: tests/gpu_workers/preprocess/test_image.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from transformers.models.qwen2_5_vl.configuration_qwen2_5_vl import Qwen2_5_VLVisionConfig
from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VisionTransformerPretrainedModel

from gpu_workers.models.qwen2_5_vl_vision import (
    Qwen2_5_VisionEncoder,
    VisionEncoderConfig,
    packed_layout,
)

# window 56 px = 2 merged tokens a side, so the grids below have ragged edge windows
HF_VISION: dict[str, Any] = {
    "depth": 4,
    "hidden_size": 64,
    "num_heads": 4,
    "intermediate_size": 128,
    "out_hidden_size": 48,
    "fullatt_block_indexes": [1, 3],
    "window_size": 56,
    "patch_size": 14,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "in_channels": 3,
    "hidden_act": "silu",
}
PATCH_DIM = 3 * 2 * 14 * 14


@pytest.fixture(scope="module")
def hf_model() -> Qwen2_5_VisionTransformerPretrainedModel:
    torch.manual_seed(0)
    config = Qwen2_5_VLVisionConfig(**HF_VISION)
    config._attn_implementation = "sdpa"
    model = Qwen2_5_VisionTransformerPretrainedModel(config).eval()
    # The default init (std 0.02, unit norms) barely moves activations; make every weight count.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm1.weight") or name.endswith("norm2.weight") or "ln_q" in name:
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
            else:
                p.copy_(0.15 * torch.randn_like(p))
    return model


@pytest.fixture(scope="module")
def ours(hf_model: Qwen2_5_VisionTransformerPretrainedModel) -> Qwen2_5_VisionEncoder:
    model = Qwen2_5_VisionEncoder(VisionEncoderConfig.from_hf(HF_VISION)).eval()
    # as a full checkpoint names them (transformers 5.x)
    model.load_hf_state_dict({f"model.visual.{k}": v for k, v in hf_model.state_dict().items()})
    return model


def random_pixels(grid: list[list[int]], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    n = sum(t * h * w for t, h, w in grid)
    return torch.randn(n, PATCH_DIM, generator=g), torch.tensor(grid)


@pytest.mark.parametrize(
    "grid",
    [
        [[1, 10, 6], [1, 4, 8]],  # two still images of different sizes
        [[2, 6, 4], [1, 2, 2]],  # a two-frame-group video and a one-token image
    ],
)
def test_matches_transformers_packed(
    hf_model: Qwen2_5_VisionTransformerPretrainedModel, ours: Qwen2_5_VisionEncoder, grid: list[list[int]]
) -> None:
    pixels, grid_thw = random_pixels(grid, seed=1)
    with torch.inference_mode():
        want = hf_model(pixels, grid_thw).pooler_output
        got = ours(pixels, grid_thw)
    assert got.shape == (sum(Qwen2_5_VisionEncoder.num_output_tokens(grid, 2)), 48)
    assert want.abs().mean() > 0.1  # a live signal, not a vanishing one
    assert (got - want).abs().max().item() < 1e-4


def test_packed_batch_equals_separate_forwards(ours: Qwen2_5_VisionEncoder) -> None:
    grid = [[1, 10, 6], [1, 4, 8], [1, 6, 6]]
    pixels, grid_thw = random_pixels(grid, seed=2)
    with torch.inference_mode():
        packed = ours(pixels, grid_thw)
        separate = torch.cat(
            [ours(chunk, torch.tensor([g])) for chunk, g in zip(pixels.split([t * h * w for t, h, w in grid]), grid)]
        )
    assert (packed - separate).abs().max().item() < 1e-5


def test_patch_embed_equals_conv3d_per_patch(
    hf_model: Qwen2_5_VisionTransformerPretrainedModel, ours: Qwen2_5_VisionEncoder
) -> None:
    pixels, _ = random_pixels([[1, 4, 6]], seed=3)
    conv = hf_model.patch_embed.proj  # Conv3d, kernel == stride
    with torch.inference_mode():
        want = torch.stack([conv(p.view(1, 3, 2, 14, 14)).flatten() for p in pixels])
        got = ours.patch_embed(pixels)
    # sums of 1176 products of size ~10: float32 rounding differs by summation order only
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_window_layout() -> None:
    # merged grid 5x3, windows of 2x2 merged tokens: rows (0-1, 2-3, 4) x cols (0-1, 2)
    config = VisionEncoderConfig.from_hf(HF_VISION)
    layout = packed_layout([[1, 10, 6], [1, 2, 2]], config)
    assert layout.window_seqlens == [16, 8, 16, 8, 8, 4, 4]
    assert layout.frame_seqlens == [60, 4]
    # the first window holds merged tokens 0, 1, 3, 4 (each 4 patch rows), row-major
    assert layout.order[:16].tolist() == [*range(0, 8), *range(12, 20)]
    assert sorted(layout.order.tolist()) == list(range(64))


def test_projector_and_loader_errors(hf_model: Qwen2_5_VisionTransformerPretrainedModel) -> None:
    model = Qwen2_5_VisionEncoder(VisionEncoderConfig.from_hf({**HF_VISION, "projector_hidden_size": 32}))
    with pytest.raises(ValueError, match="missing.*projector.weight"):
        model.load_hf_state_dict(hf_model.state_dict())
    weights = {f"visual.{k}": v for k, v in hf_model.state_dict().items()}
    weights |= {"projector.weight": torch.zeros(32, 48), "projector.bias": torch.ones(32)}
    weights["model.language_model.embed_tokens.weight"] = torch.zeros(3, 3)  # other towers are skipped
    model.load_hf_state_dict(weights)
    pixels, grid_thw = random_pixels([[1, 4, 4]], seed=4)
    with torch.inference_mode():
        assert torch.equal(model(pixels, grid_thw), torch.ones(4, 32))
    with pytest.raises(ValueError, match="fullatt_block_indexes"):
        VisionEncoderConfig.from_hf({**HF_VISION, "fullatt_block_indexes": [4]})
