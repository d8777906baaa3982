"""Image, audio and video input end to end: the official openai client against a real server on
the tiny omni checkpoint (llm + encoders), its artifact store on local disk."""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
from PIL import Image

from gpu_workers.preprocess.image import smart_resize
from gpu_workers.tiny.published import make_tiny_omni_checkpoint
from omni.shared.media import MediaLimits, decode_video
from omni.shared.media.audio import media_duration_s
from omni.shared.store.codec import artifact_rows, decode_codes, decode_tensors
from omni.text.tokenizer import TextTokenizer
from tests.e2e.conftest import read_metric
from tests.e2e.server import running_server
from tests.omni.shared.media.conftest import encoded_video, wav_bytes

MODEL = "omni-tiny"
BLOCK_SIZE = 4
NUM_IMAGE_CODES = 64  # the tiny TA-Tok: 112 px / 14 = 8 x 8 codes
MAX_IMAGE_PIXELS = 200 * 200
MAX_ITEMS = 4
MAX_AUDIO_SECONDS = 5


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_omni_checkpoint(tmp_path_factory.mktemp("omni") / "omni-tiny")


@pytest.fixture(scope="module")
def store_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("store")


@pytest.fixture(scope="module")
def server(omni_dir: Path, store_dir: Path) -> Iterator[str]:
    store = store_dir
    with running_server(
        "--model", f"{MODEL}={omni_dir}",
        "--no-audio-output", "--no-image-output",  # no decoder is used here: two processes less to start
        "--block-size", str(BLOCK_SIZE),
        "--num-kv-blocks", "2048",
        "--max-model-len", "2048",
        "--store", f"local:{store}",
        "--max-image-pixels", str(MAX_IMAGE_PIXELS),
        "--max-media-items", str(MAX_ITEMS),
        "--max-audio-seconds", str(MAX_AUDIO_SECONDS),
    ) as base:  # fmt: skip
        yield base


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def tokenizer(omni_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(omni_dir)


def png_url(width: int, height: int, seed: int) -> str:
    pixels = (np.random.default_rng(seed).random((height, width, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str) -> dict[str, Any]:
    return {"type": "image_url", "image_url": {"url": url}}


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(parts)}


def text(t: str) -> dict[str, Any]:
    return {"type": "text", "text": t}


def rendered_len(tokenizer: TextTokenizer, *parts: dict[str, Any]) -> int:
    """Prompt tokens before expansion: the template with one placeholder per representation."""
    return len(tokenizer.apply_chat_template([{"role": "user", "content": list(parts)}]))


def image_rows(omni_dir: Path, width: int, height: int) -> int:
    pre = json.loads((omni_dir / "preprocessor_config.json").read_text())
    h, w = smart_resize(height, width, 28, pre["min_pixels"], pre["max_pixels"])
    return (h // 14) * (w // 14) // 4


def test_image_with_text(client: openai.OpenAI, tokenizer: TextTokenizer, omni_dir: Path) -> None:
    r = client.chat.completions.create(
        model=MODEL,
        messages=[user(text("Describe this picture."), image_part(png_url(120, 90, seed=1)))],  # type: ignore[list-item]
        max_tokens=6,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "length" and r.usage is not None
    base = rendered_len(tokenizer, text("Describe this picture."), {"type": "image", "id": "image_0"})
    # each of the two placeholders became the item's rows: embeddings and discrete codes
    expected = base - 2 + image_rows(omni_dir, 120, 90) + NUM_IMAGE_CODES
    assert r.usage.prompt_tokens == expected


def test_streamed_image_answer_equals_the_full_one(client: openai.OpenAI) -> None:
    messages = [user(image_part(png_url(64, 64, seed=2)), text("What is it?"))]
    full = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0)  # type: ignore[arg-type]
    stream = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True  # type: ignore[arg-type]
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == full.choices[0].message.content


def test_audio_with_text(client: openai.OpenAI, tokenizer: TextTokenizer) -> None:
    audio = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav_bytes(seconds=2.0)).decode(), "format": "wav"},
    }
    r = client.chat.completions.create(
        model=MODEL, messages=[user(text("Transcribe:"), audio)], max_tokens=4, temperature=0  # type: ignore[list-item]
    )
    assert r.usage is not None
    # the template writes the clip's duration into its meta placeholder, as the server does
    base = rendered_len(tokenizer, text("Transcribe:"), {"type": "audio", "id": "audio_0", "duration": 2.0})
    # 2 s at 16 kHz: 200 mel frames -> 100 conv rows -> 50 pooled vectors, 25 per second,
    # for the encoder (embeddings) and the speech tokenizer (units) alike
    assert r.usage.prompt_tokens == base - 2 + 50 + 50


@pytest.mark.parametrize("as_image_url", [False, True])
def test_video_with_text(
    client: openai.OpenAI, tokenizer: TextTokenizer, tmp_path: Path, as_image_url: bool
) -> None:
    data = encoded_video(tmp_path / "clip.mp4", "mpeg4", seconds=3.0, fps=10, size=32)
    url = "data:video/mp4;base64," + base64.b64encode(data).decode()
    part = image_part(url) if as_image_url else {"type": "video_url", "video_url": {"url": url}}
    r = client.chat.completions.create(
        model=MODEL, messages=[user(part, text("What happens?"))], max_tokens=4, temperature=0  # type: ignore[list-item]
    )
    assert r.usage is not None
    frames, _ = decode_video(data, MediaLimits(), "v")
    n = max(len(frames), 4)
    n += n % 2  # temporal patches of 2 frames
    rows_per_pair = (56 // 14) * (56 // 14) // 4  # a 32 px frame is resized to 56 x 56
    video = {"type": "video", "id": "video_0", "duration": media_duration_s(data, "video")}
    base = rendered_len(tokenizer, video, text("What happens?"))
    assert r.usage.prompt_tokens == base - 1 + (n // 2) * rows_per_pair


def test_second_turn_with_the_same_image_skips_the_encoder(
    server: str, client: openai.OpenAI, tokenizer: TextTokenizer
) -> None:
    first_turn = [user(text("Look:"), image_part(png_url(100, 100, seed=3)))]
    r1 = client.chat.completions.create(model=MODEL, messages=first_turn, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    batches = read_metric(server, "omni_encoder_batch_seconds_count", model_name=MODEL)
    misses = read_metric(server, "omni_encoder_cache_misses_total", model_name=MODEL)
    hits = read_metric(server, "omni_encoder_cache_hits_total", model_name=MODEL)

    second_turn = [
        *first_turn,
        {"role": "assistant", "content": r1.choices[0].message.content},
        user(text("And the colours?")),
    ]
    r2 = client.chat.completions.create(model=MODEL, messages=second_turn, max_tokens=5, temperature=0)  # type: ignore[arg-type]
    assert read_metric(server, "omni_encoder_batch_seconds_count", model_name=MODEL) == batches  # no encoder call
    assert read_metric(server, "omni_encoder_cache_misses_total", model_name=MODEL) == misses
    assert read_metric(server, "omni_encoder_cache_hits_total", model_name=MODEL) == hits + 2  # embeddings + codes
    assert r2.usage is not None and r2.usage.prompt_tokens_details is not None
    cached = r2.usage.prompt_tokens_details.cached_tokens or 0
    # the whole first turn, image included, came from the prefix cache (whole blocks of it), up to
    # the generation prompt's "<think>\n": the reference's template writes a past answer without it
    assert r1.usage is not None
    opened = len(tokenizer.encode_prompt("<think>\n"))
    assert cached >= ((r1.usage.prompt_tokens - opened) // BLOCK_SIZE) * BLOCK_SIZE > 0


def test_a_different_image_shares_no_blocks_past_its_start(
    client: openai.OpenAI, tokenizer: TextTokenizer
) -> None:
    def ask(seed: int) -> int:
        r = client.chat.completions.create(
            model=MODEL,
            messages=[user(text("Same words first, then"), image_part(png_url(84, 84, seed)))],  # type: ignore[list-item]
            max_tokens=1,
            temperature=0,
        )
        assert r.usage is not None and r.usage.prompt_tokens_details is not None
        return r.usage.prompt_tokens_details.cached_tokens or 0

    ask(10)
    cached = ask(11)
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": [text("Same words first, then"), {"type": "image", "id": "image_0"}]}]
    )
    first_media = ids.index(tokenizer.token_to_id("<|DISCRETE_IMAGE_PAD|>"))
    assert cached <= first_media


def bad(body_parts: list[dict[str, Any]]) -> dict[str, Any]:
    return {"model": MODEL, "max_tokens": 2, "messages": [user(text("Hi"), *body_parts)]}


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def big_png() -> str:
    buf = io.BytesIO()
    Image.new("RGB", (300, 300)).save(buf, format="PNG")  # 90,000 pixels > MAX_IMAGE_PIXELS
    return "data:image/png;base64," + b64(buf.getvalue())


BAD_MEDIA = {
    "corrupt image": [image_part("data:image/png;base64," + b64(b"\x89PNG\r\n\x1a\n" + b"\x00" * 64))],
    "not base64": [image_part("data:image/png;base64,@@@@")],
    "too many pixels": [image_part(big_png())],
    "corrupt audio": [{"type": "input_audio", "input_audio": {"data": b64(b"RIFF" + b"\x01" * 80), "format": "wav"}}],
    "audio too long": [
        {"type": "input_audio", "input_audio": {"data": b64(wav_bytes(MAX_AUDIO_SECONDS + 1, rate=16_000, channels=1)), "format": "wav"}}
    ],
    "unknown audio format": [{"type": "input_audio", "input_audio": {"data": b64(wav_bytes(0.2)), "format": "xyz"}}],
    "corrupt video": [
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + b64(b"\x00\x00\x00\x18ftypmp42" + b"\x07" * 200)}}
    ],
    "remote url not allowed": [image_part("http://example.com/cat.png")],
    "too many items": [image_part(png_url(28, 28, seed=i)) for i in range(MAX_ITEMS + 1)],
}


@pytest.mark.parametrize("case", sorted(BAD_MEDIA))
def test_bad_media_is_a_400_and_the_server_keeps_serving(server: str, case: str) -> None:
    with httpx.Client(base_url=server, timeout=120) as http:
        r = http.post("/v1/chat/completions", json=bad(BAD_MEDIA[case]))
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and error["message"]
        expected_param = "messages" if case == "too many items" else "messages[0].content[1]"
        assert error["param"] == expected_param, error
        ok = http.post("/v1/chat/completions", json=bad([image_part(png_url(56, 56, seed=99))]))
        assert ok.status_code == 200, ok.text


def test_artifacts_are_content_addressed_safetensors(
    server: str, client: openai.OpenAI, store_dir: Path, omni_dir: Path
) -> None:
    client.chat.completions.create(
        model=MODEL, messages=[user(image_part(png_url(70, 50, seed=5)))], max_tokens=1  # type: ignore[list-item]
    )
    files = [p for p in store_dir.rglob("*") if p.is_file()]
    assert not [p for p in files if p.name.startswith(".tmp-")]  # written, then published
    by_component: dict[str, list[Path]] = {}
    for path in files:
        parts = path.relative_to(store_dir).parts
        assert parts[0] == "enc" and len(parts) == 4 and len(parts[3]) == 64, parts
        by_component.setdefault(parts[1], []).append(path)
    assert {"vision_encoder", "image_tokenizer", "audio_encoder", "audio_tokenizer"} <= set(by_component)
    for path in by_component["vision_encoder"]:
        kind, rows = artifact_rows(path.read_bytes())
        assert kind == "embeddings" and rows > 0
        tensors, _ = decode_tensors(path.read_bytes())
        assert tensors["embeddings"].shape == (rows, 64)  # the tiny LLM's width
    for path in by_component["image_tokenizer"]:
        assert len(decode_codes(path.read_bytes())) == NUM_IMAGE_CODES
    assert read_metric(server, "omni_store_errors_total") == 0
