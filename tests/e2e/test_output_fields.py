"""vLLM's output fields through the real server: prompt_logprobs, echo (with max_tokens 0),
text_offset where special tokens occur, suffix, include_stop_str_in_output,
return_tokens_as_token_ids, truncate_prompt_tokens, continuous_usage_stats, request_id and a
literal extra_body.

The tiny checkpoint's weights are random: outputs are made certain by construction (+100
biases), and values against a reference are tests/e2e/test_prompt_logprobs_parity.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest

from omni.text.tokenizer import TextTokenizer

MODEL = "omni-tiny"
PROMPT = "The quick brown fox"
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"
# chat.py and chat_completion() do not pass these fields on yet (their owner wires them)


@pytest.fixture(scope="module")
def client(server: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server, timeout=120) as c:
        yield c


@pytest.fixture(scope="module")
def tok(tiny_model_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_model_dir)


def token(tok: TextTokenizer, text: str) -> int:
    token_id = tok.token_to_id(text)
    if token_id is None:
        (token_id,) = tok.encode(text, add_special_tokens=False)
    return token_id


def post(client: httpx.Client, path: str, **fields: Any) -> dict[str, Any]:
    body = {"model": MODEL, **({"messages": HELLO} if path == CHAT else {"prompt": PROMPT}), **fields}
    r = client.post(path, json=body)
    assert r.status_code == 200, r.text
    return dict(r.json())


def refused(client: httpx.Client, path: str, **fields: Any) -> str:
    """The param a 400 names."""
    body = {"model": MODEL, **({"messages": HELLO} if path == CHAT else {"prompt": PROMPT}), **fields}
    r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    return str(r.json()["error"]["param"])


def stream(client: httpx.Client, path: str, **fields: Any) -> list[dict[str, Any]]:
    body = {"model": MODEL, **({"messages": HELLO} if path == CHAT else {"prompt": PROMPT}), "stream": True, **fields}
    chunks = []
    with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunks.append(json.loads(line[6:]))
    return chunks


def pieces(text: str, offsets: list[int]) -> list[str]:
    return [text[a:b] for a, b in zip(offsets, [*offsets[1:], len(text)])]


# ---- prompt_logprobs and echo -----------------------------------------------------------


def test_prompt_logprobs_list_each_prompt_token_and_its_alternatives(client: httpx.Client, tok: TextTokenizer) -> None:
    ids = tok.encode(PROMPT)
    body = post(client, COMPLETIONS, max_tokens=2, prompt_logprobs=2, n=2, seed=1)
    for choice in body["choices"]:  # on each choice, as vLLM answers
        plp = choice["prompt_logprobs"]
        assert plp[0] is None and len(plp) == len(ids) == body["usage"]["prompt_tokens"]
        for q in range(1, len(ids)):
            entry = plp[q]
            assert next(iter(entry)) == str(ids[q])  # the prompt token first
            assert entry[str(ids[q])]["decoded_token"] == tok.decode([ids[q]], skip_special_tokens=False)
            assert {1, 2} <= {v["rank"] for v in entry.values()} and len(entry) in (2, 3)
            assert all(v["logprob"] <= 0 for v in entry.values())
    assert refused(client, COMPLETIONS, prompt_logprobs=1, stream=True) == "prompt_logprobs"


def test_chat_prompt_logprobs_are_at_the_top_level(client: httpx.Client) -> None:
    body = post(client, CHAT, max_tokens=2, prompt_logprobs=1)
    plp = body["prompt_logprobs"]
    assert plp[0] is None and len(plp) == body["usage"]["prompt_tokens"]


def test_echo_puts_the_prompt_and_its_logprobs_first(client: httpx.Client, tok: TextTokenizer) -> None:
    ids = tok.encode(PROMPT)
    body = post(client, COMPLETIONS, max_tokens=3, echo=True, logprobs=1, temperature=0)
    choice = body["choices"][0]
    plain = post(client, COMPLETIONS, max_tokens=3, temperature=0)["choices"][0]["text"]
    assert choice["text"] == PROMPT + plain
    lp = choice["logprobs"]
    assert len(lp["tokens"]) == len(ids) + 3
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(v is not None for v in lp["token_logprobs"][1:])
    assert pieces(choice["text"], lp["text_offset"])[: len(ids)] == [tok.decode([t]) for t in ids]
    assert body["usage"]["completion_tokens"] == 3
    chunks = stream(client, COMPLETIONS, max_tokens=3, echo=True, logprobs=1, temperature=0)
    assert chunks[0]["choices"][0]["text"].startswith(PROMPT)  # the prompt rides on the first chunk
    assert "".join(c["choices"][0]["text"] for c in chunks) == choice["text"]
    assert [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]] == lp["text_offset"]


def test_echo_with_max_tokens_zero_returns_the_prompt_scored(client: httpx.Client, tok: TextTokenizer) -> None:
    ids = tok.encode(PROMPT)
    body = post(client, COMPLETIONS, max_tokens=0, echo=True, logprobs=0)
    choice = body["choices"][0]
    assert (choice["text"], choice["finish_reason"]) == (PROMPT, "length")
    assert (body["usage"]["prompt_tokens"], body["usage"]["completion_tokens"]) == (len(ids), 0)
    lp = choice["logprobs"]
    assert lp["tokens"] == [tok.decode([t]) for t in ids] and lp["token_logprobs"][0] is None
    # the same numbers as a generating request's prompt_logprobs
    plp = post(client, COMPLETIONS, max_tokens=1, prompt_logprobs=0)["choices"][0]["prompt_logprobs"]
    assert lp["token_logprobs"][1:] == pytest.approx([plp[q][str(t)]["logprob"] for q, t in enumerate(ids) if q])
    assert post(client, COMPLETIONS, max_tokens=0, echo=True)["choices"][0]["text"] == PROMPT
    streamed = stream(client, COMPLETIONS, max_tokens=0, echo=True, logprobs=0)
    assert [(c["choices"][0]["text"], c["choices"][0]["finish_reason"]) for c in streamed] == [(PROMPT, "length")]
    assert refused(client, COMPLETIONS, max_tokens=0) == "max_tokens"
    assert refused(client, CHAT, max_tokens=0) == "max_tokens"


# ---- text_offset --------------------------------------------------------------------------


@pytest.mark.parametrize("skip", [True, False])
def test_text_offsets_index_the_text_where_special_tokens_occur(client: httpx.Client, tok: TextTokenizer, skip: bool) -> None:
    special, y = token(tok, "<|im_start|>"), token(tok, "y")
    fields = {
        "max_tokens": 24, "temperature": 1.0, "seed": 11, "logprobs": 0, "skip_special_tokens": skip,
        "logit_bias": {str(special): 100, str(y): 100},  # a random mix of the two
    }  # fmt: skip
    choice = post(client, COMPLETIONS, **fields)["choices"][0]
    names = choice["logprobs"]["tokens"]
    assert {"y", "<|im_start|>"} == set(names)
    assert choice["text"] == "".join(n for n in names if n == "y" or not skip)
    want = ["" if skip and n != "y" else n for n in names]
    assert pieces(choice["text"], choice["logprobs"]["text_offset"]) == want
    chunks = stream(client, COMPLETIONS, **fields)
    assert [o for c in chunks for o in c["choices"][0]["logprobs"]["text_offset"]] == choice["logprobs"]["text_offset"]
    # echoed, a prompt of token ids with specials in it decodes as the output does
    ids = [special, *tok.encode("Hi", add_special_tokens=False), special]
    echoed = post(client, COMPLETIONS, prompt=ids, echo=True, max_tokens=0, logprobs=0, skip_special_tokens=skip)
    choice = echoed["choices"][0]
    assert choice["text"] == ("Hi" if skip else "<|im_start|>Hi<|im_start|>")
    assert pieces(choice["text"], choice["logprobs"]["text_offset"]) == [tok.decode([t], skip_special_tokens=skip) for t in ids]


# ---- the other fields -----------------------------------------------------------------


def test_suffix_is_a_400_naming_it(client: httpx.Client) -> None:
    r = client.post(COMPLETIONS, json={"model": MODEL, "prompt": PROMPT, "suffix": " the end."})
    assert r.status_code == 400
    error = r.json()["error"]
    assert (error["param"], error["code"]) == ("suffix", "unsupported_parameter")
    assert "fill in the middle" in error["message"]


def _stop_fields(tok: TextTokenizer, include: bool) -> dict[str, Any]:
    y = token(tok, "y")
    return {"max_tokens": 8, "logit_bias": {str(y): 100}, "stop": ["yy"], "include_stop_str_in_output": include}


@pytest.mark.parametrize(("include", "text"), [(False, ""), (True, "yy")])
def test_include_stop_str_in_output_on_completions(client: httpx.Client, tok: TextTokenizer, include: bool, text: str) -> None:
    choice = post(client, COMPLETIONS, **_stop_fields(tok, include))["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (text, "stop", "yy")
    chunks = stream(client, COMPLETIONS, **_stop_fields(tok, include))
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    # vLLM's stop_reason names the stop string, on the chunk that finishes the choice only
    assert [c["choices"][0].get("stop_reason", "absent") for c in chunks if c["choices"]][-1] == "yy"
    assert all("stop_reason" not in c["choices"][0] for c in chunks[:-1] if c["choices"] and not c["choices"][0]["finish_reason"])


def test_include_stop_str_in_output_on_chat(client: httpx.Client, tok: TextTokenizer) -> None:
    choice = post(client, CHAT, **_stop_fields(tok, True))["choices"][0]
    assert (choice["message"]["content"], choice["finish_reason"], choice["stop_reason"]) == ("yy", "stop", "yy")
    finishing = [c["choices"][0] for c in stream(client, CHAT, **_stop_fields(tok, True)) if c["choices"]][-1]
    assert (finishing["finish_reason"], finishing["stop_reason"]) == ("stop", "yy")
    # ignore_eos: unseeded at temperature 1, the tiny model may draw its end token within 2
    ended = post(client, CHAT, max_tokens=2, ignore_eos=True)["choices"][0]
    assert (ended["finish_reason"], ended["stop_reason"]) == ("length", None)  # nothing stopped it


def test_tokens_as_token_ids_on_completions(client: httpx.Client, tok: TextTokenizer) -> None:
    lp = post(client, COMPLETIONS, max_tokens=4, logprobs=2, return_tokens_as_token_ids=True)["choices"][0]["logprobs"]
    assert all(t.startswith("token_id:") and int(t[9:]) >= 0 for t in lp["tokens"])
    assert all(k.startswith("token_id:") for top in lp["top_logprobs"] for k in top)
    assert all(next(iter(top)) == t for top, t in zip(lp["top_logprobs"], lp["tokens"]))  # the token first


def test_tokens_as_token_ids_on_chat(client: httpx.Client) -> None:
    body = post(client, CHAT, max_tokens=4, logprobs=True, top_logprobs=1, return_tokens_as_token_ids=True)
    for entry in body["choices"][0]["logprobs"]["content"]:
        assert entry["token"].startswith("token_id:") and entry["bytes"] == list(entry["token"].encode())
        assert all(t["token"].startswith("token_id:") for t in entry["top_logprobs"])


def test_truncate_prompt_tokens_keeps_the_prompts_tail(client: httpx.Client, tok: TextTokenizer) -> None:
    ids = tok.encode(PROMPT)
    body = post(client, COMPLETIONS, max_tokens=0, echo=True, truncate_prompt_tokens=3)
    assert body["usage"]["prompt_tokens"] == 3
    assert body["choices"][0]["text"] == tok.decode(ids[-3:])  # the tail that was kept
    whole = post(client, COMPLETIONS, max_tokens=1, truncate_prompt_tokens=-1)  # the context's worth
    assert whole["usage"]["prompt_tokens"] == len(ids)
    for bad in (0, -2):
        assert refused(client, COMPLETIONS, truncate_prompt_tokens=bad) == "truncate_prompt_tokens"
        assert refused(client, CHAT, truncate_prompt_tokens=bad) == "truncate_prompt_tokens"


def test_truncate_prompt_tokens_on_chat(client: httpx.Client) -> None:
    assert post(client, CHAT, max_tokens=1, truncate_prompt_tokens=4)["usage"]["prompt_tokens"] == 4


def _usage_counts(chunks: list[dict[str, Any]]) -> list[int]:
    return [c["usage"]["completion_tokens"] for c in chunks if c["choices"]]


def test_continuous_usage_stats_on_completions(client: httpx.Client, tok: TextTokenizer) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    # ignore_eos: the tiny model samples at temperature 1 by default and may draw its end token
    chunks = stream(client, COMPLETIONS, max_tokens=5, logprobs=0, stream_options=options, ignore_eos=True)
    assert _usage_counts(chunks) == [1, 2, 3, 4, 5]  # logprobs: a chunk per token
    prompt_tokens = len(tok.encode(PROMPT))
    assert all(c["usage"]["prompt_tokens"] == prompt_tokens for c in chunks)
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == prompt_tokens + 5


def test_continuous_usage_stats_on_chat(client: httpx.Client) -> None:
    options = {"include_usage": True, "continuous_usage_stats": True}
    chunks = stream(client, CHAT, max_tokens=4, logprobs=True, stream_options=options, ignore_eos=True)
    assert _usage_counts(chunks)[0] == 0 and _usage_counts(chunks)[-1] == 4  # the role chunk first


def test_request_id_names_the_response(client: httpx.Client) -> None:
    # requests sharing one id at once stay apart: the engine's ids are its own
    with ThreadPoolExecutor(4) as pool:
        bodies = list(pool.map(lambda _: post(client, COMPLETIONS, max_tokens=6, request_id="eval-0007", ignore_eos=True), range(4)))
    assert {b["id"] for b in bodies} == {"cmpl-eval-0007"}
    assert all(b["usage"]["completion_tokens"] == 6 for b in bodies)
    chunks = stream(client, COMPLETIONS, max_tokens=2, request_id="eval-0007")
    assert {c["id"] for c in chunks} == {"cmpl-eval-0007"}
    assert refused(client, COMPLETIONS, request_id="x" * 257) == "request_id"
    assert refused(client, CHAT, request_id="") == "request_id"


def test_request_id_names_the_chat_response(client: httpx.Client) -> None:
    assert post(client, CHAT, max_tokens=1, request_id="eval-0008")["id"] == "chatcmpl-eval-0008"


@pytest.mark.parametrize(("path", "prefix"), [(CHAT, "chatcmpl"), (COMPLETIONS, "cmpl")])
def test_the_clients_x_request_id_names_the_response(client: httpx.Client, path: str, prefix: str) -> None:
    prompt = {"messages": [{"role": "user", "content": "Hi"}]} if path == CHAT else {"prompt": "Hi"}
    body = {"model": MODEL, "max_tokens": 2, **prompt}
    named = client.post(path, json=body, headers={"X-Request-Id": "trace-41"})
    assert named.headers["X-Request-Id"] == "trace-41" and named.json()["id"] == f"{prefix}-trace-41"
    # the header before the body's request_id, as vLLM; the server's own ids name nothing
    both = client.post(path, json={**body, "request_id": "body-7"}, headers={"X-Request-Id": "trace-42"})
    assert both.json()["id"] == f"{prefix}-trace-42"
    plain = client.post(path, json=body)
    assert plain.json()["id"] != f"{prefix}-{plain.headers['X-Request-Id']}"
    with client.stream("POST", path, json={**body, "stream": True}, headers={"X-Request-Id": "trace-43"}) as r:
        ids = {json.loads(line[6:])["id"] for line in r.iter_lines() if line.startswith("data: {")}
    assert ids == {f"{prefix}-trace-43"}



def test_n_goes_to_openais_bound(client: httpx.Client) -> None:
    """OpenAI's cap of 128 choices; the queue's admission bounds the work of all n together."""
    body = post(client, CHAT, max_tokens=1, n=40, temperature=1.0, seed=3)
    assert sorted(c["index"] for c in body["choices"]) == list(range(40))
    assert body["usage"]["completion_tokens"] == 40
    assert refused(client, CHAT, max_tokens=1, n=129) == "n"
    assert refused(client, COMPLETIONS, max_tokens=1, n=129) == "n"

@pytest.mark.parametrize("path", [COMPLETIONS, CHAT])
def test_a_literal_extra_body_is_merged(client: httpx.Client, tok: TextTokenizer, path: str) -> None:
    y = token(tok, "y")
    body = post(client, path, max_tokens=8, extra_body={"max_tokens": 3, "logit_bias": {str(y): 100}})
    text = body["choices"][0]["text"] if path == COMPLETIONS else body["choices"][0]["message"]["content"]
    assert (text, body["usage"]["completion_tokens"]) == ("yyy", 3)  # its keys won
    assert refused(client, path, extra_body=[1]) == "extra_body"


@pytest.mark.parametrize(("include", "text"), [(False, "yyy"), (True, "yyyz")])
def test_a_stop_token_adds_no_text_unless_asked(client: httpx.Client, tok: TextTokenizer, include: bool, text: str) -> None:
    """As vLLM: the token that stops a request (stop_token_ids) is not part of the text."""
    y, z = token(tok, "y"), token(tok, "z")
    fields = {"max_tokens": 8, "logit_bias": {str(y): 60, str(z): 100}, "min_tokens": 3, "stop_token_ids": [z]}
    # min_tokens keeps z (and EOS) out for three tokens, the bias makes y those three, then z.
    fields["include_stop_str_in_output"] = include
    choice = post(client, COMPLETIONS, **fields)["choices"][0]
    assert (choice["text"], choice["finish_reason"], choice["stop_reason"]) == (text, "stop", z)  # the token id
    chunks = stream(client, COMPLETIONS, **fields)
    assert "".join(c["choices"][0]["text"] for c in chunks) == text
    assert [c["choices"][0]["stop_reason"] for c in chunks if "stop_reason" in c["choices"][0]] == [z]
