"""The vision decoder on the published layout (a tiny decoder/vision/ folder): it draws an
image; the tokens it feeds the DiT, their positions and timesteps are the reference
pipeline's, re-implemented here with the reference's own einops patterns and diffusers' own
scheduler; autoguidance runs transformer2 at 0.75 unless a job says otherwise; and the
velocity is unpacked back to the latent as the reference unpacks it."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from diffusers import FlowMatchEulerDiscreteScheduler
from einops import rearrange, repeat
from PIL import Image

from gpu_workers.models.flow_match import initial_noise
from gpu_workers.models.flux_dit import FluxDiT
from gpu_workers.tiny.published_vision_decoder import make_tiny_published_vision_decoder
from gpu_workers.vision_decoder.decoder import VisionDecoder
from omni.shared import protocol

SIZE = (128, 96)  # width x height: a 12 x 16 latent; 6 x 8 tokens with use_patchify
CODES = [(7 * i + 3) % 64 for i in range(64)]
CODEBOOK = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))


def make(path: Path, use_patchify: bool) -> Path:
    return make_tiny_published_vision_decoder(
        path, seed=2, codebook=CODEBOOK, code_grid=(8, 8), use_patchify=use_patchify
    )


def job(**fields: Any) -> protocol.ImageJob:
    values: dict[str, Any] = {"codes": CODES, "width": SIZE[0], "height": SIZE[1], "steps": 3, "seed": 5} | fields
    return protocol.ImageJob(1, **values)


class Recorder:
    """Wraps a FluxDiT's forward: records each call's inputs and output."""

    def __init__(self, model: FluxDiT) -> None:
        self.calls: list[dict[str, torch.Tensor]] = []
        forward = model.forward

        def recording(
            x: torch.Tensor, positions: torch.Tensor, timestep: torch.Tensor, vec: torch.Tensor, **kw: Any
        ) -> torch.Tensor:
            out = forward(x, positions, timestep, vec, **kw)
            self.calls.append(
                {"x": x.clone(), "positions": positions, "timestep": timestep, "vec": vec, "out": out.clone()}
            )
            return out

        model.forward = recording  # type: ignore[method-assign,assignment]


def reference_inputs(root: Path, use_patchify: bool, seed: int, steps: int) -> dict[str, Any]:
    """What the reference's pipeline __call__ builds, written from it: the tokens of step 0,
    img_ids, the per-step DiT time input, vec."""
    h, w = SIZE[1] // 8, SIZE[0] // 8
    latents = initial_noise((1, 16, h, w), seed)[0][None]  # our noise (its RNG is not reproducible)
    img_h, img_w = (h // 2, w // 2) if use_patchify else (h, w)
    hidden = CODEBOOK[torch.tensor([CODES])]  # token_embedder: vocab_embeddings[tokens]
    pooler = hidden.mean(dim=1)
    spatial = rearrange(hidden, "b (h w) c -> b c h w", h=8, w=8)
    spatial = F.interpolate(spatial, size=(img_h, img_w), mode="bilinear")
    spatial = rearrange(spatial, "b d h w -> b (h w) d")
    if use_patchify:
        x_t = rearrange(latents, "b c (h ph) (w pw) -> b (h w) (c ph pw)", ph=2, pw=2)
    else:
        x_t = rearrange(latents, "b c h w -> b (h w) c")
    ids = torch.zeros(img_h, img_w, 3)
    ids[..., 1] = ids[..., 1] + torch.arange(img_h)[:, None]
    ids[..., 2] = ids[..., 2] + torch.arange(img_w)[None, :]
    scheduler = FlowMatchEulerDiscreteScheduler.from_pretrained(root / "scheduler")
    scheduler.set_timesteps(steps)
    times = []
    for t in scheduler.timesteps:
        sigma = torch.full((1,), t.item(), dtype=torch.long).float() / scheduler.config.num_train_timesteps
        times.append(1000.0 * sigma)  # timestep_embedding's time_factor
    return {
        "latents": latents,
        "x": torch.cat((x_t, spatial), dim=2),
        "ids": repeat(ids, "h w c -> b (h w) c", b=1)[0],
        "times": times,
        "vec": pooler,
        "sigmas": scheduler.sigmas,
        "hw": (h, w),
    }


def unpack(pred: torch.Tensor, use_patchify: bool, hw: tuple[int, int]) -> torch.Tensor:
    h, w = hw
    if use_patchify:
        return rearrange(pred, "b (h w) (c ph pw) -> b c (h ph) (w pw)", h=h // 2, w=w // 2, ph=2, pw=2)
    return rearrange(pred, "b (h w) c -> b c h w", h=h, w=w)


@pytest.mark.parametrize("use_patchify", [True, False])
def test_the_dit_sees_the_references_inputs_and_autoguidance_at_0_75(tmp_path: Path, use_patchify: bool) -> None:
    root = make(tmp_path / "vision", use_patchify)
    decoder = VisionDecoder.from_dir(root)
    assert (decoder.config.guidance, decoder.config.guidance_scale, decoder.config.code_grid) == (
        "autoguidance",
        0.75,
        (8, 8),
    )
    weak = decoder.guidance.weak  # type: ignore[attr-defined]
    assert weak.config.num_layers == 1 and decoder.transformer.config.num_layers == 2  # transformer2 is the weak one
    strong, weaker = Recorder(decoder.transformer), Recorder(weak)

    steps = 3
    generation = decoder.decode([job(steps=steps)])  # guidance_scale None: the default
    ref = reference_inputs(root, use_patchify, seed=5, steps=steps)
    assert len(strong.calls) == len(weaker.calls) == steps

    first = strong.calls[0]
    torch.testing.assert_close(first["x"], ref["x"], rtol=0, atol=1e-6)  # the float32 resize's rounding at most
    assert torch.equal(first["positions"].float(), ref["ids"])
    torch.testing.assert_close(first["vec"], ref["vec"])
    for call, weak_call, want in zip(strong.calls, weaker.calls, ref["times"], strict=True):
        assert torch.equal(call["timestep"], want), (call["timestep"], want)
        assert torch.equal(weak_call["x"], call["x"]) and torch.equal(weak_call["timestep"], call["timestep"])

    # Euler over the reference's unpacked autoguided velocity, from our noise
    x = ref["latents"]
    for i, (call, weak_call) in enumerate(zip(strong.calls, weaker.calls, strict=True)):
        pred = call["out"] + 0.75 * (call["out"] - weak_call["out"])
        x = x + (ref["sigmas"][i + 1] - ref["sigmas"][i]) * unpack(pred, use_patchify, ref["hw"])
    assert generation.latents is not None
    torch.testing.assert_close(generation.latents, x, rtol=1e-5, atol=1e-5)

    image = Image.open(io.BytesIO(generation.images[0].data))
    assert image.size == SIZE and image.format == "PNG"


def test_scale_0_skips_transformer2_and_without_it_there_is_no_guidance(tmp_path: Path) -> None:
    root = make(tmp_path / "vision", True)
    decoder = VisionDecoder.from_dir(root)
    weaker = Recorder(decoder.guidance.weak)  # type: ignore[attr-defined]
    decoder.decode([job(guidance_scale=0.0)])
    assert weaker.calls == []

    # as diffusers saves a pipeline whose optional component is None
    index = json.loads((root / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "transformer2": [None, None]}))
    shutil.rmtree(root / "transformer2")
    alone = VisionDecoder.from_dir(root)
    assert (alone.config.guidance, alone.config.guidance_scale) == ("none", 0.0)
    assert alone.decode([job()]).images[0].error is None
