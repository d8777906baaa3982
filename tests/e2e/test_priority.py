"""--scheduling-policy priority served (issue 37 item 1): vLLM's launch line starts, the priority
field is taken on chat, completions and responses, and a value of the wrong type or out of
bounds is a 400 naming it. Under the default fcfs (the session's server) a non-zero priority is
a 400 on the Responses API too, as on chat and completions (tests/e2e/test_request_fields.py).
The scheduling itself is tests/scheduler/test_waiting_queue.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.server import running_server

MODEL = "tiny"


@pytest.fixture(scope="module")
def prioritised(tiny_model_dir: Path) -> Iterator[str]:
    with running_server("--model", f"{MODEL}={tiny_model_dir}", "--scheduling-policy", "priority", "--max-num-seqs", "2",
                        "--max-model-len", "512") as base:  # fmt: skip
        yield base


def post(base: str, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{base}{path}", json={"model": MODEL, **body}, timeout=120)


CHAT = ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
COMPLETION = ("/v1/completions", {"prompt": "hi", "max_tokens": 4})
RESPONSE = ("/v1/responses", {"input": "hi", "max_output_tokens": 4})


@pytest.mark.parametrize(("path", "body"), [CHAT, COMPLETION, RESPONSE])
def test_priorities_are_served_and_checked(prioritised: str, path: str, body: dict[str, Any]) -> None:
    for priority in (-5, 0, 7):
        r = post(prioritised, path, body | {"priority": priority})
        assert r.status_code == 200, r.text
    for bad in ("high", 1.5, 2**40):
        r = post(prioritised, path, body | {"priority": bad})
        assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text


def test_responses_refuse_a_priority_under_fcfs(server: str) -> None:
    r = httpx.post(f"{server}/v1/responses", json={"model": "omni-tiny", "input": "hi", "priority": 2}, timeout=120)
    assert r.status_code == 400, r.text
    assert (r.json()["error"]["param"], r.json()["error"]["code"]) == ("priority", "unsupported_parameter")
