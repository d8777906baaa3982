"""The playground page (issue 25, acceptance 3) in headless Chromium, against one server of the
embedded omni layout that requires an API key and serves under a root path.

Chromium (Debian's package, which bin/setup's test mode installs) is driven over the DevTools
protocol (a websocket, the `websockets` package): the test types into the page and clicks as a
user would, then reads what the page shows (DOM text) and the counters it keeps in data
attributes (SSE chunks, audio bytes and chunks received, images, responses). Its microphone is
Chromium's fake device playing a wav that espeak-ng spoke (16-bit PCM, played once).

Every call the page makes goes to a server with --api-key: the answers prove that its fetches
and its WebSocket (the key as the subprotocol `openai-insecure-api-key.<key>`) carried the key;
a page given a wrong key gets the 401 instead.

The server serves the embedded default (what a bare omni-serve serves: its generation defaults
skip the reasoning block) and, where SmolLM2 is cached or fetchable, SmolLM2 beside it, as a
bare omni-serve does: the chat tab opens on SmolLM2, the images and voice tabs on the omni model.
The tiny model is random: a logit bias on <|im_end|> (an extra request field, typed into the
page's "more fields" box) ends its text soon so its speech follows quickly, and
one on the image span's opening token makes it draw (as tests/e2e/test_images.py does).
"""

from __future__ import annotations

import base64
import itertools
import json
import subprocess
import time
import urllib.request
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from PIL import Image
from websockets.sync.client import ClientConnection, connect

from gpu_workers.tiny.published import default_checkpoint_dir
from gpu_workers.tiny.smollm2 import SmolLM2Unavailable, smollm2_gguf
from omni.text.constrained.image_span import START
from omni.text.tokenizer import TextTokenizer
from tests.e2e.audio import spoken
from tests.e2e.chromium import CHROMIUM, HEADLESS
from tests.e2e.conftest import DIFFUSION_STEPS
from tests.e2e.server import running_server

KEY = "sk-playground-test"
ROOT = "/omni"
MODEL = "omni"
TURN_S = 240.0  # a turn on the tiny model takes seconds; the bound only keeps a failure from hanging

pytestmark = pytest.mark.skipif(
    CHROMIUM is None, reason="chromium is not installed (bin/setup test installs Debian's package where apt-get can)"
)


class Page:
    """One tab of a running Chromium, over the DevTools protocol: evaluate JavaScript in it."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.ids = itertools.count(1)

    def call(self, method: str, timeout: float = 120.0, **params: Any) -> dict[str, Any]:
        n = next(self.ids)
        self.ws.send(json.dumps({"id": n, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:  # events (none subscribed) and other answers are skipped
            message = json.loads(self.ws.recv(timeout=max(deadline - time.monotonic(), 0.01)))
            if message.get("id") == n:
                assert "error" not in message, message
                return message["result"]

    def js(self, expression: str) -> Any:
        """The value of the expression (awaited), run as if from a user's click (autoplay). A DOM
        node comes back as {}: test for one with `!!`."""
        result = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True,
                           userGesture=True)  # fmt: skip
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait(self, expression: str, timeout: float, what: str) -> Any:
        deadline = time.monotonic() + timeout
        while not (value := self.js(expression)):
            if time.monotonic() > deadline:
                shown = self.js("[document.querySelector('main').innerText, document.getElementById('status').textContent, "
                                "[...document.querySelectorAll('#voice-events li')].map(li => li.textContent).join('\\n')].join('\\n')")  # fmt: skip
                raise AssertionError(f"{what}: not within {timeout:.0f} s; the page shows: {shown[-3000:]}")
            time.sleep(0.25)
        return value

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete' && !!document.getElementById('model')", 120, "the page loads")

    def pick_files(self, selector: str, *paths: Path) -> None:
        """The files chosen in the file input, as its file chooser sets them (change fires)."""
        root = self.call("DOM.getDocument")["root"]["nodeId"]
        node = self.call("DOM.querySelector", nodeId=root, selector=selector)["nodeId"]
        self.call("DOM.setFileInputFiles", nodeId=node, files=[str(p) for p in paths])

    def use_key(self, key: str) -> None:
        self.js(f"document.getElementById('api-key').value = {json.dumps(key)}; "
                "document.querySelector('#key-form button').click()")  # fmt: skip
        self.wait("document.body.dataset.models", 120, "the model list")


@pytest.fixture(scope="module")
def embedded_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded default, built as a bare omni-serve builds it (into its own cache root)."""
    return default_checkpoint_dir(tmp_path_factory.mktemp("cache"))


@pytest.fixture(scope="module")
def smollm2() -> Path | None:
    try:
        return smollm2_gguf()
    except SmolLM2Unavailable:
        return None  # the omni model alone: the test of the chat tab's trained model is skipped


@pytest.fixture(scope="module")
def server(embedded_dir: Path, smollm2: Path | None) -> Iterator[str]:
    beside = ("--model", f"smollm2={smollm2}") if smollm2 is not None else ()
    with running_server(
        "--model", f"{MODEL}={embedded_dir}", *beside, "--max-model-len", "2048", "--diffusion-steps", str(DIFFUSION_STEPS),
        "--api-key", KEY, "--root-path", ROOT, timeout=300.0,
    ) as base:  # fmt: skip
        yield base


@pytest.fixture(scope="module")
def bias(server: str, embedded_dir: Path) -> dict[str, int]:
    """Token ids of <|im_end|> and of the image span's opening token."""
    tokens = httpx.post(f"{server}{ROOT}/tokenize", headers={"Authorization": f"Bearer {KEY}"},
                        json={"model": MODEL, "prompt": "<|im_end|>", "add_special_tokens": False}, timeout=120).json()["tokens"]  # fmt: skip
    assert len(tokens) == 1
    return {"end": tokens[0], "draw": TextTokenizer.from_dir(embedded_dir).token_to_id(START)}


@pytest.fixture(scope="module")
def speech_wav(tmp_path_factory: pytest.TempPathFactory) -> Path:
    clip = spoken("Hello, what is the weather like in Seoul today?", 48000, silence_s=3.0)
    if clip is None:
        pytest.skip("espeak-ng is not installed (bin/setup test installs it)")
    samples = np.concatenate([np.zeros(24000, dtype=np.float32), clip])  # half a second before the speech
    path = tmp_path_factory.mktemp("mic") / "speech.wav"
    with wave.open(str(path), "wb") as out:  # Chromium's fake microphone reads 16-bit PCM
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(48000)
        out.writeframes((np.clip(samples, -1, 1) * 32767).astype("<i2").tobytes())
    return path


@pytest.fixture(scope="module")
def page(speech_wav: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    assert CHROMIUM is not None
    profile = tmp_path_factory.mktemp("profile")
    log = (profile.parent / "chromium.log").open("wb")
    proc = subprocess.Popen(
        [
            CHROMIUM,
            *HEADLESS,
            "--autoplay-policy=no-user-gesture-required",
            "--use-fake-ui-for-media-stream",  # the microphone is allowed without asking
            "--use-fake-device-for-media-stream",
            f"--use-file-for-fake-audio-capture={speech_wav}%noloop",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",  # Chromium picks one and writes it to DevToolsActivePort
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=log,
    )
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 120  # a hang guard
        while not (active.exists() and len(active.read_text().split()) == 2):
            assert proc.poll() is None and time.monotonic() < deadline, "chromium did not open its DevTools port"
            time.sleep(0.1)
        port = active.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=120) as r:
            target = next(t for t in json.load(r) if t["type"] == "page")
        with connect(target["webSocketDebuggerUrl"], max_size=None, open_timeout=120) as ws:
            yield Page(ws)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _send_chat(page: Page, text: str, extra: dict[str, Any], *, speak: bool) -> dict[str, str]:
    page.js(f"document.getElementById('chat-extra').value = {json.dumps(json.dumps(extra))}; "
            f"document.getElementById('chat-speak').checked = {json.dumps(speak)}; "
            f"document.getElementById('chat-input').value = {json.dumps(text)}; "
            "document.getElementById('chat-send').click()")  # fmt: skip
    page.wait("document.getElementById('chat').dataset.state !== 'streaming'", TURN_S, "the chat answer")
    return dict(page.js("({...document.getElementById('chat').dataset})"))


def _pick(page: Page, model: str) -> None:
    page.js(f"(s => {{ s.value = {json.dumps(model)}; s.dispatchEvent(new Event('change')); }})(document.getElementById('model'))")


def test_the_chat_tab_streams_a_spoken_answer_and_shows_a_drawn_image(server: str, page: Page, bias: dict[str, int]) -> None:
    """On the embedded default, with no field about reasoning: its generation defaults skip the
    block the reference's template opens, which random weights rarely close."""
    page.open(f"{server}{ROOT}/playground")
    page.use_key(KEY)
    _pick(page, MODEL)  # chat may open on SmolLM2 (the next test's)
    assert page.js("document.getElementById('model').value") == MODEL

    quick = {"logit_bias": {str(bias["end"]): 4}, "max_tokens": 200, "seed": 3}
    said = _send_chat(page, "Say hello.", quick, speak=True)
    answer = page.js("document.querySelector('#chat-log .msg.assistant:last-child .text').textContent")
    assert said["state"] == "done", answer
    assert int(said["chunks"]) > 2  # streamed: the role, then its text and audio in pieces
    assert int(said["audioChunks"]) >= 1 and int(said["audioBytes"]) >= 2 * 24000 * 0.16  # PCM16, at least a first chunk
    assert answer.strip(), "the spoken answer's transcript is shown"

    page.js("document.getElementById('chat-clear').click()")
    span = 1 + 2 + 8 * 9 + 2  # the opening token, then the tiny decoder's 8 x 8 codes with their markup
    drawn = _send_chat(page, "draw me a boat", {"logit_bias": {str(bias["draw"]): 100}, "max_tokens": span, "seed": 9}, speak=False)
    assert drawn["state"] == "done" and drawn["images"] == "1", drawn
    size = page.wait("(i => i && i.complete && i.naturalWidth ? [i.naturalWidth, i.naturalHeight] : null)"
                     "(document.querySelector('#chat-log .msg.assistant img'))", 120, "the drawn image loads")  # fmt: skip
    assert min(size) >= 512  # the decoder's size for its ratio token (tests/e2e/test_images.py checks which)


def test_chat_opens_on_the_trained_model_at_a_low_temperature_and_the_other_tabs_on_the_omni_model(
    server: str, page: Page, smollm2: Path | None
) -> None:
    if smollm2 is None:
        pytest.skip("SmolLM2's GGUF is neither cached nor fetchable: no trained model to open chat on")
    page.open(f"{server}{ROOT}/playground")
    page.use_key(KEY)
    model = "document.getElementById('model').value"
    assert page.js(model) == "smollm2"
    fields = json.loads(page.js("document.getElementById('chat-extra').value"))
    assert fields["temperature"] <= 0.5, fields  # SmolLM2's card samples at 0.2
    said = _send_chat(page, "What is the capital of France?", fields | {"seed": 0}, speak=False)
    answer = page.js("document.querySelector('#chat-log .msg.assistant:last-child .text').textContent")
    assert said["state"] == "done" and answer.strip(), answer
    for tab, expected in (("images", MODEL), ("voice", MODEL), ("chat", "smollm2")):
        page.js(f"document.querySelector('[data-tab={tab}]').click()")
        assert page.js(model) == expected, tab
    _pick(page, MODEL)  # a tab keeps the user's pick
    page.js("document.querySelector('[data-tab=images]').click(); document.querySelector('[data-tab=chat]').click()")
    assert page.js(model) == MODEL


def test_the_embedded_defaults_answers_are_not_swallowed_by_reasoning(server: str, bias: dict[str, int]) -> None:
    """Asked for a spoken answer within 150 tokens, the embedded default answers outside a
    reasoning block every time (the reference's template opens one, and its random weights
    rarely close it: before its generation defaults skipped it, 5 of 6 such answers were empty).
    Its speech follows when its text ends (a bias on <|im_end|> ends it soon): every one speaks.
    reasoning_effort still opens the block, as on the reference model."""
    auth = {"Authorization": f"Bearer {KEY}"}
    spoken = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 150,
              "modalities": ["text", "audio"], "audio": {"voice": "fkms", "format": "wav"}}  # fmt: skip
    for seed in range(6):
        for extra in ({}, {"logit_bias": {str(bias["end"]): 4}}):
            r = httpx.post(f"{server}{ROOT}/v1/chat/completions", headers=auth, json=spoken | extra | {"seed": seed}, timeout=TURN_S)
            message = r.json()["choices"][0]["message"]
            assert r.status_code == 200 and message.get("reasoning_content") is None, message
            said = (message.get("audio") or {}).get("transcript") or message.get("content")
            if extra:  # it speaks; its text may be empty (the bias can end it at the first token)
                assert message["audio"]["data"], message
            else:
                assert said, message
    thinking = httpx.post(f"{server}{ROOT}/v1/chat/completions", headers=auth, timeout=TURN_S,
                          json=spoken | {"seed": 0, "max_tokens": 8, "reasoning_effort": "high", "modalities": ["text"]})  # fmt: skip
    assert thinking.json()["choices"][0]["message"]["reasoning_content"], thinking.json()


# Before a spoken turn's text left room for its speech, 4 of these 6 seeds' text ran to max_tokens
# and nothing was spoken.
SPOKEN_SEEDS = range(6)


@pytest.mark.parametrize("stream", [False, True])
def test_every_turn_that_asks_for_audio_within_150_tokens_speaks(server: str, stream: bool) -> None:
    """No bias to end the text: the text gets its share of max_tokens (a ninth), a text that runs
    to it is cut ("length") and spoken all the same, and the whole turn stays within max_tokens."""
    auth = {"Authorization": f"Bearer {KEY}"}
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 150,
            "modalities": ["text", "audio"], "audio": {"voice": "fkms", "format": "pcm16" if stream else "wav"},
            "stream": stream, "stream_options": {"include_usage": True} if stream else None}  # fmt: skip
    for seed in SPOKEN_SEEDS:
        r = httpx.post(f"{server}{ROOT}/v1/chat/completions", headers=auth, json=body | {"seed": seed}, timeout=TURN_S)
        assert r.status_code == 200, r.text
        if not stream:
            out = r.json()
            choice, usage = out["choices"][0], out["usage"]
            audio = choice["message"]["audio"]
            assert audio is not None and audio["data"], (seed, choice)
            finish, pcm = choice["finish_reason"], b""
        else:
            events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]
            deltas = [c for e in events for c in e["choices"]]
            pcm = b"".join(base64.b64decode((c["delta"].get("audio") or {}).get("data") or "") for c in deltas)
            finish = next(c["finish_reason"] for c in deltas if c["finish_reason"] is not None)
            usage = events[-1]["usage"]
            assert len(pcm) >= 2 * 24000 * 0.12, seed  # PCM16: at least the least span's 3 units
        assert finish in ("stop", "length"), seed
        assert usage["completion_tokens"] <= 150, (seed, usage)


@pytest.fixture(scope="module")
def picture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("picture") / "boat.png"
    pixels = (np.random.default_rng(5).random((90, 120, 3)) * 255).astype(np.uint8)
    Image.fromarray(pixels).save(path, format="PNG")
    return path


def test_the_voice_tab_shows_an_image_then_the_users_transcript_and_receives_audio(
    server: str, page: Page, bias: dict[str, int], picture: Path
) -> None:
    """Issue 37 acceptance 7: an image picked in the voice tab before the call joins the
    conversation (conversation.item.added), and the spoken turn's answer has it in its prompt."""
    page.open(f"{server}{ROOT}/playground")
    page.use_key(KEY)
    extra = {"logit_bias": {str(bias["end"]): 8}, "seed": 3, "max_output_tokens": 200}
    page.js("document.querySelector('[data-tab=voice]').click()")
    page.pick_files("#voice-image", picture)  # as the file chooser gives it
    page.wait("!!document.querySelector('#voice-log .msg.user img')", 120, "the picked image is shown")
    page.js(f"document.getElementById('voice-extra').value = {json.dumps(json.dumps(extra))}; "
            "document.getElementById('voice-start').click()")  # fmt: skip
    page.wait("document.getElementById('voice').dataset.state === 'live'", 120, "the microphone starts")
    page.wait("document.getElementById('voice').dataset.images === '1'", 120, "the image joins the conversation")
    assert page.js("document.querySelector('#voice-log .msg.user img').closest('.msg').dataset.image") == "added"
    page.wait("!!document.querySelector('#voice-log .msg.user[data-transcribed]')", TURN_S, "the user's transcript")
    page.wait("Number(document.getElementById('voice').dataset.responses) >= 1", TURN_S, "the spoken answer")
    voice = dict(page.js("({...document.getElementById('voice').dataset})"))
    assert int(voice["imageTokens"]) > 0, voice  # the answer's prompt held the image
    user = page.js("document.querySelector('#voice-log .msg.user[data-transcribed]').dataset.transcribed")
    transcript = page.js("document.querySelector('#voice-log .msg.user[data-transcribed] .text').textContent")
    assert user == "true" and transcript.strip(), transcript
    assert int(voice["audioChunks"]) >= 1 and int(voice["audioBytes"]) >= 2 * 24000 * 0.16, voice
    assert page.js("!!document.querySelector('#voice-log .msg.assistant')")
    assert page.js("document.querySelectorAll('#voice-log .note.error').length") == 0, page.js(
        "document.getElementById('voice-log').innerText"
    )
    page.js("document.getElementById('voice-stop').click()")


def test_a_wrong_key_is_refused_to_the_page(server: str, page: Page) -> None:
    page.open(f"{server}{ROOT}/playground")
    page.use_key("sk-wrong")
    assert page.js("document.body.dataset.models") == "error"
    assert "401: Incorrect API key provided." in page.js("document.getElementById('status').textContent")
    page.js("document.querySelector('[data-tab=voice]').click(); document.getElementById('voice-start').click()")
    page.wait("document.getElementById('voice').dataset.state === 'error'", 120, "the refused WebSocket")
