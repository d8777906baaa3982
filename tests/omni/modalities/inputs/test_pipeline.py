"""MediaPipeline: chat parts -> expanded prompt token ids and media spans, with the artifact
store as the encoder cache. A FakeEncoder stands in for the encoder worker: it writes real
artifacts to a real LocalStore, so cache reads go through the actual store and codec."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from gpu_workers.tiny.checkpoints import make_tiny_component_checkpoint
from omni.engines.encoder import EncoderEngine
from omni.engines.llm import EngineError
from omni.errors import APIError, bad_request
from omni.metrics import Metrics
from omni.modalities.inputs import items as media_items
from omni.modalities.inputs.items import MediaItem
from omni.modalities.inputs.pipeline import MediaPipeline, PromptInputs
from omni.model_layout import ModelLayout, component_revision
from omni.serving.prompt import media_parts, media_ref, template_messages
from omni.serving.requests import ChatCompletionRequest, parse_chat_completion_request
from omni.shared import protocol
from omni.shared.media import MediaError, MediaLimits
from omni.shared.store.base import StoreError
from omni.shared.store.codec import encode_codes, encode_tensors
from omni.shared.store.keys import encoder_key
from omni.shared.store.local import LocalStore
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan
from tests.omni.shared.media.conftest import encoded_video, png_bytes, wav_bytes

MODEL = "tiny-omni"
REVISIONS = {
    "vision_encoder": "rev-vis",
    "audio_encoder": "rev-aud",
    "image_tokenizer": "rev-itok",
    "audio_tokenizer": "rev-atok",
}
ALL_COMPONENTS = frozenset(REVISIONS)
DISCRETE = frozenset({"image_tokenizer", "audio_tokenizer"})
NUM_CODES = {"image_tokenizer": 64, "audio_tokenizer": 81}  # the tiny omni vocabulary's code tokens

IMAGE = png_bytes(56, 56)
AUDIO = wav_bytes(seconds=0.2, rate=16_000, channels=1)
IMAGE_PARAM = "messages[0].content[1]"
AUDIO_PARAM = "messages[0].content[2]"


# ---- the fake encoder's outputs: a pure function of (component, media bytes) ---------------
def fake_rows(component: str, data: bytes) -> int:
    """Embedding rows (continuous) or number of codes (discrete) the fake produces."""
    return len(data) % 3 + 2 if component in DISCRETE else len(data) % 5 + 3


def fake_codes(component: str, data: bytes) -> list[int]:
    return [(len(data) + 7 * i) % NUM_CODES[component] for i in range(fake_rows(component, data))]


@dataclass(frozen=True, slots=True)
class Call:
    component: str
    kind: str
    key: str
    data: bytes
    fmt: str | None
    param: str


class FakeEncoder:
    """EncoderEngine's interface. Writes through its own store handle, as the worker does."""

    def __init__(
        self,
        store: LocalStore,
        components: frozenset[str] = ALL_COMPONENTS,
        *,
        errors: dict[str, str] | None = None,
        store_errors: dict[str, str] | None = None,
    ) -> None:
        self.components = components
        self.ready = True
        self.store = store
        self.errors = errors or {}  # component -> decode error it reports
        self.store_errors = store_errors or {}  # component -> store error it reports
        self.calls: list[Call] = []
        self.priorities: list[int] = []  # each encode's

    async def encode(
        self, component: str, kind: str, key: str, data: bytes, fmt: str | None, param: str, *, priority: int = 0
    ) -> protocol.EncodedItem:
        self.calls.append(Call(component, kind, key, data, fmt, param))
        self.priorities.append(priority)
        item_id = len(self.calls)
        if component in self.errors:
            return protocol.EncodedItem(item_id, 0, error=self.errors[component])
        n = fake_rows(component, data)
        codes = fake_codes(component, data) if component in DISCRETE else None
        if component in self.store_errors:
            return protocol.EncodedItem(item_id, n, codes, store_error=self.store_errors[component])
        if codes is not None:
            artifact = encode_codes(codes)
        else:
            artifact = encode_tensors({"embeddings": np.full((n, 64), 0.5, dtype=np.float32)})
        await self.store.put(key, artifact)
        return protocol.EncodedItem(item_id, n, codes)


class FlakyStore(LocalStore):
    """get/read_head/exists fail like a broken backend while failing is set."""

    failing = True

    async def read_head(self, key: str, length: int) -> tuple[bytes, int]:
        if self.failing:
            raise StoreError("backend unreachable")
        return await super().read_head(key, length)

    async def get(self, key: str) -> bytes:
        if self.failing:
            raise StoreError("backend unreachable")
        return await super().get(key)

    async def exists(self, key: str) -> bool:
        if self.failing:
            raise StoreError("backend unreachable")
        return await super().exists(key)


# ---- fixtures and helpers ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory: pytest.TempPathFactory) -> TextTokenizer:
    root = make_tiny_component_checkpoint(tmp_path_factory.mktemp("omni"))
    return TextTokenizer.from_dir(root / "llm")


@pytest.fixture(scope="module")
def mp4(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return encoded_video(tmp_path_factory.mktemp("video") / "clip.mp4", "mpeg4")


def _local_store(root: Path) -> LocalStore:
    return LocalStore(root, "http://x", b"secret")


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[LocalStore]:
    store = _local_store(tmp_path / "artifacts")
    async with store:
        yield store


def make_pipeline(
    tokenizer: TextTokenizer,
    encoder: FakeEncoder,
    store: LocalStore,
    metrics: Metrics | None = None,
    limits: MediaLimits | None = None,
) -> MediaPipeline:
    return MediaPipeline(
        MODEL,
        tokenizer,
        cast(EncoderEngine, encoder),  # duck-typed: components, ready, encode()
        store,
        REVISIONS,
        limits or MediaLimits(),
        metrics or Metrics(),
    )


def data_url(mime: str, data: bytes) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def text(s: str) -> dict[str, Any]:
    return {"type": "text", "text": s}


def image(data: bytes, part_type: str = "image_url", mime: str = "image/png") -> dict[str, Any]:
    return {"type": part_type, part_type: {"url": data_url(mime, data)}}


def audio(data: bytes) -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": "wav"}}


def chat(*parts: dict[str, Any]) -> ChatCompletionRequest:
    return parse_chat_completion_request({"model": MODEL, "messages": [{"role": "user", "content": list(parts)}]})


async def _load(pipeline: MediaPipeline, req: ChatCompletionRequest) -> list[MediaItem]:
    refs = [media_ref(param, part) for param, part in media_parts(req.messages)]
    return await media_items.load_items(refs, pipeline.limits)


async def render(pipeline: MediaPipeline, req: ChatCompletionRequest) -> tuple[list[int], PromptInputs]:
    """(the template's token ids, the expanded prompt), as the chat handler does it."""
    items = await _load(pipeline, req)
    rendered = pipeline.tokenizer.apply_chat_template(template_messages(req.messages, items))
    return rendered, await pipeline.expand(rendered, items)


async def expand_error(pipeline: MediaPipeline, req: ChatCompletionRequest) -> APIError:
    """The error the client gets: the media layer's MediaError becomes a 400 naming the part
    (in error_middleware), as here."""
    with pytest.raises((APIError, MediaError)) as e:
        await render(pipeline, req)
    if isinstance(e.value, MediaError):
        return bad_request(e.value.message, param=e.value.param)
    assert isinstance(e.value, APIError)
    return e.value


def sample(metrics: Metrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def cache_counts(metrics: Metrics) -> dict[str, tuple[float, float]]:
    """component -> (hits, misses)"""
    return {
        c: (
            sample(metrics, "omni_encoder_cache_hits_total", model_name=MODEL, component=c),
            sample(metrics, "omni_encoder_cache_misses_total", model_name=MODEL, component=c),
        )
        for c in sorted(ALL_COMPONENTS)
    }


def token_id(tokenizer: TextTokenizer, token: str) -> int:
    found = tokenizer.token_to_id(token)
    assert found is not None, token
    return found


def key(component: str, data: bytes, **params: object) -> str:
    return encoder_key(component, REVISIONS[component], data, params)


def image_audio_keys() -> dict[str, str]:
    return {
        "vision_encoder": key("vision_encoder", IMAGE, kind="image"),
        "image_tokenizer": key("image_tokenizer", IMAGE, kind="image"),
        "audio_encoder": key("audio_encoder", AUDIO, kind="audio"),
        "audio_tokenizer": key("audio_tokenizer", AUDIO, kind="audio"),
    }


IMAGE_AUDIO = (text("Look:"), image(IMAGE), audio(AUDIO), text("What do you see and hear?"))


# ---- a. expansion ---------------------------------------------------------------------------
async def test_expand_splices_rows_and_codes_and_spans_point_at_the_pad_runs(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    encoder = FakeEncoder(store)
    rendered, prompt = await render(make_pipeline(tokenizer, encoder, store), chat(*IMAGE_AUDIO))

    def tid(token: str) -> int:
        return token_id(tokenizer, token)

    pad = {name: tid(f"<|{name}|>") for name in ("IMAGE_PAD", "DISCRETE_IMAGE_PAD", "AUDIO_PAD", "DISCRETE_AUDIO_PAD")}
    assert [rendered.count(t) for t in pad.values()] == [1, 1, 1, 1]  # one placeholder each

    keys = image_audio_keys()
    assert sorted((c.component, c.kind, c.key, c.fmt, c.param) for c in encoder.calls) == [
        ("audio_encoder", "audio", keys["audio_encoder"], "wav", AUDIO_PARAM),
        ("audio_tokenizer", "audio", keys["audio_tokenizer"], "wav", AUDIO_PARAM),
        ("image_tokenizer", "image", keys["image_tokenizer"], None, IMAGE_PARAM),
        ("vision_encoder", "image", keys["vision_encoder"], None, IMAGE_PARAM),
    ]
    for call in encoder.calls:
        assert call.key.startswith(f"enc/{call.component}/{REVISIONS[call.component]}/")
        assert call.data == (IMAGE if call.kind == "image" else AUDIO)

    image_rows, audio_rows = fake_rows("vision_encoder", IMAGE), fake_rows("audio_encoder", AUDIO)
    vision_ids = [tid(f"<|vision{c:05d}|>") for c in fake_codes("image_tokenizer", IMAGE)]
    unit_ids = [tid(f"<|audio{c:04d}|>") for c in fake_codes("audio_tokenizer", AUDIO)]
    # the items differ in every count, so attaching one item's output to the other shows
    assert image_rows != audio_rows and len(vision_ids) != len(unit_ids)
    replace = {
        pad["IMAGE_PAD"]: [pad["IMAGE_PAD"]] * image_rows,
        pad["DISCRETE_IMAGE_PAD"]: vision_ids,
        pad["AUDIO_PAD"]: [pad["AUDIO_PAD"]] * audio_rows,
        pad["DISCRETE_AUDIO_PAD"]: unit_ids,
    }
    expected = [t for token in rendered for t in replace.get(token, [token])]
    assert prompt.token_ids == expected
    # what each kind stands for in the prompt: its rows and its codes
    assert prompt.num_media_tokens == {"image": image_rows + len(vision_ids), "audio": audio_rows + len(unit_ids)}

    image_at, audio_at = expected.index(pad["IMAGE_PAD"]), expected.index(pad["AUDIO_PAD"])
    assert prompt.media == (
        MediaSpan(image_at, image_rows, keys["vision_encoder"]),
        MediaSpan(audio_at, audio_rows, keys["audio_encoder"]),
    )
    # [offset - 1]   [offset, offset + length)   [offset + length]
    #  <|image_start|>  IMAGE_PAD x rows            <|image_end|>
    for span, name, kind in zip(prompt.media, ("IMAGE_PAD", "AUDIO_PAD"), ("image", "audio")):
        assert prompt.token_ids[span.offset - 1 : span.end + 1] == (
            [tid(f"<|{kind}_start|>")] + [pad[name]] * span.num_rows + [tid(f"<|{kind}_end|>")]
        )


# ---- b. the store as a cache --------------------------------------------------------------
async def test_second_request_hits_and_a_fresh_pipeline_reads_the_store(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    encoder, metrics = FakeEncoder(store), Metrics()
    pipeline = make_pipeline(tokenizer, encoder, store, metrics)
    _, first = await render(pipeline, chat(*IMAGE_AUDIO))
    assert len(encoder.calls) == 4
    assert cache_counts(metrics) == {c: (0.0, 1.0) for c in ALL_COMPONENTS}

    _, second = await render(pipeline, chat(*IMAGE_AUDIO))
    assert second == first
    assert len(encoder.calls) == 4  # nothing encoded again
    assert cache_counts(metrics) == {c: (1.0, 1.0) for c in ALL_COMPONENTS}

    # A restarted server: empty in-memory index, same store.
    fresh_encoder, fresh_metrics = FakeEncoder(store), Metrics()
    _, third = await render(make_pipeline(tokenizer, fresh_encoder, store, fresh_metrics), chat(*IMAGE_AUDIO))
    assert third == first
    assert fresh_encoder.calls == []
    assert cache_counts(fresh_metrics) == {c: (1.0, 0.0) for c in ALL_COMPONENTS}
    # codes are read whole; embeddings only as far as their header
    assert sample(fresh_metrics, "omni_store_operation_seconds_count", operation="get") == 2.0
    assert sample(fresh_metrics, "omni_store_operation_seconds_count", operation="read_head") == 2.0
    assert sample(fresh_metrics, "omni_store_errors_total", operation="get") == 0.0


async def test_an_item_encoded_ahead_is_found_by_the_prompt_that_holds_it(tokenizer: TextTokenizer, store: LocalStore) -> None:
    """A realtime image is encoded when it is shown, by each of its kind's components; the turn
    that holds it then encodes nothing. A failure ahead is left to that turn."""
    encoder = FakeEncoder(store)
    pipeline = make_pipeline(tokenizer, encoder, store)
    ref = media_items.MediaRef("item.content[0].image_url", "image", url=data_url("image/png", IMAGE))
    (item,) = await media_items.load_items([ref], pipeline.limits)
    await pipeline.encode_ahead(item)
    assert sorted((c.component, c.param) for c in encoder.calls) == [
        ("image_tokenizer", "item.content[0].image_url"), ("vision_encoder", "item.content[0].image_url")]  # fmt: skip
    _, prompt = await render(pipeline, chat(text("What is it?"), image(IMAGE)))
    assert len(encoder.calls) == 2 and prompt.num_media_tokens["image"] > 0
    refusing = FakeEncoder(store, errors={"vision_encoder": "cannot decode"})
    ref = media_items.MediaRef("item.content[0].image_url", "image", url=data_url("image/png", png_bytes(40, 40)))
    (other,) = await media_items.load_items([ref], pipeline.limits)
    await make_pipeline(tokenizer, refusing, store).encode_ahead(other)  # no error here: the turn's expand says it
    assert sorted(c.component for c in refusing.calls) == ["image_tokenizer", "vision_encoder"]


async def test_a_swept_embeddings_artifact_is_encoded_again_but_codes_are_not(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    encoder, metrics = FakeEncoder(store), Metrics()
    pipeline = make_pipeline(tokenizer, encoder, store, metrics)
    _, first = await render(pipeline, chat(*IMAGE_AUDIO))
    keys = image_audio_keys()

    # Known in memory, but gone from the store: the LLM worker could not read it.
    await store.delete(keys["vision_encoder"])
    await store.delete(keys["image_tokenizer"])  # codes travel in the prompt: not needed
    _, second = await render(pipeline, chat(*IMAGE_AUDIO))
    assert second == first
    assert [c.component for c in encoder.calls[4:]] == ["vision_encoder"]
    assert await store.exists(keys["vision_encoder"])
    assert cache_counts(metrics)["vision_encoder"] == (0.0, 2.0)
    assert cache_counts(metrics)["image_tokenizer"] == (1.0, 1.0)
    assert sample(metrics, "omni_store_errors_total", operation="exists") == 0.0  # absent is no error

    # Not known in memory either (a fresh pipeline): a missing key reads as a miss.
    await store.delete(keys["audio_encoder"])
    fresh = FakeEncoder(store)
    _, third = await render(make_pipeline(tokenizer, fresh, store), chat(*IMAGE_AUDIO))
    assert third == first
    assert sorted(c.component for c in fresh.calls) == ["audio_encoder", "image_tokenizer"]


async def test_an_unreadable_artifact_is_encoded_again(tokenizer: TextTokenizer, store: LocalStore) -> None:
    _, reference = await render(make_pipeline(tokenizer, FakeEncoder(store), store), chat(*IMAGE_AUDIO))
    await store.put(image_audio_keys()["vision_encoder"], b"\x05\x00not a safetensors file")
    encoder = FakeEncoder(store)
    _, prompt = await render(make_pipeline(tokenizer, encoder, store), chat(*IMAGE_AUDIO))
    assert prompt == reference
    assert [c.component for c in encoder.calls] == ["vision_encoder"]


@pytest.mark.parametrize("component", ["image_tokenizer", "vision_encoder"])
async def test_a_truncated_artifact_is_encoded_again(
    tokenizer: TextTokenizer, store: LocalStore, component: str
) -> None:
    _, reference = await render(make_pipeline(tokenizer, FakeEncoder(store), store), chat(*IMAGE_AUDIO))
    key = image_audio_keys()[component]
    whole = await store.get(key)
    await store.put(key, whole[:-4])  # the header still parses; the body is short
    encoder = FakeEncoder(store)
    _, prompt = await render(make_pipeline(tokenizer, encoder, store), chat(*IMAGE_AUDIO))
    assert prompt == reference
    assert [c.component for c in encoder.calls] == [component]


# ---- c. a failing store -----------------------------------------------------------------
async def test_a_failing_store_reads_as_a_miss_and_is_counted(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    _, reference = await render(make_pipeline(tokenizer, FakeEncoder(store), store), chat(*IMAGE_AUDIO))

    flaky = FlakyStore(store.root, "http://x", b"secret")  # same files; reads fail
    encoder, metrics = FakeEncoder(store), Metrics()
    pipeline = make_pipeline(tokenizer, encoder, flaky, metrics)
    _, first = await render(pipeline, chat(*IMAGE_AUDIO))
    assert first == reference
    assert len(encoder.calls) == 4  # every read failed: everything encoded
    assert sample(metrics, "omni_store_errors_total", operation="get") == 2.0
    assert sample(metrics, "omni_store_errors_total", operation="read_head") == 2.0

    _, second = await render(pipeline, chat(*IMAGE_AUDIO))
    assert second == reference
    # codes are known in memory; embeddings need exists(), which fails: encode them again
    assert sorted(c.component for c in encoder.calls[4:]) == ["audio_encoder", "vision_encoder"]
    assert sample(metrics, "omni_store_errors_total", operation="exists") == 2.0


# ---- d. encoder errors --------------------------------------------------------------------
async def test_a_decode_error_is_a_400_naming_the_part(tokenizer: TextTokenizer, store: LocalStore) -> None:
    message = f"cannot use the audio in {AUDIO_PARAM}: not a RIFF file"
    encoder = FakeEncoder(store, errors={"audio_encoder": message})
    error = await expand_error(make_pipeline(tokenizer, encoder, store), chat(*IMAGE_AUDIO))
    assert (error.status, error.param, error.message) == (400, AUDIO_PARAM, message)


async def test_an_unavailable_encoder_is_a_503(tokenizer: TextTokenizer, store: LocalStore) -> None:
    class DeadEncoder(FakeEncoder):
        async def encode(
            self, component: str, kind: str, key: str, data: bytes, fmt: str | None, param: str, *, priority: int = 0
        ) -> protocol.EncodedItem:
            raise EngineError("the encoder worker is not ready")

    error = await expand_error(make_pipeline(tokenizer, DeadEncoder(store), store), chat(*IMAGE_AUDIO))
    assert (error.status, error.code, error.headers) == (503, "service_unavailable", {"Retry-After": "5"})


async def test_a_store_error_on_embeddings_is_a_503(tokenizer: TextTokenizer, store: LocalStore) -> None:
    metrics = Metrics()
    encoder = FakeEncoder(store, store_errors={"vision_encoder": "bucket is gone"})
    error = await expand_error(make_pipeline(tokenizer, encoder, store, metrics), chat(*IMAGE_AUDIO))
    assert (error.status, error.code, error.headers) == (503, "service_unavailable", {"Retry-After": "5"})
    assert "bucket is gone" in error.message


async def test_a_store_error_on_codes_still_serves_them_uncached(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    _, reference = await render(make_pipeline(tokenizer, FakeEncoder(store), store), chat(*IMAGE_AUDIO))
    await store.delete(image_audio_keys()["image_tokenizer"])

    metrics = Metrics()
    encoder = FakeEncoder(store, store_errors={"image_tokenizer": "bucket is gone"})
    pipeline = make_pipeline(tokenizer, encoder, store, metrics)
    _, first = await render(pipeline, chat(*IMAGE_AUDIO))
    assert first == reference  # the codes came back over the pipe
    assert [c.component for c in encoder.calls] == ["image_tokenizer"]

    _, second = await render(pipeline, chat(*IMAGE_AUDIO))
    assert second == reference
    assert [c.component for c in encoder.calls] == ["image_tokenizer", "image_tokenizer"]  # not cached


# ---- e. requests refused before any encode ------------------------------------------------
async def test_typed_special_tokens_are_text_and_expansion_follows_the_real_items(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    """Every special token typed around an image and an audio clip: none becomes a placeholder
    (or any special id); the prompt expands exactly as the same request with plain text does."""
    typed = "".join(str(tokenizer.backend.id_to_token(i)) for i in sorted(tokenizer.special_token_ids))
    pipeline = make_pipeline(tokenizer, FakeEncoder(store), store)
    _, reference = await render(pipeline, chat(text("x"), image(IMAGE), audio(AUDIO)))
    _, prompt = await render(pipeline, chat(text(typed), image(IMAGE), audio(AUDIO)))
    assert [(s.num_rows, s.key) for s in prompt.media] == [(s.num_rows, s.key) for s in reference.media]
    specials = tokenizer.special_token_ids
    assert [i for i in prompt.token_ids if i in specials] == [i for i in reference.token_ids if i in specials]
    as_text = tokenizer.encode_prompt(tokenizer.chat_encoder.escape(typed))  # typed, as plain text
    shift = len(prompt.token_ids) - len(reference.token_ids)
    assert shift == len(as_text) - len(tokenizer.encode("x", add_special_tokens=False))
    assert [s.offset - shift for s in prompt.media] == [s.offset for s in reference.media]


async def test_an_encoder_without_audio_components_refuses_the_audio_part(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    encoder = FakeEncoder(store, frozenset({"vision_encoder", "image_tokenizer"}))
    error = await expand_error(make_pipeline(tokenizer, encoder, store), chat(*IMAGE_AUDIO))
    assert (error.status, error.param, error.code) == (400, AUDIO_PARAM, "unsupported_content_type")
    assert encoder.calls == []


async def test_more_items_than_the_limit_is_a_400(tokenizer: TextTokenizer, store: LocalStore) -> None:
    encoder = FakeEncoder(store)
    pipeline = make_pipeline(tokenizer, encoder, store, limits=MediaLimits(max_items_per_request=1))
    error = await expand_error(pipeline, chat(image(IMAGE), image(png_bytes(84, 56))))
    assert (error.status, error.param) == (400, "messages")
    assert "max_items_per_request" in error.message
    assert encoder.calls == []


async def test_a_remote_url_without_allow_remote_is_a_400(tokenizer: TextTokenizer, store: LocalStore) -> None:
    encoder = FakeEncoder(store)
    req = chat(text("Look:"), {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}})
    error = await expand_error(make_pipeline(tokenizer, encoder, store), req)
    assert (error.status, error.param) == (400, IMAGE_PARAM)
    assert encoder.calls == []


# ---- f. video ------------------------------------------------------------------------------
@pytest.mark.parametrize("part_type", ["image_url", "video_url"])
async def test_an_mp4_becomes_a_video_item(
    part_type: str, tokenizer: TextTokenizer, store: LocalStore, mp4: bytes
) -> None:
    encoder = FakeEncoder(store)
    pipeline = make_pipeline(tokenizer, encoder, store)
    req = chat(text("Describe:"), image(mp4, part_type, mime="image/png"))  # the bytes decide, not the mime
    items = await _load(pipeline, req)
    assert [(item.kind, item.param, item.data) for item in items] == [("video", IMAGE_PARAM, mp4)]

    rendered, prompt = await render(pipeline, req)
    video_key = key("vision_encoder", mp4, kind="video", fps=2.0, max_frames=128)
    assert [(c.component, c.kind, c.key, c.param) for c in encoder.calls] == [
        ("vision_encoder", "video", video_key, IMAGE_PARAM)
    ]
    pad = token_id(tokenizer, "<|VIDEO_PAD|>")
    assert rendered.count(pad) == 1
    rows = fake_rows("vision_encoder", mp4)
    at = rendered.index(pad)
    assert prompt.token_ids == rendered[:at] + [pad] * rows + rendered[at + 1 :]
    assert prompt.media == (MediaSpan(at, rows, video_key),)


# ---- start-up: discrete codes must be writable by the LLM ------------------------------------
async def test_codebooks_must_fit_the_vocabulary(
    tmp_path: Path, tokenizer: TextTokenizer, store: LocalStore
) -> None:
    root = make_tiny_component_checkpoint(tmp_path / "omni")
    sizes = ModelLayout.from_dir(root).codebook_sizes()
    assert sizes == {"image_tokenizer": 64, "audio_tokenizer": 81}
    pipeline = make_pipeline(tokenizer, FakeEncoder(store), store)
    pipeline.check_vocabulary(sizes)
    with pytest.raises(ValueError, match=r"<\|vision00064\|>"):
        pipeline.check_vocabulary({"image_tokenizer": 65})
    with pytest.raises(ValueError, match=r"<\|audio0081\|>"):
        pipeline.check_vocabulary({"audio_tokenizer": 82})


async def test_media_while_the_encoder_is_not_ready_is_a_503(
    tokenizer: TextTokenizer, store: LocalStore
) -> None:
    encoder = FakeEncoder(store, frozenset())  # a worker still starting knows no components yet
    encoder.ready = False
    error = await expand_error(make_pipeline(tokenizer, encoder, store), chat(*IMAGE_AUDIO))
    assert error.status == 503 and error.headers.get("Retry-After") == "5"
    assert encoder.calls == []


async def test_revisions_are_hashed_from_component_directories(
    tmp_path: Path, tokenizer: TextTokenizer, store: LocalStore
) -> None:
    layout = ModelLayout.from_dir(make_tiny_component_checkpoint(tmp_path / "omni"))
    pipeline = MediaPipeline(
        MODEL, tokenizer, cast(EncoderEngine, FakeEncoder(store)), store, layout.revisions(), MediaLimits(), Metrics()
    )
    assert not pipeline.ready  # keys cannot be made before the revisions are known
    error = await expand_error(pipeline, chat(*IMAGE_AUDIO))
    assert error.status == 503
    await pipeline.load_revisions()
    assert pipeline.ready
    assert pipeline.revisions == {name: component_revision(path) for name, path in layout.components.items()}
