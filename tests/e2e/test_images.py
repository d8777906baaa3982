"""Image output end to end, with the official openai client against the embedded default's
layout (a tiny omni checkpoint with its vision_decoder/): the images API at every size and
response format, seeds, a 2-rank decoder (guidance in parallel, against the passes one after
the other on a second server), images in chat (content parts, and the reference's
t2i_model_generation tool call), streaming, and a decoder rank killed mid-job."""

from __future__ import annotations

import base64
import io
import json
import os
import signal
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from PIL import Image

from omni.shared.media.image_sizes import RATIO_SIZES
from omni.text.constrained.image_span import START
from omni.text.tokenizer import TextTokenizer
from tests.e2e.conftest import DIFFUSION_STEPS, read_metric
from tests.e2e.server import PROCESSES, running_server, worker_pids

MODEL = "omni"
STEPS = DIFFUSION_STEPS  # the servers' --diffusion-steps: every image here is quick
PROMPT = "a lighthouse at dusk"
T2I_TOOL = {
    "type": "function",
    "function": {
        "name": "t2i_model_generation",
        "description": "Draw an image.",
        "parameters": {
            "type": "object",
            "properties": {"discrete_image_token": {"type": "string"}},
            "required": ["discrete_image_token"],
        },
    },
}


@pytest.fixture(scope="module")
def server(speaking_server: str) -> str:
    return speaking_server  # the session's omni server (tests/e2e/conftest.py): 2 decoder ranks, STEPS steps


def _client(base: str, **kwargs: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120, **kwargs)


def _png(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    assert image.format == "PNG"
    return image


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=120) as r:
        assert r.headers["Content-Type"] == "image/png"
        return r.read()


def _generate(base: str, seed: int, size: str = "768x768", response_format: str = "b64_json", **extra: Any) -> bytes:
    result = _client(base).images.generate(
        model=MODEL, prompt=PROMPT, size=size, response_format=response_format,  # type: ignore[arg-type]
        extra_body={"seed": seed, **extra},
    )  # fmt: skip
    assert result.data is not None and len(result.data) == 1
    item = result.data[0]
    if response_format == "url":
        assert item.url is not None and item.b64_json is None
        return _fetch(item.url)
    assert item.b64_json is not None and item.url is None
    return base64.b64decode(item.b64_json)


def test_every_size_and_response_format(server: str) -> None:
    """Both formats of one size run together, so they share the decoder's batch."""
    cases = [(f"{w}x{h}", fmt) for w, h in RATIO_SIZES.values() for fmt in ("url", "b64_json")]
    with ThreadPoolExecutor(4) as pool:
        images = list(pool.map(lambda case: _generate(server, 7, *case), cases))
    for (size, _), data in zip(cases, images):
        assert "x".join(map(str, _png(data).size)) == size
    by_size: dict[str, set[bytes]] = {}
    for (size, _), data in zip(cases, images):
        by_size.setdefault(size, set()).add(data)
    assert all(len(v) == 1 for v in by_size.values()), "a url and b64_json of one seed are the same image"
    assert read_metric(server, "omni_decoder_jobs_total", model_name=MODEL, outcome="ok") >= len(cases)


def test_a_seed_gives_the_same_bytes_and_another_seed_other_bytes(server: str) -> None:
    first = _generate(server, 11)
    assert _generate(server, 11) == first
    assert _generate(server, 12) != first
    pixels = _png(first).convert("RGB").getcolors(maxcolors=1 << 20)
    assert pixels is None or len(pixels) > 100, "the image is not flat"


def test_the_step_cache_skips_blocks_and_says_so(server: str) -> None:
    """Over the server's 2 decoder ranks: a threshold of 0 is the image without the cache, byte for
    byte; the highest skips the DiT's blocks at every step it may (5 steps: 2 and 3), and the
    usage and /metrics count them."""

    def draw(**extra: Any) -> tuple[bytes, dict[str, int]]:
        body = {"model": MODEL, "prompt": PROMPT, "size": "768x768", "response_format": "b64_json"}
        r = httpx.post(
            f"{server}/v1/images/generations", json={**body, "seed": 21, "num_inference_steps": 5, **extra}, timeout=120
        )
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["data"][0]["b64_json"]), r.json()["usage"]["decoder_details"]

    skipped_before = read_metric(server, "omni_decoder_dit_blocks_total", model_name=MODEL, outcome="skipped")
    plain, plain_blocks = draw()
    zero, zero_blocks = draw(step_cache_threshold=0)
    cached, cached_blocks = draw(step_cache_threshold=1000)
    assert zero == plain and zero_blocks == plain_blocks and plain_blocks["blocks_skipped"] == 0
    assert cached != plain and _png(cached).size == (768, 768)
    assert cached_blocks["blocks_skipped"] > 0
    assert sum(cached_blocks.values()) == plain_blocks["blocks_computed"]  # every block computed or skipped
    skipped = read_metric(server, "omni_decoder_dit_blocks_total", model_name=MODEL, outcome="skipped")
    assert skipped - skipped_before == cached_blocks["blocks_skipped"]


def test_guidance_in_parallel_draws_the_sequential_paths_bytes(server: str, omni_dir: Path, tmp_path: Path) -> None:
    """The session server's 2 decoder ranks run a step's two passes at once (transformer |
    transformer2: --image-guidance-parallel auto); a server of the same flags with it off runs
    them one after the other over a 2-rank Ulysses group. A seed gives the same bytes and block
    counts on both: guided at the default scale, unguided (the twin's group idles), and guided
    hard with the step cache skipping (4 steps: step 2 may). The second server logs its layout."""
    draws = [{}, {"guidance_scale": 0}, {"guidance_scale": 3.0, "step_cache_threshold": 1000}]

    def draw(base: str, extra: dict[str, Any]) -> tuple[bytes, dict[str, int]]:
        body = {"model": MODEL, "prompt": PROMPT, "size": "768x768", "response_format": "b64_json", "seed": 31}
        r = httpx.post(f"{base}/v1/images/generations", json={**body, "num_inference_steps": 4, **extra}, timeout=120)
        assert r.status_code == 200, r.text
        return base64.b64decode(r.json()["data"][0]["b64_json"]), r.json()["usage"]["decoder_details"]

    parallel = [draw(server, extra) for extra in draws]
    log = tmp_path / "server.log"
    args = ("--model", f"omni={omni_dir}", "--max-model-len", "2048", "--diffusion-steps", str(DIFFUSION_STEPS),
            "--vision-decoder-devices", "cpu,cpu", "--image-guidance-parallel", "off")  # fmt: skip
    with running_server(*args, log=log, env={"OMNI_LOG_LEVEL": "INFO"}) as sequential_server:
        sequential = [draw(sequential_server, extra) for extra in draws]
    assert parallel == sequential
    assert len({data for data, _ in parallel}) == len(draws), "each draw is another image"
    assert parallel[2][1]["blocks_skipped"] > 0
    said = "image decoder of omni: 2 devices = 1 group of 2 Ulysses ranks, the guidance's 2 passes one after the other"
    assert said in log.read_text(errors="replace")


def _assert_close(a: Image.Image, b: Image.Image) -> None:
    assert a.size == b.size
    diff = [abs(x - y) for x, y in zip(a.convert("RGB").tobytes(), b.convert("RGB").tobytes())]
    assert max(diff) <= 1
    assert sum(d != 0 for d in diff) <= len(diff) // 1000


def test_n_images_are_distinct_and_seeded(server: str) -> None:
    client = _client(server)
    result = client.images.generate(
        model=MODEL, prompt=PROMPT, n=3, size="656x880", response_format="b64_json", extra_body={"seed": 5}
    )
    assert result.data is not None and len(result.data) == 3
    images = [base64.b64decode(d.b64_json or "") for d in result.data]
    assert len(set(images)) == 3
    # image i has seed + i; drawn in a batch of 3 rather than alone, a pixel may round one step apart
    _assert_close(_png(images[1]), _png(_generate(server, 6, "656x880")))
    assert result.usage is not None and result.usage.output_tokens > 0
    assert result.size == "656x880" and result.output_format == "png"


def test_streamed_images_send_partials_then_the_image(server: str) -> None:
    client = _client(server)
    stream = client.images.generate(
        model=MODEL, prompt=PROMPT, size="768x768", stream=True, partial_images=2,
        extra_body={"seed": 3, "num_inference_steps": 4},
    )  # fmt: skip
    events = list(stream)
    assert [e.type for e in events] == ["image_generation.partial_image"] * 2 + ["image_generation.completed"]
    assert [e.partial_image_index for e in events[:2]] == [0, 1]  # type: ignore[union-attr]
    final = base64.b64decode(events[-1].b64_json)
    assert _png(final).size == (768, 768)
    assert final == _generate(server, 3, num_inference_steps=4)  # streaming changes nothing
    assert all(_png(base64.b64decode(e.b64_json)).size == (768, 768) for e in events[:2])


@pytest.mark.parametrize(
    "body, param",
    [
        ({"size": "1024x1024"}, "size"),
        ({"output_format": "gif"}, "output_format"),
        ({"n": 0}, "n"),
        ({"n": 11}, "n"),
        ({"num_inference_steps": 0}, "num_inference_steps"),
        ({"num_inference_steps": 101}, "num_inference_steps"),
        ({"guidance_scale": 50}, "guidance_scale"),
        ({"style": "vivid"}, "style"),
        ({"partial_images": 2}, "partial_images"),
        ({"step_cache_threshold": -0.1}, "step_cache_threshold"),
        ({"step_cache_threshold": "fast"}, "step_cache_threshold"),
    ],
)
def test_bad_fields_are_400s_naming_them(server: str, body: dict[str, Any], param: str) -> None:
    r = httpx.post(f"{server}/v1/images/generations", json={"model": MODEL, "prompt": "x", **body}, timeout=120)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def _tokenizer(omni_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(omni_dir)


def _chat_with_an_image(omni_dir: Path, **extra: Any) -> dict[str, Any]:
    """A chat body whose reply opens an image span at once (a large logit bias on the opening
    token; the span grammar does the rest) and ends right after it. Its reasoning is skipped: no
    span opens inside one (tests/e2e/test_modalities.py)."""
    start = _tokenizer(omni_dir).token_to_id(START)
    span = 2 + 8 * 9 + 2  # the tiny decoder's 8 x 8 codes
    return {
        "model": MODEL,
        "messages": [{"role": "user", "content": "draw me a boat"}],
        "logit_bias": {str(start): 100},
        "max_tokens": 1 + span,
        "seed": 9,
        "extra_body": {"chat_template_kwargs": {"skip_reasoning": True}} | extra,  # fields the official client does not know
    }


def test_chat_returns_the_image_as_content_parts_streamed_or_not(server: str, omni_dir: Path) -> None:
    """Drawn in 5 steps with the step cache at its highest, so the usage's decoder_details
    count skipped blocks (steps 2 and 3), streamed (the usage chunk) or not, alike."""
    client = _client(server)
    image_options = {"num_inference_steps": 5, "step_cache_threshold": 1000}
    body = _chat_with_an_image(omni_dir, skip_special_tokens=False, image=image_options)
    reply = client.chat.completions.create(**body)
    assert reply.usage is not None and reply.usage.model_extra is not None
    blocks = reply.usage.model_extra["decoder_details"]
    assert blocks["blocks_computed"] > 0 and blocks["blocks_skipped"] > 0
    content = reply.choices[0].message.content
    assert isinstance(content, list), content
    (part,) = [p for p in content if p["type"] == "image_url"]
    texts = [p["text"] for p in content if p["type"] == "text"]
    assert all("<|vision" not in t and START not in t for t in texts)  # no code token reaches the client
    image = _fetch(part["image_url"]["url"])
    assert _png(image).size in set(RATIO_SIZES.values())  # the size its ratio token gives

    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    streamed = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    parts = [p for d in streamed if isinstance(d, list) for p in d]
    text = "".join(d for d in streamed if isinstance(d, str))
    assert "<|vision" not in text and START not in text
    assert len(parts) == 1 and _fetch(parts[0]["image_url"]["url"]) == image  # streamed == not streamed
    assert "".join(texts) == text
    usage = chunks[-1].usage
    assert usage is not None and usage.model_extra is not None and usage.model_extra["decoder_details"] == blocks


def test_chat_image_as_a_data_url(server: str, omni_dir: Path) -> None:
    body = _chat_with_an_image(omni_dir, image={"response_format": "b64_json", "size": "880x656"})
    reply = _client(server).chat.completions.create(**body)
    (part,) = [p for p in reply.choices[0].message.content if p["type"] == "image_url"]  # type: ignore[union-attr]
    url = part["image_url"]["url"]
    assert url.startswith("data:image/png;base64,")
    assert _png(base64.b64decode(url.split(",", 1)[1])).size == (880, 656)


def test_t2i_tool_call_returns_the_image_url(server: str) -> None:
    client = _client(server)
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "paint a red kite"}],
        "tools": [T2I_TOOL],
        "tool_choice": "required",
        "parallel_tool_calls": False,
        "seed": 4,
        "max_tokens": 200,
        # the reference's template opens a reasoning block, which a random model never closes:
        # its README's switch skips it, so the forced call comes at once
        "extra_body": {"chat_template_kwargs": {"skip_reasoning": True}},
    }
    reply = client.chat.completions.create(**body)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    (call,) = choice.message.tool_calls or []
    assert call.function.name == "t2i_model_generation"
    url = json.loads(call.function.arguments)["discrete_image_token"]
    image = _fetch(url)
    assert _png(image).size in set(RATIO_SIZES.values())

    chunks = list(client.chat.completions.create(**body, stream=True))
    arguments = "".join(
        t.function.arguments or ""
        for c in chunks
        if c.choices and c.choices[0].delta.tool_calls
        for t in c.choices[0].delta.tool_calls
        if t.function is not None
    )
    assert _fetch(json.loads(arguments)["discrete_image_token"]) == image  # streamed == not streamed


def test_text_only_modalities_draw_nothing(server: str, omni_dir: Path) -> None:
    body = _chat_with_an_image(omni_dir, modalities=["text"])
    reply = _client(server).chat.completions.create(**body)
    assert isinstance(reply.choices[0].message.content, str)
    assert reply.usage is not None and not reply.usage.model_extra  # a text turn's usage is OpenAI's


def _decoder_ranks(base: str) -> dict[str, int]:
    ranks = {}
    for pid in worker_pids(PROCESSES[base].pid):
        name = Path(f"/proc/{pid}/comm").read_text().strip()
        if name.startswith("omni-vision"):
            ranks[name] = pid
    return ranks


def _kill_a_follower_mid_image(server: str, ranks: dict[str, int], replica: str) -> dict[str, Any]:
    """Start a slow image, and once replica `replica`'s group draws it, kill that group's
    follower; the image's outcome: {"status", "message"} or {"ok"}. The waits are for events,
    not for time: a broken server hangs the test rather than failing it on a slow machine."""
    outcome: dict[str, Any] = {}

    def slow_image() -> None:
        try:
            _generate(server, 1, "1024x576", num_inference_steps=100)
            outcome["ok"] = True
        except openai.APIStatusError as exc:
            outcome["status"] = exc.status_code
            outcome["message"] = exc.message

    thread = threading.Thread(target=slow_image)
    thread.start()
    while read_metric(server, "omni_decoder_replica_images_running", model_name=MODEL, replica=replica) == 0:
        assert thread.is_alive(), f"the image ended before it reached the decoder: {outcome}"
        time.sleep(0.02)
    # The leader is held while the follower is killed: it cannot finish the image meanwhile,
    # however fast its 100 steps run (no bet on a sleep being "well inside" them).
    leader, follower = ranks[f"omni-vision{replica}.0"], ranks[f"omni-vision{replica}.1"]
    os.kill(leader, signal.SIGSTOP)
    try:
        os.kill(follower, signal.SIGKILL)
    finally:
        os.kill(leader, signal.SIGCONT)
    thread.join()
    return outcome


def test_a_killed_decoder_rank_fails_its_image_with_503_and_the_next_succeeds(server: str) -> None:
    ranks = _decoder_ranks(server)
    assert sorted(ranks) == ["omni-vision0.0", "omni-vision0.1"]
    outcome = _kill_a_follower_mid_image(server, ranks, "0")
    assert outcome.get("status") == 503, outcome
    assert "vision decoder" in outcome["message"]
    while True:  # the group restarts as a whole; meanwhile an image is refused with a 503
        try:
            data = _generate(server, 2, "768x768")
            break
        except openai.APIStatusError as exc:
            assert exc.status_code == 503
            time.sleep(0.5)
    assert _png(data).size == (768, 768)
    restarted = _decoder_ranks(server)
    assert sorted(restarted) == sorted(ranks) and not set(restarted.values()) & set(ranks.values())  # both ranks anew


def test_a_killed_replica_fails_only_its_image_and_the_other_serves_while_it_restarts(omni_dir: Path) -> None:
    """A server of its own (stopped at the end): 2 replicas, each 2 guidance-parallel ranks."""
    args = ("--model", f"omni={omni_dir}", "--max-model-len", "2048", "--diffusion-steps", str(DIFFUSION_STEPS),
            "--vision-decoder-devices", "cpu,cpu,cpu,cpu", "--vision-decoder-replicas", "2", "--no-audio-output")  # fmt: skip
    with running_server(*args) as server:
        ranks = _decoder_ranks(server)
        assert sorted(ranks) == ["omni-vision0.0", "omni-vision0.1", "omni-vision1.0", "omni-vision1.1"]
        outcome = _kill_a_follower_mid_image(server, ranks, "0")  # both replicas idle: it goes to the first
        assert outcome.get("status") == 503, outcome
        assert "vision decoder" in outcome["message"]
        # no 503 meanwhile: replica 1 draws while replica 0's group restarts (or replica 0, once back)
        assert _png(_generate(server, 2, "768x768")).size == (768, 768)
        group = ("omni-vision0.0", "omni-vision0.1")
        while not all(_decoder_ranks(server).get(n, ranks[n]) != ranks[n] for n in group):
            time.sleep(0.5)  # replica 0's group restarts as a whole
        restarted = _decoder_ranks(server)
        others = ("omni-vision1.0", "omni-vision1.1")
        assert {n: restarted[n] for n in others} == {n: ranks[n] for n in others}  # replica 1 untouched


def test_a_span_cut_short_by_max_tokens_gives_no_image(server: str, omni_dir: Path) -> None:
    body = _chat_with_an_image(omni_dir)
    body["max_tokens"] = 20  # the span needs 76
    reply = _client(server).chat.completions.create(**body)
    choice = reply.choices[0]
    assert choice.finish_reason == "length"
    assert isinstance(choice.message.content, str) and "<|vision" not in choice.message.content


def test_image_in_image_out(server: str) -> None:
    """An input image and an edit instruction: the encoders read the picture, and the reply's
    t2i_model_generation call draws the new one."""
    buf = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buf, format="PNG")
    picture = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    reply = _client(server).chat.completions.create(
        model=MODEL,
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": picture}},
                    {"type": "text", "text": "make it a cartoon"},
                ],
            }
        ],
        tools=[T2I_TOOL],  # type: ignore[list-item]
        tool_choice="required",
        parallel_tool_calls=False,
        seed=8,
        max_tokens=200,
        extra_body={"chat_template_kwargs": {"skip_reasoning": True}},  # see the t2i test above
    )
    (call,) = reply.choices[0].message.tool_calls or []
    assert reply.usage is not None and reply.usage.prompt_tokens > 30  # the picture's codes and features are in
    assert _png(_fetch(json.loads(call.function.arguments)["discrete_image_token"])).size in set(RATIO_SIZES.values())
