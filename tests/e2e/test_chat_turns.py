"""The chat template fields through the real server: continue_final_message with echo, and
add_generation_prompt."""

from __future__ import annotations

import json

import httpx

MODEL = "omni-tiny"


def _post(server: str, **fields: object) -> dict:
    r = httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, "max_tokens": 4, "seed": 0, **fields}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def test_echo_returns_the_continued_turn_whole(server: str) -> None:
    messages = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello, wor"}]
    cont = _post(server, messages=messages, continue_final_message=True, add_generation_prompt=False)
    echoed = _post(server, messages=messages, continue_final_message=True, add_generation_prompt=False, echo=True)
    assert echoed["choices"][0]["message"]["content"] == "Hello, wor" + cont["choices"][0]["message"]["content"]
    # continuing leaves the turn open: fewer prompt tokens than the closed turn plus a new one
    fresh = _post(server, messages=messages)
    assert cont["usage"]["prompt_tokens"] < fresh["usage"]["prompt_tokens"]
    with httpx.stream(
        "POST",
        f"{server}/v1/chat/completions",
        json={"model": MODEL, "messages": messages, "max_tokens": 4, "seed": 0, "stream": True,
              "continue_final_message": True, "add_generation_prompt": False, "echo": True},
        timeout=120,
    ) as r:
        text = ""
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text += choice["delta"].get("content") or ""
    assert text == echoed["choices"][0]["message"]["content"]


def test_echo_is_nothing_when_the_last_turn_is_not_the_assistants(server: str) -> None:
    plain = _post(server, messages=[{"role": "user", "content": "Hi"}])
    echoed = _post(server, messages=[{"role": "user", "content": "Hi"}], echo=True)
    assert echoed["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]


def test_without_a_generation_prompt_the_prompt_is_shorter(server: str) -> None:
    messages = [{"role": "user", "content": "Hi"}]
    with_prompt = _post(server, messages=messages)
    without = _post(server, messages=messages, add_generation_prompt=False)
    assert without["usage"]["prompt_tokens"] < with_prompt["usage"]["prompt_tokens"]


def test_text_parts_are_the_same_prompt_as_the_text_they_join_to(server: str) -> None:
    """Text parts join with "\\n" (vLLM's join) and count as that string does, for every role;
    a continued turn sent as parts echoes its joined text."""
    def parts(*texts: str) -> list[dict]:
        return [{"type": "text", "text": t} for t in texts]

    def turns(system: object, user: object, assistant: object) -> list[dict]:
        return [{"role": "system", "content": system}, {"role": "user", "content": user},
                {"role": "assistant", "content": assistant}]  # fmt: skip

    as_parts = _post(server, messages=turns(parts("Be brief", "."), parts("Say", "hello."), parts("Hello,", "wor")),
                     continue_final_message=True, add_generation_prompt=False, echo=True)  # fmt: skip
    as_text = _post(server, messages=turns("Be brief\n.", "Say\nhello.", "Hello,\nwor"),
                    continue_final_message=True, add_generation_prompt=False, echo=True)  # fmt: skip
    assert as_parts["usage"]["prompt_tokens"] == as_text["usage"]["prompt_tokens"]
    assert as_parts["choices"][0]["message"]["content"] == as_text["choices"][0]["message"]["content"]
    assert as_parts["choices"][0]["message"]["content"].startswith("Hello,\nwor")
