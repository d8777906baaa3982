"""vLLM's tokenizer and probe endpoints on the real server: /tokenize agrees with the
tokenizer and with a chat completion's usage, /detokenize round-trips, /version and /ping answer."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from omni.http.handlers.system import package_version
from omni.text.tokenizer import TextTokenizer

MODEL = "omni-tiny"
TEXT = "The quick brown fox jumps over the lazy dog."
MESSAGES = [
    {"role": "system", "content": "You answer briefly."},
    {"role": "user", "content": "Hello there, how are you today?"},
]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_model_dir)


def test_a_prompt_is_the_tokenizers_ids(server: str, tokenizer: TextTokenizer) -> None:
    r = httpx.post(f"{server}/tokenize", json={"model": MODEL, "prompt": TEXT, "return_token_strs": True}, timeout=120)
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tokenizer.encode(TEXT)
    assert body == {
        "count": len(ids),
        "max_model_len": 1024,
        "tokens": ids,
        "token_strs": [tokenizer.backend.id_to_token(t) for t in ids],
    }


def test_messages_count_what_a_chat_completion_reports(server: str) -> None:
    r = httpx.post(f"{server}/tokenize", json={"messages": MESSAGES}, timeout=120)  # model: the only one
    assert r.status_code == 200, r.text
    chat = httpx.post(
        f"{server}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 1},
        timeout=120,
    )
    assert chat.status_code == 200, chat.text
    assert r.json()["count"] == chat.json()["usage"]["prompt_tokens"]


def test_detokenize_round_trips(server: str, tokenizer: TextTokenizer) -> None:
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    r = httpx.post(f"{server}/detokenize", json={"model": MODEL, "tokens": ids}, timeout=120)
    assert r.status_code == 200, r.text
    assert r.json() == {"prompt": TEXT}


@pytest.mark.parametrize("tokens", [[1, "x"], [-1], [10**9], "1 2"])
def test_bad_tokens_are_a_400_naming_tokens(server: str, tokens: object) -> None:
    r = httpx.post(f"{server}/detokenize", json={"model": MODEL, "tokens": tokens}, timeout=120)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "tokens"


def test_version_and_ping_answer(server: str) -> None:
    r = httpx.get(f"{server}/version", timeout=120)
    assert (r.status_code, r.json()) == (200, {"version": package_version()})
    for method in ("GET", "POST"):
        r = httpx.request(method, f"{server}/ping", timeout=120)
        assert (r.status_code, r.json()) == (200, {"status": "ok"})
