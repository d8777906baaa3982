"""The TA-Tok tokenizer's codes against a brute-force nearest-code search, on tiny random weights
and small random images (its SigLIP tower: test_siglip_vision.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import load_file
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

from gpu_workers.models.ta_tok import TATokConfig, TATokImageTokenizer, make_tiny_image_tokenizer


def random_pixels(batch: int, size: int, seed: int) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def random_image(width: int, height: int, mode: str, seed: int) -> Image.Image:
    data = np.random.default_rng(seed).integers(0, 256, (height, width, len(mode)), dtype=np.uint8)
    return Image.fromarray(data if len(mode) > 1 else data[..., 0], mode=mode)


def test_a_feature_layer_past_the_tower_is_refused() -> None:
    so400m: dict[str, Any] = {"hidden_size": 1152, "image_size": 384, "intermediate_size": 4304,
                              "num_attention_heads": 16, "num_hidden_layers": 27, "patch_size": 14}  # fmt: skip
    with pytest.raises(ValueError, match="feature_layer"):
        TATokConfig.from_hf({"vision_config": so400m, "bottleneck_dim": 4, "codebook_size": 8,
                             "feature_layer": -29})  # fmt: skip


# ---------------------------------------------------------------------------------------------
# The tokenizer


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_image_tokenizer(tmp_path_factory.mktemp("ta-tok"))


@pytest.fixture(scope="module")
def tokenizer(tiny_dir: Path) -> TATokImageTokenizer:
    return TATokImageTokenizer.from_dir(tiny_dir)


def test_codes_equal_brute_force_nearest_code(tokenizer: TATokImageTokenizer) -> None:
    pixels = random_pixels(2, 112, seed=3)
    with torch.inference_mode():
        codes = tokenizer(pixels)
        hidden = tokenizer.vision_model(pixels).double().numpy()  # (2, 64, 32)
    w, b = (p.detach().double().numpy() for p in (tokenizer.bottleneck.weight, tokenizer.bottleneck.bias))
    z = hidden @ w.T + b
    z /= np.linalg.norm(z, axis=-1, keepdims=True)
    book = tokenizer.codebook.weight.detach().double().numpy()
    book /= np.linalg.norm(book, axis=-1, keepdims=True)
    cos = z @ book.T  # (2, 64, 64)
    want = cos.argmax(-1)
    # the check means something only when the winner is not a float32 near-tie
    top2 = np.sort(cos, axis=-1)[..., -2:]
    assert (top2[..., 1] - top2[..., 0]).min() > 1e-5
    assert codes.dtype == torch.int64
    assert codes.numpy().tolist() == want.tolist()


def test_ties_go_to_the_lowest_index(tiny_dir: Path) -> None:
    model = TATokImageTokenizer.from_dir(tiny_dir)
    pixels = random_pixels(1, 112, seed=4)
    with torch.inference_mode():
        before = model(pixels)[0]
        winner = int(before.max())
        assert winner > 10
        # row 3 becomes an exact copy of the winner, row 7 the same direction at twice the length
        model.codebook.weight[3] = model.codebook.weight[winner]
        model.codebook.weight[7] = 2 * model.codebook.weight[winner]
        after = model(pixels)[0]
    assert (after[before == winner] == 3).all()


def test_batch_equals_one_at_a_time(tokenizer: TATokImageTokenizer) -> None:
    images = [random_image(130, 90, "RGB", 5), random_image(112, 112, "RGBA", 6), random_image(40, 300, "L", 7)]
    with torch.inference_mode():
        batched = tokenizer(tokenizer.preprocess(images))
        single = torch.cat([tokenizer(tokenizer.preprocess([image])) for image in images])
    assert batched.shape == (3, 64)
    assert torch.equal(batched, single)


def test_preprocess_matches_transformers(tokenizer: TATokImageTokenizer) -> None:
    images = [random_image(130, 90, "RGB", 8), random_image(112, 112, "RGB", 9), random_image(57, 200, "RGBA", 10)]
    hf = SiglipImageProcessorPil(size={"height": 112, "width": 112})
    want = hf(images=images, return_tensors="np")["pixel_values"]
    got = tokenizer.preprocess(images).numpy()
    assert got.shape == want.shape == (3, 3, 112, 112)
    assert np.abs(got - want).max() < 1e-5


def test_tiny_checkpoint(tmp_path: Path, tiny_dir: Path, tokenizer: TATokImageTokenizer) -> None:
    again = make_tiny_image_tokenizer(tmp_path / "again")
    for name in ("config.json", "model.safetensors"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes()
    assert (make_tiny_image_tokenizer(tmp_path / "other", seed=1) / "model.safetensors").read_bytes() != (
        tiny_dir / "model.safetensors"
    ).read_bytes()

    assert tokenizer.num_codes == 64
    assert len(tokenizer.vision_model.encoder.layers) == 2  # of 3: feature_layer -2
    images = [random_image(100, 80, "RGB", 11), random_image(64, 128, "RGB", 12)]
    with torch.inference_mode():
        codes = tokenizer(tokenizer.preprocess(images))
    assert codes.shape == (2, 64)
    assert 0 <= int(codes.min()) and int(codes.max()) < 64
    assert not torch.equal(codes[0], codes[1])
    assert all(len(set(row.tolist())) > 8 for row in codes)  # not a handful of codes everywhere


def test_bf16_tower_keeps_a_float32_codebook(tiny_dir: Path) -> None:
    model = TATokImageTokenizer.from_dir(tiny_dir, dtype=torch.bfloat16)
    assert model.bottleneck.weight.dtype == torch.bfloat16
    assert model.codebook.weight.dtype == torch.float32
    with torch.inference_mode():
        assert model.features(random_pixels(1, 112, seed=13)).dtype == torch.float32


def test_reference_geometry_gives_729_codes() -> None:
    vision = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
              "image_size": 384, "patch_size": 14}  # fmt: skip
    config = TATokConfig.from_hf({"vision_config": vision, "bottleneck_dim": 8, "codebook_size": 32})
    model = TATokImageTokenizer(config).eval()
    assert len(model.vision_model.encoder.layers) == 1
    pixels = model.preprocess([random_image(500, 300, "RGB", 14)])
    assert pixels.shape == (1, 3, 384, 384)
    with torch.inference_mode():
        codes = model(pixels)
    assert model.num_codes == 729
    assert codes.shape == (1, 729)
    with pytest.raises(ValueError, match="pixel_values"):
        model(torch.zeros(1, 3, 378, 378))


def test_encode_task_layer_runs_before_the_bottleneck(tmp_path: Path) -> None:
    base = make_tiny_image_tokenizer(tmp_path / "base")
    raw = json.loads((base / "config.json").read_text()) | {"encode_task_layer": True}
    config = TATokConfig.from_hf(raw)
    model = TATokImageTokenizer(config).eval()
    tensors = load_file(str(base / "model.safetensors"))
    h = config.vision.hidden_size
    gen = torch.Generator().manual_seed(7)
    tensors["encode_task_layer.0.weight"] = 0.3 * torch.randn(h, h, generator=gen)
    tensors["encode_task_layer.0.bias"] = 0.1 * torch.randn(h, generator=gen)
    model.load_hf_state_dict(tensors)
    x = torch.randn(2, 3, 112, 112, generator=gen)
    with torch.inference_mode():
        tower = model.vision_model(x)
        task = torch.tanh(tower @ tensors["encode_task_layer.0.weight"].T + tensors["encode_task_layer.0.bias"])
        want = torch.nn.functional.normalize(model.bottleneck(task), dim=-1)
        assert torch.allclose(model.features(x), want, atol=1e-6)
    with pytest.raises(ValueError, match="missing"):
        TATokImageTokenizer(config).load_hf_state_dict(load_file(str(base / "model.safetensors")))
