"""Smoke test of bench/vision_encoder_bench.py: its functions on a tiny tower, one round,
checking that the equality checks the benchmark relies on pass (and can fail). No timing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from gpu_workers.models.qwen2_5_vl_vision import VisionEncoderConfig
from gpu_workers.preprocess.image import ImageProcessingConfig, ImageProcessor

ROOT = Path(__file__).resolve().parents[2]
TOL = 1e-4


def _load_bench():
    spec = importlib.util.spec_from_file_location("vision_encoder_bench", ROOT / "bench" / "vision_encoder_bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


vb = _load_bench()

# window 56 px = 2 merged tokens a side, as in tests/gpu_workers/models/test_qwen2_5_vl_vision.py
TINY = VisionEncoderConfig(
    depth=2, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=48,
    fullatt_block_indexes=(1,), window_size=56,
)  # fmt: skip


@pytest.fixture(scope="module")
def model():
    return vb.make_encoder(TINY, seed=0, device=torch.device("cpu"), dtype=torch.float32)


def inputs(sizes: str, seed: int):
    return vb.make_inputs(vb.parse_sizes(sizes), seed, ImageProcessor(ImageProcessingConfig()), torch.device("cpu"))


def test_patch_embed_variants_match(model) -> None:
    [(pixels, grid)] = inputs("84x56", seed=1)
    result = vb.bench_patch_embed(model, pixels, grid, warmup=0, repeats=1, tol=TOL, sync=lambda: None)
    assert result["patches"] == result["conv3d_calls_per_patch_loop"] == 6 * 4
    assert all(d <= TOL for d in result["max_abs_diff"].values())
    assert result["output_abs_max"]["forward"] > 0.1  # a live signal
    assert set(result["embed"]) == {"linear", "conv3d_per_patch", "conv3d_one_call"}
    assert set(result["forward"]) == {"linear", "conv3d_per_patch"}
    assert len(result["forward"]["linear"]["times_s"]) == 1


def test_packed_matches_separate(model) -> None:
    images = inputs("56x56,84x56,56x112,112x84", seed=2)
    result = vb.bench_packing(model, images, warmup=0, repeats=1, tol=TOL, sync=lambda: None)
    assert result["grid_thw"] == [[1, 4, 4], [1, 4, 6], [1, 8, 4], [1, 6, 8]]
    assert result["output_tokens"] == (16 + 24 + 32 + 48) // 4
    assert result["max_abs_diff_packed_vs_separate"] <= TOL
    assert result["output_abs_max"] > 0.1


def test_equality_check_fails_on_different_work(model) -> None:
    [(pixels, _)] = inputs("56x56", seed=3)
    conv = vb.Conv3dPatchEmbed(model.patch_embed, TINY, per_patch=True)
    with torch.no_grad():
        conv.proj.weight[0, 0, 0, 0, 0] += 1.0
    with torch.inference_mode(), pytest.raises(AssertionError, match="exceeds"):
        vb.check_equal("perturbed", conv(pixels), model.patch_embed(pixels), TOL)


def test_reference_config_full_attention_blocks() -> None:
    assert vb.reference_config(32).fullatt_block_indexes == (7, 15, 23, 31)
    assert vb.reference_config(2).fullatt_block_indexes == (1,)
    c = vb.reference_config(2)
    assert (c.hidden_size, c.num_heads, c.intermediate_size, c.out_hidden_size) == (1280, 16, 3456, 5120)
