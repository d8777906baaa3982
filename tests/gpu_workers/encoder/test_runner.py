"""EncoderRunner end to end on the tiny omni checkpoint: media bytes in, artifacts in a local
store out, one forward per component per batch."""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from PIL import Image

import gpu_workers.encoder.runner as encoder_runner_module
from gpu_workers.artifacts import embeddings_from_bytes
from gpu_workers.encoder.components import VisionEncoderComponent
from gpu_workers.encoder.runner import EncoderRunner
from gpu_workers.models.qwen2_audio_encoder import output_lengths
from gpu_workers.preprocess.image import smart_resize
from gpu_workers.store_client import StoreClient
from gpu_workers.tiny.checkpoints import TINY_IMAGE_CODEBOOK, make_tiny_component_checkpoint
from omni.shared import protocol
from omni.shared.media import MediaLimits, decode_audio, decode_video
from omni.shared.store.base import KeyNotFound
from omni.shared.store.codec import decode_codes, decode_tensors
from tests.omni.shared.media.conftest import encoded_video, wav_bytes

HIDDEN = 64  # the tiny LLM's hidden size, which both embedding projectors map to
NUM_AUDIO_UNITS = 81  # 3^4 FSQ levels
VISION, AUDIO, IMAGE_TOK, AUDIO_TOK = "vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer"


@dataclass
class Env:
    model_dir: Path
    store: StoreClient
    runner: EncoderRunner
    tmp: Path


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Env]:
    tmp = tmp_path_factory.mktemp("encoder-runner")
    model_dir = make_tiny_component_checkpoint(tmp / "model")
    store = StoreClient(f"local:{tmp / 'store'}")
    try:
        yield Env(model_dir, store, EncoderRunner(model_dir, store=store), tmp)
    finally:
        store.close()


def random_png(width: int, height: int, seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return buf.getvalue()


@dataclass
class Media:
    small: bytes  # 40 x 30
    large: bytes  # 200 x 150: above the tiny max_pixels, so it is scaled down
    wav: bytes  # 1 s, 44.1 kHz stereo
    mp4: bytes  # 3 s at 10 fps


@pytest.fixture(scope="module")
def media(env: Env) -> Media:
    mp4 = encoded_video(env.tmp / "clip.mp4", "mpeg4", seconds=3.0, fps=10)
    return Media(random_png(40, 30, seed=1), random_png(200, 150, seed=2), wav_bytes(1.0), mp4)


def item(item_id: int, component: str, kind: str, data: bytes, fmt: str | None = None,
         tag: str = "mixed") -> protocol.EncodeItem:  # fmt: skip
    key = f"enc/{component}/test/{tag}-{item_id}"
    return protocol.EncodeItem(item_id, component, kind, key, data, fmt, f"messages[0].content[{item_id}]")


def mixed_items(m: Media) -> list[protocol.EncodeItem]:
    return [
        item(0, VISION, "image", m.small),
        item(1, IMAGE_TOK, "image", m.small),
        item(2, VISION, "image", m.large),
        item(3, IMAGE_TOK, "image", m.large),
        item(4, AUDIO, "audio", m.wav, "wav"),
        item(5, AUDIO_TOK, "audio", m.wav, "wav"),
        item(6, VISION, "video", m.mp4),
    ]


@pytest.fixture(scope="module")
def mixed(env: Env, media: Media) -> protocol.EncodeResult:
    return env.runner.encode(protocol.EncodeBatch(7, mixed_items(media)))


def stored_embeddings(env: Env, key: str) -> torch.Tensor:
    return embeddings_from_bytes(env.store.get(key))


# ---- independent expectations -----------------------------------------------------------


def image_rows(env: Env, data: bytes) -> int:
    """(grid_t * grid_h * grid_w) / merge^2 from smart_resize and the preprocessor config."""
    pre = json.loads((env.model_dir / VISION / "preprocessor_config.json").read_text())
    vc = json.loads((env.model_dir / VISION / "config.json").read_text())
    width, height = Image.open(io.BytesIO(data)).size
    patch, merge = vc["patch_size"], vc["spatial_merge_size"]
    h, w = smart_resize(height, width, patch * merge, pre["min_pixels"], pre["max_pixels"])
    grid_t = 1  # a still image is one temporal patch
    return grid_t * (h // patch) * (w // patch) // merge**2


def video_rows(env: Env, data: bytes) -> int:
    pre = json.loads((env.model_dir / VISION / "preprocessor_config.json").read_text())
    vc = json.loads((env.model_dir / VISION / "config.json").read_text())
    frames, _ = decode_video(data, MediaLimits(), "v")
    height, width = frames[0].shape[:2]
    patch, merge, tps = vc["patch_size"], vc["spatial_merge_size"], vc["temporal_patch_size"]
    num_frames = max(len(frames), pre["video_min_frames"])
    num_frames += -num_frames % tps
    max_pixels = min(pre["max_pixels"], pre["video_max_pixels"])
    h, w = smart_resize(height, width, patch * merge, pre["min_pixels"], max_pixels)
    return (num_frames // tps) * (h // patch) * (w // patch) // merge**2


def audio_units(data: bytes) -> int:
    """The FSQ tests' count: ceil(samples / 160) mel frames -> conv2 rows -> pooled units."""
    samples = decode_audio(data, "wav", MediaLimits(), "a").shape[0]
    valid_frames = -(-samples // 160)
    _conv_rows, num = output_lengths(torch.tensor([valid_frames]))
    return int(num.item())


# ---- a. one mixed batch ---------------------------------------------------------------------


def test_mixed_batch_rows_codes_and_artifacts(env: Env, media: Media, mixed: protocol.EncodeResult) -> None:
    items = mixed_items(media)
    assert mixed.batch_id == 7
    assert [r.item_id for r in mixed.items] == [it.item_id for it in items]
    for r in mixed.items:
        assert (r.error, r.store_error) == (None, None), r

    # the inputs really differ in shape: 6 and 12 rows, 12 rows of video (3 frame pairs of 4x4)
    small, large = image_rows(env, media.small), image_rows(env, media.large)
    assert (small, large) == (6, 12)
    assert video_rows(env, media.mp4) == 12
    assert audio_units(media.wav) == 25  # 1 s at 25 units a second
    want_rows = {0: small, 1: 64, 2: large, 3: 64, 4: 25, 5: 25, 6: 12}
    assert {r.item_id: r.num_rows for r in mixed.items} == want_rows

    by_id = {r.item_id: r for r in mixed.items}
    for it in items:
        r = by_id[it.item_id]
        data = env.store.get(it.key)
        _tensors, meta = decode_tensors(data)
        assert meta == {"component": it.component, "kind": it.kind}
        if it.component in (IMAGE_TOK, AUDIO_TOK):
            assert r.codes is not None and decode_codes(data) == r.codes
            assert len(r.codes) == r.num_rows
            upper = TINY_IMAGE_CODEBOOK if it.component == IMAGE_TOK else NUM_AUDIO_UNITS
            assert all(0 <= c < upper for c in r.codes)
        else:
            assert r.codes is None
            x = embeddings_from_bytes(data)
            assert x.dtype == torch.float32 and tuple(x.shape) == (r.num_rows, HIDDEN)
            assert bool(torch.isfinite(x).all())

    # random pixels: the two images do not collapse onto the same codes
    codes_small, codes_large = by_id[1].codes, by_id[3].codes
    assert codes_small is not None and codes_large is not None
    assert sum(a != b for a, b in zip(codes_small, codes_large)) >= 16
    assert len(set(codes_small)) >= 8


# ---- b. batched == sequential -----------------------------------------------------------


def test_batched_equals_one_item_per_batch(env: Env, media: Media, mixed: protocol.EncodeResult) -> None:
    by_id = {r.item_id: r for r in mixed.items}
    for it in mixed_items(media):
        alone_item = dataclasses.replace(it, key=it.key.replace("mixed-", "alone-"))
        alone = env.runner.encode(protocol.EncodeBatch(100 + it.item_id, [alone_item]))
        (r,) = alone.items
        assert (r.error, r.store_error, r.num_rows) == (None, None, by_id[it.item_id].num_rows)
        # c. a batch of one item: exactly one forward, of that item's component, over one item
        assert [(f.component, f.num_items) for f in alone.forwards] == [(it.component, 1)]
        if it.component in (IMAGE_TOK, AUDIO_TOK):
            assert r.codes == by_id[it.item_id].codes
            assert decode_codes(env.store.get(alone_item.key)) == r.codes
        else:
            torch.testing.assert_close(
                stored_embeddings(env, alone_item.key), stored_embeddings(env, it.key), rtol=0, atol=1e-5
            )


# ---- c. one forward per component -------------------------------------------------------


def test_one_forward_per_component_with_its_item_count(mixed: protocol.EncodeResult) -> None:
    assert [(f.component, f.num_items) for f in mixed.forwards] == [(VISION, 3), (AUDIO, 1), (IMAGE_TOK, 2), (AUDIO_TOK, 1)]
    assert all(isinstance(f.seconds, float) and f.seconds >= 0 for f in mixed.forwards)


def test_forward_calls_are_counted_per_component(env: Env, media: Media, monkeypatch: pytest.MonkeyPatch) -> None:
    # forwards is the runner's own report: also count the calls that actually happen
    calls: list[tuple[str, int]] = []
    for name, component in env.runner.components.items():
        original = component.forward

        def counting(prepared: list[Any], name: str = name, original: Any = original) -> list[torch.Tensor]:
            calls.append((name, len(prepared)))
            return cast(list[torch.Tensor], original(prepared))

        monkeypatch.setattr(component, "forward", counting)
    items = [dataclasses.replace(it, key=it.key.replace("mixed-", "count-")) for it in mixed_items(media)]
    result = env.runner.encode(protocol.EncodeBatch(8, items))
    assert calls == [(f.component, f.num_items) for f in result.forwards]
    assert sorted(calls) == sorted([(VISION, 3), (AUDIO, 1), (IMAGE_TOK, 2), (AUDIO_TOK, 1)])


def test_a_forward_is_bounded_by_its_patches(env: Env, media: Media, mixed: protocol.EncodeResult, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review A7: the vision tower's items are cut into forwards of at most max_forward_cost
    patches (the small image 24, the large one and the video 48 each: 4 patches a merged row),
    in order, an item too large going alone; each item's embeddings are those of the one-forward
    batch (worst difference 1e-5, as batched against alone)."""
    monkeypatch.setattr(env.runner.components[VISION], "max_forward_cost", 72)
    items = [dataclasses.replace(it, key=it.key.replace("mixed-", "bounded-")) for it in mixed_items(media)]
    result = env.runner.encode(protocol.EncodeBatch(9, items))
    assert [(f.component, f.num_items) for f in result.forwards][:2] == [(VISION, 2), (VISION, 1)]
    monkeypatch.setattr(env.runner.components[VISION], "max_forward_cost", 10)
    items = [dataclasses.replace(it, key=it.key.replace("mixed-", "single-")) for it in mixed_items(media)]
    result = env.runner.encode(protocol.EncodeBatch(10, items))
    assert [(f.component, f.num_items) for f in result.forwards][:3] == [(VISION, 1)] * 3
    by_id = {r.item_id: r for r in mixed.items}
    for it in items:
        if it.component == VISION:
            torch.testing.assert_close(
                stored_embeddings(env, it.key), stored_embeddings(env, it.key.replace("single-", "mixed-")), rtol=0, atol=1e-5
            )
            assert {r.item_id: r.num_rows for r in result.items}[it.item_id] == by_id[it.item_id].num_rows


def test_the_profile_run_is_each_components_largest_forward(env: Env, monkeypatch: pytest.MonkeyPatch) -> None:
    """Review A7: on a GPU the worker runs each bounded component's largest forward once before
    it says ready (here with small bounds, on the CPU): max_forward_cost patches in a square
    grid of merged rows, max_forward_cost audio samples."""
    costs: list[tuple[str, int]] = []
    for name, component in env.runner.components.items():
        original = component.forward
        monkeypatch.setattr(component, "max_forward_cost", 64 if name == VISION else 16000)

        def counting(prepared: list[Any], c: Any = component, original: Any = original) -> list[torch.Tensor]:
            costs.append((c.name, sum(c.cost(p) for p in prepared)))
            return cast(list[torch.Tensor], original(prepared))

        monkeypatch.setattr(component, "forward", counting)
    env.runner.profile()
    assert costs == [(VISION, 64), (AUDIO, 16000), (AUDIO_TOK, 16000)]


# ---- d. video chunks ------------------------------------------------------------------------


def test_video_chunking_is_exact(env: Env, media: Media) -> None:
    vision = env.runner.components[VISION]
    assert isinstance(vision, VisionEncoderComponent)
    whole = env.runner.encode(protocol.EncodeBatch(9, [item(0, VISION, "video", media.mp4, tag="chunk32")]))
    frames, _ = decode_video(media.mp4, MediaLimits(), "v")
    assert len(frames) == 6  # 3 s sampled at 2 fps
    assert vision.prepare("video", frames)[1] == [(3, 4, 4)]
    default = vision.video
    assert default.frames_per_chunk == 32
    vision.video = dataclasses.replace(default, frames_per_chunk=2)
    try:
        assert vision.prepare("video", frames)[1] == [(1, 4, 4)] * 3  # really three chunks
        chunked = env.runner.encode(protocol.EncodeBatch(10, [item(0, VISION, "video", media.mp4, tag="chunk2")]))
    finally:
        vision.video = default
    assert whole.items[0].num_rows == chunked.items[0].num_rows == 12
    a = stored_embeddings(env, "enc/vision_encoder/test/chunk32-0")
    b = stored_embeddings(env, "enc/vision_encoder/test/chunk2-0")
    torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    # the frames differ, so equal outputs are not an accident of identical chunks
    assert (a[:4] - a[4:8]).abs().max().item() > 1e-3


# ---- e. bad media fail alone --------------------------------------------------------------


def test_bad_items_fail_alone_and_name_their_param(env: Env, media: Media) -> None:
    corrupt_mp4 = media.mp4[:48] + b"\x00" * 200  # a real ftyp header, then nothing decodable
    items = [
        item(0, VISION, "image", media.small, tag="bad"),
        item(1, VISION, "image", b"\x89PNG\r\n\x1a\nnot really", tag="bad"),
        item(2, AUDIO, "audio", b"RIFF....WAVEfmt garbage", "wav", tag="bad"),
        item(3, VISION, "video", corrupt_mp4, tag="bad"),
        item(4, AUDIO_TOK, "audio", media.wav, "xyz", tag="bad"),
    ]
    result = env.runner.encode(protocol.EncodeBatch(11, items))
    good, *bad = result.items
    assert (good.error, good.store_error, good.num_rows) == (None, None, 6)
    assert stored_embeddings(env, items[0].key).shape == (6, HIDDEN)
    for it, r in zip(items[1:], bad):
        assert r.error is not None and it.param in r.error, (it, r)
        assert (r.num_rows, r.codes, r.store_error) == (0, None, None)
        with pytest.raises(KeyNotFound):
            env.store.get(it.key)  # nothing was published
    assert "decode image" in str(bad[0].error) and "decode audio" in str(bad[1].error)
    assert "decode video" in str(bad[2].error) and "'xyz'" in str(bad[3].error)
    assert [(f.component, f.num_items) for f in result.forwards] == [(VISION, 1)]


def test_a_kind_the_component_does_not_take_fails_alone(env: Env, media: Media) -> None:
    items = [
        item(0, VISION, "image", media.small, tag="kind"),
        item(1, IMAGE_TOK, "video", media.mp4, tag="kind"),  # image_tokenizer takes images only
    ]
    result = env.runner.encode(protocol.EncodeBatch(14, items))
    assert result.items[0].error is None and result.items[0].num_rows == 6
    assert result.items[1].error is not None and items[1].param in result.items[1].error


def test_same_bytes_for_two_components_decode_once(env: Env, media: Media, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: dict[str, int] = {"image": 0, "audio": 0}

    def counted(kind: str, fn: Any) -> Any:
        def wrapper(*args: Any) -> Any:
            calls[kind] += 1
            return fn(*args)

        return wrapper

    monkeypatch.setattr(encoder_runner_module, "decode_image", counted("image", encoder_runner_module.decode_image))
    monkeypatch.setattr(encoder_runner_module, "decode_audio", counted("audio", encoder_runner_module.decode_audio))
    broken = b"GIF89a broken"
    items = [
        item(0, VISION, "image", media.large, tag="dedup"),
        item(1, IMAGE_TOK, "image", media.large, tag="dedup"),
        item(2, AUDIO, "audio", media.wav, "wav", tag="dedup"),
        item(3, AUDIO_TOK, "audio", media.wav, "wav", tag="dedup"),
        item(4, VISION, "image", broken, tag="dedup"),
        item(5, IMAGE_TOK, "image", broken, tag="dedup"),
        item(6, AUDIO_TOK, "audio", media.wav, "flac", tag="dedup"),  # another fmt: its own decode
    ]
    result = env.runner.encode(protocol.EncodeBatch(12, items))
    # good bytes decode once for both components; the broken image is decoded again for the
    # second part (another param) so that its error names that part
    assert calls == {"image": 3, "audio": 2}
    assert [r.error is None for r in result.items] == [True, True, True, True, False, False, True]
    assert [r.num_rows for r in result.items] == [12, 64, 25, 25, 0, 0, 25]
    assert result.items[6].codes == result.items[3].codes


def test_a_shared_failed_decode_names_each_items_param(env: Env) -> None:
    broken = b"GIF89a broken"
    items = [item(0, VISION, "image", broken, tag="shared-bad"), item(1, IMAGE_TOK, "image", broken, tag="shared-bad")]
    result = env.runner.encode(protocol.EncodeBatch(15, items))
    for it, r in zip(items, result.items):
        assert r.error is not None and it.param in r.error, r.error


# ---- f. the store refuses -----------------------------------------------------------------


def test_store_failure_is_reported_per_item(env: Env, media: Media, mixed: protocol.EncodeResult) -> None:
    blocker = env.tmp / "a-regular-file"
    blocker.write_bytes(b"")
    bad_store = StoreClient(f"local:{blocker / 'store'}")  # no directory can exist under a file
    try:
        runner = EncoderRunner(env.model_dir, store=bad_store)
        items = [
            item(0, VISION, "image", media.small, tag="nostore"),
            item(1, IMAGE_TOK, "image", media.small, tag="nostore"),
            item(2, AUDIO_TOK, "audio", media.wav, "wav", tag="nostore"),
        ]
        result = runner.encode(protocol.EncodeBatch(13, items))
    finally:
        bad_store.close()
    by_id = {r.item_id: r for r in mixed.items}
    for r in result.items:
        assert r.error is None and r.store_error, r
        assert "cannot write" in r.store_error
    assert [r.num_rows for r in result.items] == [6, 64, 25]
    # the codes still travel back: they are computed before the store is asked
    assert result.items[0].codes is None
    assert result.items[1].codes == by_id[1].codes
    assert result.items[2].codes == by_id[5].codes
