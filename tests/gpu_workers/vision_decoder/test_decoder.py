"""The vision decoder on tiny random checkpoints: loading the layout, seeded determinism,
batching (jobs together equal jobs alone; CFG's batched passes equal sequential ones),
previews, per-job errors, the encoded image; and the same drawing over 2 and 4 gloo ranks
(Ulysses) against one rank."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from gpu_workers.models.flux_vae import to_image_bytes
from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from gpu_workers.vision_decoder import decoder as vision_decoder
from gpu_workers.vision_decoder.decoder import Generation, Preview, VisionDecoder, VisionDecoderConfig, _preview_steps
from omni.shared import protocol
from tests.gpu_workers.vision_decoder.cases import GUIDANCES

# 128 x 128 pixels: a 16 x 16 latent, 8 x 8 = 64 tokens (patch 2)
SIZE = 128
CODES = [(5 * i + 1) % 64 for i in range(64)]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vision_decoder")
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    return {g: make_tiny_vision_decoder(root / g, seed=1, codebook=codebook, guidance=g) for g in GUIDANCES}


@pytest.fixture(scope="module")
def decoders(checkpoints: dict[str, Path]) -> dict[str, VisionDecoder]:
    return {g: VisionDecoder.from_dir(path) for g, path in checkpoints.items()}


def job(job_id: int = 1, **fields: Any) -> protocol.ImageJob:
    values: dict[str, Any] = {"codes": CODES, "width": SIZE, "height": SIZE, "steps": 3, "seed": 0} | fields
    return protocol.ImageJob(job_id, **values)


def pixels(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def test_the_tiny_layout_loads(checkpoints: dict[str, Path], decoders: dict[str, VisionDecoder]) -> None:
    auto = decoders["autoguidance"]
    assert auto.config == VisionDecoderConfig((8, 8), "autoguidance", 0.75)
    assert auto.num_codes == 64 and auto.is_leader
    assert auto.transformer.config.patch == 2 and auto.vae_config.upscale == 8
    files = sorted(str(p.relative_to(checkpoints["autoguidance"])) for p in checkpoints["autoguidance"].rglob("*"))
    assert files == [
        "codebook.safetensors", "config.json",
        "scheduler", "scheduler/scheduler_config.json",
        "transformer", "transformer/config.json", "transformer/model.safetensors",
        "vae", "vae/config.json", "vae/diffusion_pytorch_model.safetensors",
        "weak_transformer", "weak_transformer/config.json", "weak_transformer/model.safetensors",
    ]  # fmt: skip
    cfg_dir = checkpoints["cfg"]
    assert (cfg_dir / "uncond.safetensors").is_file() and not (cfg_dir / "weak_transformer").exists()
    assert decoders["cfg"].config.guidance == "cfg"


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"model_type": "flux"}, "model_type"),
        ({"code_grid": [8, 4]}, "not square"),
        ({"code_grid": [8]}, "code_grid"),
        ({"guidance": "pag"}, "guidance"),
        ({"guidance_scale": -1}, "guidance_scale"),
    ],
)
def test_bad_configs_are_refused(change: dict[str, Any], match: str) -> None:
    raw = VisionDecoderConfig((8, 8), "cfg", 4.0).to_dict() | change
    with pytest.raises(ValueError, match=match):
        VisionDecoderConfig.from_dict(raw)


def test_cfg_without_its_uncond_embedding_is_refused(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "auto-as-cfg"
    make_tiny_vision_decoder(broken, codebook=torch.randn(64, 16), guidance="autoguidance")
    config = json.loads((broken / "config.json").read_text()) | {"guidance": "cfg"}
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="uncond.safetensors"):
        VisionDecoder.from_dir(broken)


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_a_seed_gives_the_same_bytes_and_another_seed_others(
    decoders: dict[str, VisionDecoder], guidance: str
) -> None:
    decoder = decoders[guidance]
    first = decoder.decode([job(seed=7)]).images[0]
    again = decoder.decode([job(seed=7)]).images[0]
    other = decoder.decode([job(seed=8)]).images[0]
    assert first.error is None and first.data == again.data
    a, b = pixels(first.data), pixels(other.data)
    assert a.std() > 10  # visibly varied, not flat
    assert np.abs(a.astype(int) - b.astype(int)).mean() > 5  # and another seed is another image


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_a_batch_equals_its_jobs_one_at_a_time(decoders: dict[str, VisionDecoder], guidance: str) -> None:
    decoder = decoders[guidance]
    jobs = [
        job(1, seed=1),
        job(2, seed=2, codes=CODES[::-1], guidance_scale=0.0),  # autoguidance alone skips the weak pass
        job(3, seed=3, guidance_scale=2.5),
    ]
    together = decoder.decode(jobs)
    assert together.latents is not None and together.latents.shape == (3, 16, SIZE // 8, SIZE // 8)
    for row, one in enumerate(jobs):
        alone = decoder.decode([one]).latents
        assert alone is not None
        assert (together.latents[row] - alone[0]).abs().max().item() < 1e-5
    assert together.step_seconds > 0 and together.vae_seconds > 0


def test_cfg_batched_equals_sequential(checkpoints: dict[str, Path], decoders: dict[str, VisionDecoder]) -> None:
    sequential = VisionDecoder.from_dir(checkpoints["cfg"], cfg_batched=False)
    jobs = [job(1, seed=4), job(2, seed=5, guidance_scale=7.0)]
    batched = decoders["cfg"].decode(jobs).latents
    one_by_one = sequential.decode(jobs).latents
    assert batched is not None and one_by_one is not None
    assert (batched - one_by_one).abs().max().item() < 1e-5


def test_previews_come_first_in_step_order(decoders: dict[str, VisionDecoder]) -> None:
    # 8 steps: 3 previews after steps 2, 4, 6; 1 preview after step 4
    jobs = [job(1, steps=8, partial_images=3), job(2, steps=8, partial_images=1)]
    events = list(decoders["autoguidance"].generate(jobs))
    previews = [(e.job_id, e.index) for e in events if isinstance(e, Preview)]
    assert previews == [(1, 0), (1, 1), (2, 0), (1, 2)]
    assert isinstance(events[-1], Generation) and len(events) == 5
    final = events[-1].images[0].data
    first = next(e for e in events if isinstance(e, Preview))
    assert pixels(first.data).shape == (SIZE, SIZE, 3) and first.data != final


@pytest.mark.parametrize(
    ("steps", "partial_images", "at"),
    [(25, 3, [6, 12, 18]), (8, 1, [4]), (5, 3, [1, 2, 3]), (4, 3, [1, 2]), (2, 3, [0]), (1, 2, [])],
)
def test_preview_steps(steps: int, partial_images: int, at: list[int]) -> None:
    got = _preview_steps([job(steps=steps, partial_images=partial_images)], steps)
    assert got == {step: [(0, index)] for index, step in enumerate(at)}


def test_a_bad_job_gets_its_error_and_spoils_no_other(decoders: dict[str, VisionDecoder]) -> None:
    decoder = decoders["autoguidance"]
    good = job(1, seed=9)
    jobs = [
        job(10, codes=CODES[:63]),
        good,
        job(11, codes=[*CODES[:63], 64]),
        job(12, output_format="gif"),
        job(13, partial_images=4),
        job(14, quality=101, output_format="jpeg"),
    ]
    result = decoder.decode(jobs)
    errors = {image.job_id: image.error for image in result.images}
    assert [image.job_id for image in result.images] == [10, 1, 11, 12, 13, 14]
    assert errors[1] is None
    assert errors[10] == "an image needs 8x8 = 64 codes, got 63"
    assert errors[11] == "image code 64 is outside the codebook [0, 64)"
    assert "gif" in str(errors[12]) and "partial_images" in str(errors[13]) and "quality" in str(errors[14])
    alone = decoder.decode([good])
    assert result.latents is not None and alone.latents is not None and result.latents.shape[0] == 1
    assert (result.latents - alone.latents).abs().max().item() < 1e-5
    # a size that is not a multiple of 16 is every job's error (a batch shares its size)
    sized = decoder.decode([job(1, width=120, height=120), job(2, width=120, height=120)])
    assert all(image.error and "multiples of 16" in image.error for image in sized.images)
    assert sized.latents is None
    with pytest.raises(ValueError, match="share width, height and steps"):
        decoder.decode([job(1), job(2, steps=4)])


def test_the_image_has_the_requested_size_and_format(decoders: dict[str, VisionDecoder]) -> None:
    decoder = decoders["autoguidance"]
    png = decoder.decode([job(width=1024, height=576, steps=2)]).images[0]
    assert (png.width, png.height) == (1024, 576)
    image = Image.open(io.BytesIO(png.data))
    assert image.format == "PNG" and image.size == (1024, 576)
    for fmt, pillow in [("jpeg", "JPEG"), ("webp", "WEBP")]:
        data = decoder.decode([job(output_format=fmt, quality=0)]).images[0].data
        assert Image.open(io.BytesIO(data)).format == pillow


# ---- Encoding off the worker thread (review C8) ------------------------------------------------


def serial_bytes(decoder: VisionDecoder, latent: torch.Tensor, one: protocol.ImageJob) -> bytes:
    """The path before C8, on the calling thread: the VAE, then the encoder."""
    assert decoder.vae is not None
    image = decoder.vae.decode(latent[None])[0]
    if one.quality is None:
        return to_image_bytes(image, one.output_format)
    return to_image_bytes(image, one.output_format, max(one.quality, 1))


@pytest.mark.parametrize("guidance", GUIDANCES)
def test_pooled_encoding_gives_the_bytes_of_the_serial_path(decoders: dict[str, VisionDecoder], guidance: str) -> None:
    decoder = decoders[guidance]
    jobs = [
        job(1, seed=1),
        job(2, seed=2, output_format="jpeg", quality=0),
        job(3, seed=3, output_format="webp", quality=80, guidance_scale=0.0),
        job(4, seed=4, output_format="jpeg"),
    ]
    result = decoder.decode(jobs)
    assert result.latents is not None
    for row, one in enumerate(jobs):
        assert result.images[row].data == serial_bytes(decoder, result.latents[row], one)


def test_an_image_is_encoded_on_the_pool_while_the_vae_decodes_the_next(
    decoders: dict[str, VisionDecoder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first image's encoder is held until the VAE has started on the second image: on
    the worker thread (the path before C8) that would never happen, and the wait times out."""
    decoder = decoders["autoguidance"]
    assert decoder.vae is not None
    second_decode = threading.Event()
    threads: list[str] = []
    decodes = 0
    vae_decode, encode = decoder.vae.decode, vision_decoder.to_image_bytes

    def counting_decode(latent: torch.Tensor) -> torch.Tensor:
        nonlocal decodes
        decodes += 1
        if decodes == 2:
            second_decode.set()
        return vae_decode(latent)

    def held_encode(image: torch.Tensor, fmt: str, *quality: int) -> bytes:
        threads.append(threading.current_thread().name)
        if len(threads) == 1:
            assert second_decode.wait(30), "the VAE waited for the first image's encoding"
        return encode(image, fmt, *quality)

    monkeypatch.setattr(decoder.vae, "decode", counting_decode)
    monkeypatch.setattr(vision_decoder, "to_image_bytes", held_encode)
    jobs = [job(1, seed=1), job(2, seed=2)]
    result = decoder.decode(jobs)
    monkeypatch.undo()
    assert len(threads) == 2 and all(name.startswith("image-encode") for name in threads)
    assert threading.current_thread().name not in threads
    assert result.latents is not None
    serial = [serial_bytes(decoder, result.latents[row], one) for row, one in enumerate(jobs)]
    assert [image.data for image in result.images] == serial


def test_denoising_goes_on_while_a_preview_is_encoded(
    decoders: dict[str, VisionDecoder], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A preview after step 4 of 8: its encoder is held until step 5 has run; the preview
    still comes before the result, with the bytes an unheld run gives."""
    decoder = decoders["autoguidance"]
    jobs = [job(1, steps=8, partial_images=1)]
    unheld = list(decoder.generate(jobs))
    step_five = threading.Event()
    steps = 0
    velocity, encode = decoder._velocity, vision_decoder.to_image_bytes

    def counting_velocity(*args: Any) -> torch.Tensor:
        nonlocal steps
        steps += 1
        if steps == 6:  # 0-based step 5
            step_five.set()
        return velocity(*args)

    def held_encode(image: torch.Tensor, fmt: str, *quality: int) -> bytes:
        if not step_five.is_set():  # the preview's (the final image's comes after step 7)
            assert step_five.wait(30), "step 5 waited for the preview's encoding"
        return encode(image, fmt, *quality)

    monkeypatch.setattr(decoder, "_velocity", counting_velocity)
    monkeypatch.setattr(vision_decoder, "to_image_bytes", held_encode)
    held = list(decoder.generate(jobs))
    monkeypatch.undo()
    assert [type(e) for e in held] == [Preview, Generation]
    assert isinstance(held[0], Preview) and isinstance(unheld[0], Preview) and held[0] == unheld[0]
    assert isinstance(held[1], Generation) and isinstance(unheld[1], Generation)
    assert held[1].images == unheld[1].images


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_cuda_no_step_synchronizes(checkpoints: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps are timed by CUDA events, read once a batch: torch.cuda.synchronize is never called."""
    decoder = VisionDecoder.from_dir(checkpoints["autoguidance"], device="cuda:0")
    calls = 0

    def counting(*args: Any) -> None:
        nonlocal calls
        calls += 1

    monkeypatch.setattr(torch.cuda, "synchronize", counting)
    result = decoder.decode([job(1, steps=4), job(2, guidance_scale=0.0, steps=4)])
    assert calls == 0 and result.step_seconds > 0 and result.images[0].data
    decoder.close()


# ---- Ulysses: 2 and 4 gloo ranks against 1 ------------------------------------------------------


@pytest.mark.parametrize("guidance", GUIDANCES)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ulysses_ranks_draw_what_one_rank_draws(
    by_ranks: dict[int | str, dict[str, dict[str, Any]]], world_size: int, guidance: str
) -> None:
    one, group = by_ranks[1][guidance], by_ranks[world_size][guidance]
    assert group["latents"].shape == one["latents"].shape == (2, 16, 10, 18)
    assert (group["latents"] - one["latents"]).abs().max().item() < 1e-5
    assert len(group["previews"]) == len(one["previews"]) == 1
    assert len(group["images"]) == 2 and all(group["images"])
    # every attention call of every step was sharded: (2 + 1 blocks) x 3 steps for
    # autoguidance's DiT and weak twin, 2 blocks x 3 steps for CFG's one batched pass
    assert group["sharded_calls"] == {"autoguidance": 9, "cfg": 6}[guidance] and one["sharded_calls"] == 0


@pytest.mark.parametrize("guidance", GUIDANCES)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ulysses_ranks_encode_the_same_bytes(
    by_ranks: dict[int | str, dict[str, dict[str, Any]]], world_size: int, guidance: str
) -> None:
    # Measured, not promised: on this CPU in float32 the latents of 2 and 4 ranks are equal to
    # one rank's bit for bit (each token's and each head's arithmetic is the same whichever
    # rank does it), so the PNG bytes are too. GPU kernels chosen by shape may break this.
    one, group = by_ranks[1][guidance], by_ranks[world_size][guidance]
    assert group["images"] == one["images"] and group["previews"] == one["previews"]


@pytest.mark.parametrize("guidance", GUIDANCES)
@pytest.mark.parametrize("world_size", [2, 4])
def test_ulysses_ranks_take_the_step_caches_decisions_together(
    by_ranks: dict[int | str, dict[str, dict[str, Any]]], world_size: int, guidance: str
) -> None:
    # the change is all-reduced over the ranks' tokens (padding left out), so every rank skips
    # the same rows at the same steps, and runs the others' blocks together
    one, group = by_ranks[1][guidance], by_ranks[world_size][guidance]
    assert group["skipped"] == one["skipped"] and one["skipped"][0] > 0 and one["skipped"][1] == 0
    assert (group["cached"] - one["cached"]).abs().max().item() < 1e-5
