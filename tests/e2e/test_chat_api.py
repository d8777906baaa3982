"""The OpenAI surface of the real server: shapes, streaming, stop, n, logprobs, errors. The tests
of what a chat template shapes run on both served dialects (conftest.Dialect)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import openai
import pytest

from omni.text.tokenizer import TextTokenizer
from tests.e2e.conftest import BLOCK_SIZE, Dialect, read_metric

MODEL = "omni-tiny"
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]


def post(base: str, path: str, body: object, **kw: object) -> httpx.Response:
    return httpx.post(f"{base}{path}", json=body, timeout=120, **kw)  # type: ignore[arg-type]


def test_models_and_health(server: str) -> None:
    assert httpx.get(f"{server}/health", timeout=120).status_code == 200
    models = httpx.get(f"{server}/v1/models", timeout=120).json()
    assert [m["id"] for m in models["data"]] == [MODEL]
    assert httpx.get(f"{server}/v1/models/{MODEL}", timeout=120).json()["id"] == MODEL


def test_every_response_carries_the_request_id(server: str) -> None:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 2}
    for stream in (False, True):
        r = httpx.post(f"{server}/v1/chat/completions", json=body | {"stream": stream}, headers={"X-Request-Id": "e2e-7"}, timeout=120)
        assert r.status_code == 200 and r.headers["X-Request-Id"] == "e2e-7"
    bad = httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL}, headers={"X-Request-Id": "e2e-8"}, timeout=120)
    assert bad.status_code == 400 and bad.headers["X-Request-Id"] == "e2e-8"
    fresh = httpx.get(f"{server}/v1/models", timeout=120).headers["X-Request-Id"]
    assert len(fresh) == 32


def test_openai_client_chat_and_stream_agree(dialect: Dialect) -> None:
    client = openai.OpenAI(base_url=f"{dialect.base}/v1", api_key="unused")
    full = client.chat.completions.create(
        model=dialect.model, messages=HELLO, max_tokens=24, temperature=0, extra_body=dialect.chat
    )
    assert full.object == "chat.completion"
    assert full.choices[0].message.role == "assistant"
    # Greedy on the fixed tiny checkpoint: it runs to max_tokens, never reaching an EOS.
    assert full.usage.completion_tokens == 24
    assert full.choices[0].finish_reason == "length"
    chunks = list(
        client.chat.completions.create(
            model=dialect.model,
            messages=HELLO,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body=dialect.chat,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [full.choices[0].finish_reason]


def test_streamed_deltas_equal_full_decode(dialect: Dialect) -> None:
    """Streamed deltas join to exactly the non-streamed text, partial characters included."""
    server = dialect.base
    body = dialect.chat | {
        "model": dialect.model,
        "messages": [{"role": "user", "content": "Write café 東京 😀 please"}],
        "max_tokens": 40,
        "temperature": 1.0,
        "seed": 7,
        "stream": True,
    }
    with httpx.stream("POST", f"{server}/v1/chat/completions", json=body, timeout=120) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    deltas = [json.loads(e)["choices"][0]["delta"].get("content", "") for e in events[:-1]]
    streamed = "".join(deltas)
    full = post(server, "/v1/chat/completions", {**body, "stream": False}).json()
    assert streamed == full["choices"][0]["message"]["content"]
    # Seed 7 makes the tiny model emit tokens that are parts of UTF-8 characters, so the
    # deltas above had to hold back and complete characters (and keep stray bytes as U+FFFD,
    # as the full decode does; tests/omni/text/test_detokenizer.py checks that byte for byte).
    assert "\ufffd" in streamed


def test_seeded_sampling_repeats(server: str) -> None:
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 16, "temperature": 1.0, "seed": 3}
    a = post(server, "/v1/chat/completions", body).json()
    b = post(server, "/v1/chat/completions", body).json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]


def test_n_choices_and_logprobs(dialect: Dialect) -> None:
    server = dialect.base
    body = dialect.chat | {
        "model": dialect.model,
        "messages": HELLO,
        "max_tokens": 8,
        "temperature": 1.0,
        "seed": 11,
        "n": 3,
        "logprobs": True,
        "top_logprobs": 2,
    }
    out = post(server, "/v1/chat/completions", body).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    # Seeded: every choice runs to max_tokens.
    assert [c["finish_reason"] for c in out["choices"]] == ["length"] * 3
    for choice in out["choices"]:
        entries = choice["logprobs"]["content"]
        assert len(entries) == 8
        for e in entries:
            assert e["logprob"] <= 0.0
            assert len(e["top_logprobs"]) == 2
            assert e["top_logprobs"][0]["logprob"] >= e["top_logprobs"][1]["logprob"]
    assert out["usage"]["completion_tokens"] == sum(
        len(c["logprobs"]["content"]) for c in out["choices"]
    )


def test_greedy_logprob_is_the_top_one(server: str) -> None:
    body = {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": 6,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 3,
    }
    out = post(server, "/v1/chat/completions", body).json()
    for e in out["choices"][0]["logprobs"]["content"]:
        assert e["logprob"] == pytest.approx(e["top_logprobs"][0]["logprob"])


def test_stop_string_is_never_emitted(dialect: Dialect) -> None:
    server = dialect.base
    base = dialect.chat | {"model": dialect.model, "messages": HELLO, "max_tokens": 32, "temperature": 0}
    full = post(server, "/v1/chat/completions", base).json()["choices"][0]["message"]["content"]
    assert len(full) >= 6
    stop = full[3:5]
    cut = full[: full.index(stop)]
    body = {**base, "stop": [stop]}
    out = post(server, "/v1/chat/completions", body).json()["choices"][0]
    assert out["message"]["content"] == cut
    assert out["finish_reason"] == "stop"
    with httpx.stream(
        "POST", f"{server}/v1/chat/completions", json={**body, "stream": True}, timeout=120
    ) as r:
        events = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
    assert text == cut
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"


def test_completions_endpoint(server: str, tiny_model_dir) -> None:
    tok = TextTokenizer.from_dir(tiny_model_dir)
    text = "The quick brown fox"
    ids = tok.encode(text)
    body = {"model": MODEL, "max_tokens": 10, "temperature": 0}
    two = post(server, "/v1/completions", {**body, "prompt": [text, "Another prompt"]}).json()
    assert two["object"] == "text_completion"
    assert [c["index"] for c in two["choices"]] == [0, 1]
    assert two["usage"]["prompt_tokens"] == len(ids) + len(tok.encode("Another prompt"))
    # The same prompt as token ids gives the same greedy text.
    as_ids = post(server, "/v1/completions", {**body, "prompt": ids}).json()
    assert as_ids["choices"][0]["text"] == two["choices"][0]["text"]
    bad = post(server, "/v1/completions", {**body, "prompt": [10**9]})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"


def test_prefix_cache_reports_cached_tokens_and_skips_compute(server: str, tiny_model_dir) -> None:
    tok = TextTokenizer.from_dir(tiny_model_dir)
    system = "You are a careful assistant. " * 12
    first = [{"role": "system", "content": system}, {"role": "user", "content": "What is one?"}]
    second = [{"role": "system", "content": system}, {"role": "user", "content": "Name a color."}]
    ids_a, ids_b = tok.apply_chat_template(first), tok.apply_chat_template(second)
    shared = next(i for i, (x, y) in enumerate(zip(ids_a, ids_b)) if x != y)
    assert shared > 8 * BLOCK_SIZE
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0}
    post(server, "/v1/chat/completions", {**body, "messages": first}).raise_for_status()
    before = read_metric(server, "vllm:iteration_tokens_total_sum")
    out = post(server, "/v1/chat/completions", {**body, "messages": second}).json()
    after = read_metric(server, "vllm:iteration_tokens_total_sum")
    cached = out["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Only whole blocks are cached: those wholly inside the shared prefix.
    assert cached == shared // BLOCK_SIZE * BLOCK_SIZE
    # max_tokens=1: the only steps were the prefill, which computed just the uncached rest.
    assert after - before == len(ids_b) - cached



def test_cache_salt_keeps_cached_prompts_apart(server: str, tiny_model_dir) -> None:
    system = "Salted tenants share nothing they did not send themselves. " * 8
    body = {"model": MODEL, "max_tokens": 1, "temperature": 0}

    def cached(question: str, **salt: str) -> int:
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        out = post(server, "/v1/chat/completions", {**body, "messages": messages, **salt})
        out.raise_for_status()
        return out.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached("One?", cache_salt="tenant-a") == 0
    shared = cached("Two?", cache_salt="tenant-a")
    assert shared >= 8 * BLOCK_SIZE  # the same tenant's system prompt is cached
    assert cached("Three?", cache_salt="tenant-b") == 0  # another tenant's is not
    # nor for requests without a salt (they may share the template's first block with other tests')
    assert cached("Four?") < 8 * BLOCK_SIZE
    assert cached("Five?") >= 8 * BLOCK_SIZE  # which share theirs among themselves
    bad = post(server, "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": "x"}], "cache_salt": ""})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "cache_salt"


@pytest.mark.parametrize(
    "body, status, param",
    [
        ({"model": MODEL}, 400, "messages"),
        ({"model": MODEL, "messages": []}, 400, "messages"),
        ({"model": MODEL, "messages": HELLO, "temperature": "hot"}, 400, "temperature"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": 0}, 400, "max_tokens"),
        ({"model": MODEL, "messages": HELLO, "max_tokens": 100000}, 400, "max_tokens"),
        ({"model": MODEL, "messages": HELLO, "n": 0}, 400, "n"),
        ({"model": "nope", "messages": HELLO}, 404, "model"),
        ({"model": MODEL, "messages": [{"role": "user", "content": "x " * 2000}]}, 400, "messages"),
        (
            {
                "model": MODEL,
                "messages": [
                    {
                        "role": "user",
                        "content": [
                            {"type": "text", "text": "What is this?"},
                            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                        ],
                    }
                ],
            },
            400,
            "messages[0].content[1]",
        ),
    ],
)
def test_bad_requests_get_openai_errors(server: str, body: dict, status: int, param: str) -> None:
    r = post(server, "/v1/chat/completions", body)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param
    assert err["message"]
    # ...and the server keeps serving.
    ok = post(server, "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "max_tokens": 2})
    assert ok.status_code == 200


def test_malformed_json_oversized_body_and_unknown_route(server: str) -> None:
    r = httpx.post(
        f"{server}/v1/chat/completions",
        content=b"{not json",
        headers={"Content-Type": "application/json"},
        timeout=120,
    )
    assert r.status_code == 400 and "error" in r.json()
    r = httpx.post(f"{server}/v1/chat/completions", content=b"x" * 100_000, timeout=120)
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"
    r = httpx.get(f"{server}/v1/nothing-here", timeout=120)
    assert r.status_code == 404 and "error" in r.json()


async def test_disconnect_mid_stream_frees_blocks(server: str) -> None:
    body = {
        "model": MODEL,
        "messages": HELLO,
        "max_tokens": 400,
        "temperature": 1.0,
        "seed": 1,
        "stream": True,
    }
    # The server is shared by the whole run: count this test's abort as a delta.
    aborts = read_metric(server, "vllm:request_success_total", finished_reason="abort")
    async with httpx.AsyncClient(timeout=120) as client:
        async with client.stream("POST", f"{server}/v1/chat/completions", json=body) as r:
            seen = 0
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen >= 3:
                    break
            assert read_metric(server, "vllm:num_requests_running") == 1
    # Bounded wait for the server to notice the closed connection (a hang guard, not a timing).
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if read_metric(server, "vllm:num_requests_running") == 0 and read_metric(
            server, "vllm:kv_cache_usage_perc"
        ) == 0:
            break
        await asyncio.sleep(0.1)
    assert read_metric(server, "vllm:num_requests_running") == 0
    assert read_metric(server, "vllm:kv_cache_usage_perc") == 0
    assert read_metric(server, "vllm:request_success_total", finished_reason="abort") == aborts + 1


async def test_a_disconnect_storm_frees_every_block_and_the_server_keeps_serving(server: str) -> None:
    # 32 streams at once, each client gone after its second event: every request is aborted,
    # no KV block stays in use, and the next request is served.
    streams = 32
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 400, "ignore_eos": True, "stream": True}
    aborts = read_metric(server, "vllm:request_success_total", finished_reason="abort")

    async def leave_early(client: httpx.AsyncClient) -> None:
        async with client.stream("POST", f"{server}/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            seen = 0
            async for line in r.aiter_lines():
                seen += line.startswith("data: ")
                if seen >= 2:
                    break

    limits = httpx.Limits(max_connections=streams)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        await asyncio.gather(*(leave_early(client) for _ in range(streams)))
    gone = time.monotonic()
    deadline = gone + 120  # a hang guard, not a timing
    while time.monotonic() < deadline:
        if read_metric(server, "vllm:num_requests_running") == 0 and read_metric(server, "vllm:kv_cache_usage_perc") == 0:
            break
        await asyncio.sleep(0.05)
    freed = time.monotonic() - gone
    assert read_metric(server, "vllm:num_requests_running") == 0
    assert read_metric(server, "vllm:num_requests_waiting") == 0
    assert read_metric(server, "vllm:kv_cache_usage_perc") == 0
    assert read_metric(server, "vllm:request_success_total", finished_reason="abort") == aborts + streams
    after = httpx.post(f"{server}/v1/chat/completions", json={"model": MODEL, "messages": HELLO, "max_tokens": 2}, timeout=120)
    assert after.status_code == 200
    print(f"\ndisconnect storm: {streams} streams gone, every block free {freed:.2f} s after the last left")
