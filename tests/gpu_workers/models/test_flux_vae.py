"""The VAE decoder against diffusers' AutoencoderKL, and the image bytes against VaeImageProcessor."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL
from diffusers.image_processor import VaeImageProcessor
from PIL import Image

from gpu_workers.models.flux_vae import FluxVAEConfig, FluxVAEDecoder, to_image_bytes, to_png, to_uint8

# black-forest-labs/FLUX.1-dev vae/config.json (as diffusers writes it)
FLUX_VAE: dict[str, Any] = {
    "_class_name": "AutoencoderKL",
    "_diffusers_version": "0.30.0.dev0",
    "act_fn": "silu",
    "block_out_channels": [128, 256, 512, 512],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "force_upcast": True,
    "in_channels": 3,
    "latent_channels": 16,
    "latents_mean": None,
    "latents_std": None,
    "layers_per_block": 2,
    "mid_block_add_attention": True,
    "norm_num_groups": 32,
    "out_channels": 3,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "use_post_quant_conv": False,
    "use_quant_conv": False,
}
# tiny shapes of the same family: width changes (1x1 shortcuts) in the second; a post-quant
# conv (as SD VAEs have) and no mid attention in the third
TINY: dict[str, dict[str, Any]] = {
    "flat": {"block_out_channels": [32, 32], "norm_num_groups": 8, "layers_per_block": 1},
    "widening": {"block_out_channels": [16, 32, 32], "norm_num_groups": 16, "layers_per_block": 2},
    "post_quant": {
        "block_out_channels": [16, 32],
        "norm_num_groups": 8,
        "layers_per_block": 1,
        "use_post_quant_conv": True,
        "mid_block_add_attention": False,
    },
}


def _diffusers_config(**overrides: Any) -> dict[str, Any]:
    cfg = {**FLUX_VAE, **overrides}
    n = len(cfg["block_out_channels"])
    cfg["down_block_types"], cfg["up_block_types"] = ["DownEncoderBlock2D"] * n, ["UpDecoderBlock2D"] * n
    return {k: v for k, v in cfg.items() if not k.startswith("_")}


def _random_diffusers_vae(**overrides: Any) -> Any:  # Any: diffusers' decorators hide its attributes
    torch.manual_seed(0)
    vae: Any = AutoencoderKL(**_diffusers_config(**overrides))
    vae.eval()
    with torch.no_grad():
        for p in vae.parameters():  # norms away from (1, 0), every bias non-zero
            p.add_(0.05 * torch.randn_like(p))
    return vae


def _ours_from(vae: Any) -> FluxVAEDecoder:
    ours = FluxVAEDecoder(FluxVAEConfig.from_diffusers(dict(vae.config))).eval()
    ours.load_diffusers_state_dict(vae.state_dict())  # encoder.* and quant_conv.* included
    return ours


@pytest.mark.parametrize("name", list(TINY))
def test_decode_matches_diffusers(name: str) -> None:
    vae = _random_diffusers_vae(**TINY[name])
    ours = _ours_from(vae)
    latents = torch.randn(2, 16, 6, 5)  # not square: rows and columns cannot swap unnoticed
    with torch.no_grad():
        c = vae.config
        # the reference's (and FluxPipeline's) order: un-scale, then AutoencoderKL.decode
        want = vae.decode(latents / c.scaling_factor + c.shift_factor).sample
        got = ours.decode(latents)
    up = ours.config.upscale
    assert got.shape == want.shape == (2, 3, 6 * up, 5 * up)
    diff = (got - want).abs().max().item()
    assert diff < 1e-4, diff


def test_flux_config_and_weight_names_are_diffusers() -> None:
    config = FluxVAEConfig.from_diffusers(FLUX_VAE)
    assert config == FluxVAEConfig()
    assert config.upscale == 8
    with torch.device("meta"):
        vae: Any = AutoencoderKL(**_diffusers_config())
        ours = FluxVAEDecoder(config)
    theirs = {k: tuple(v.shape) for k, v in vae.state_dict().items() if k.startswith("decoder.")}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == theirs
    assert "decoder.mid_block.attentions.0.to_out.0.weight" in theirs
    assert not any(k.startswith(("quant_conv", "post_quant_conv")) for k in vae.state_dict())


@pytest.mark.parametrize("filename", ["diffusion_pytorch_model.safetensors", "model.safetensors"])
def test_from_dir_reads_a_saved_diffusers_vae(tmp_path: Path, filename: str) -> None:
    vae = _random_diffusers_vae(**TINY["widening"])
    vae.save_pretrained(tmp_path, safe_serialization=True)
    saved = tmp_path / "diffusion_pytorch_model.safetensors"
    assert saved.is_file()
    saved.rename(tmp_path / filename)
    ours = FluxVAEDecoder.from_dir(tmp_path)
    latents = torch.randn(1, 16, 4, 4)
    with torch.no_grad():
        want = vae.decode(latents / 0.3611 + 0.1159).sample
        got = ours.decode(latents)
    assert (got - want).abs().max().item() < 1e-4
    bf16 = FluxVAEDecoder.from_dir(tmp_path, dtype=torch.bfloat16)
    assert bf16.decoder.conv_in.weight.dtype == torch.bfloat16
    with torch.no_grad():
        assert bf16.decode(latents).dtype == torch.bfloat16


def test_from_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no config.json"):
        FluxVAEDecoder.from_dir(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ValueError, match="diffusion_pytorch_model.safetensors nor model.safetensors"):
        FluxVAEDecoder.from_dir(tmp_path)


def test_loading_checks_every_weight() -> None:
    vae = _random_diffusers_vae(**TINY["flat"])
    ours = FluxVAEDecoder(FluxVAEConfig.from_diffusers(dict(vae.config)))
    weights = vae.state_dict()
    ours.load_diffusers_state_dict({f"vae.{k}": v for k, v in weights.items()})  # a whole pipeline's names
    missing = {k: v for k, v in weights.items() if k != "decoder.conv_out.bias"}
    with pytest.raises(ValueError, match="missing.*decoder.conv_out.bias"):
        ours.load_diffusers_state_dict(missing)
    # an SD-style post-quant conv in the file while the config says Flux: a wrong checkpoint
    extra = {**weights, "post_quant_conv.weight": torch.zeros(16, 16, 1, 1), "post_quant_conv.bias": torch.zeros(16)}
    with pytest.raises(ValueError, match="unexpected.*post_quant_conv"):
        ours.load_diffusers_state_dict(extra)
    wrong = {**weights, "decoder.conv_in.weight": torch.zeros(32, 4, 3, 3)}
    with pytest.raises(ValueError, match="decoder.conv_in.weight: shape"):
        ours.load_diffusers_state_dict(wrong)


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"_class_name": "AutoencoderKLQwenImage"}, "_class_name"),
        ({"act_fn": "gelu"}, "act_fn"),
        ({"norm_num_groups": 24}, "divisible"),
        ({"block_out_channels": []}, "block_out_channels"),
        ({"latent_channels": 0}, "latent_channels"),
        ({"up_block_types": ["AttnUpDecoderBlock2D"] * 4}, "up_block_types"),
        ({"scaling_factor": 0}, "scaling_factor"),
        ({"shift_factor": "0.1"}, "shift_factor"),
    ],
)
def test_config_errors(overrides: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        FluxVAEConfig.from_diffusers({**FLUX_VAE, **overrides})


def test_config_defaults_are_diffusers_for_missing_keys() -> None:
    # diffusers always writes every key; a hand-written file means what diffusers would read
    config = FluxVAEConfig.from_diffusers({"latent_channels": 16, "block_out_channels": [32, 32]})
    assert (config.layers_per_block, config.use_post_quant_conv, config.scaling_factor) == (1, True, 0.18215)
    assert config.shift_factor == 0.0


def _test_image() -> torch.Tensor:
    torch.manual_seed(3)
    image = torch.randn(3, 12, 10) * 0.8  # some values outside [-1, 1]
    # levels k + 0.7: rounded up, where a truncating cast (the reference's astype) gives k
    image[0, 0, :6] = torch.tensor([k + 0.7 for k in range(6)]) / 255 * 2 - 1
    image[1, 0, :2] = torch.tensor([-1.0, 1.0])
    return image


def test_uint8_is_the_references_postprocess_to_the_pixel() -> None:
    """The reference's pipeline.postprocess, written here in numpy: clamp, (x + 1) / 2, * 255,
    astype(uint8), a truncation. diffusers' VaeImageProcessor rounds instead: at most one
    level apart, and the levels k + 0.7 are where they part."""
    image = _test_image()
    x = image.clamp(-1, 1)
    want = (((x + 1) / 2).permute(1, 2, 0).numpy() * 255).astype(np.uint8)
    got = to_uint8(image)
    assert got.dtype == np.uint8 and got.shape == (12, 10, 3)
    assert np.array_equal(got, want)
    assert got[0, :6, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert got[0, 0, 1] == 0 and got[0, 1, 1] == 255
    rounded = np.asarray(VaeImageProcessor().postprocess(image[None], output_type="pil")[0])
    assert rounded[0, :6, 0].tolist() == [1, 2, 3, 4, 5, 6]
    assert np.abs(rounded.astype(int) - got.astype(int)).max() == 1


def test_uint8_nan_and_shape() -> None:
    image = torch.zeros(3, 2, 2)
    image[0, 0, 0] = float("nan")
    assert to_uint8(image)[0, 0, 0] == 127  # 0 -> mid grey, 0.5 * 255 = 127.5 truncated
    with pytest.raises(ValueError, match="want \\(3, H, W\\)"):
        to_uint8(torch.zeros(1, 3, 2, 2))


def test_png_is_lossless_and_deterministic() -> None:
    image = _test_image()
    data = to_png(image)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data == to_png(image.clone())
    decoded = Image.open(io.BytesIO(data))
    assert decoded.mode == "RGB" and decoded.size == (10, 12)  # PIL size is (width, height)
    assert np.array_equal(np.asarray(decoded), to_uint8(image))


@pytest.mark.parametrize(("fmt", "pil_format"), [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")])
def test_image_formats(fmt: str, pil_format: str) -> None:
    image = _test_image()
    data = to_image_bytes(image, fmt)
    assert data == to_image_bytes(image, fmt)
    decoded = Image.open(io.BytesIO(data))
    assert decoded.format == pil_format and decoded.size == (10, 12)


def test_image_format_errors() -> None:
    with pytest.raises(ValueError, match="gif"):
        to_image_bytes(_test_image(), "gif")
    with pytest.raises(ValueError, match="quality"):
        to_image_bytes(_test_image(), "jpeg", quality=0)


def test_decode_matches_diffusers_at_the_flux_vae_size() -> None:
    # the real widths and depth (a 4 x 4 latent keeps it quick): what acceptance asks for
    vae = _random_diffusers_vae()
    ours = _ours_from(vae)
    latents = torch.randn(1, 16, 4, 3)
    with torch.no_grad():
        want = vae.decode(latents / 0.3611 + 0.1159).sample
        got = ours.decode(latents)
    assert got.shape == (1, 3, 32, 24)
    diff = (got - want).abs().max().item()
    assert diff < 1e-4, diff
