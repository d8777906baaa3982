"""Speculative decoding served (issue 35): the tiny checkpoint, with n-gram or suffix drafts and without,
over the three workloads of bench/spec_workloads.py. Greedy output is the same text, streamed or
not; vLLM's spec_decode counters move; a client that leaves while its request speculates frees
every block. (SmolLM2 from its GGUF is bench/spec_decode.py's: its 49 prompts at concurrency 1,
each server started once; two SmolLM2 starts would cost the suite 40 s.) The requests go one at a time, so each step's rows are
the same few whether drafts ride along or not (the native decode's rows are independent), and
without the prefix cache: greedy output also depends on how a prompt's prefill is split, which a
cache hit changes, and a speculating server's cache evicts in another order (its requests free
blocks drafts took), so with it two servers could differ on a near-tie for that reason alone."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest

from bench.spec_workloads import copy_prompts, multi_turn_prompts, open_prompts
from tests.e2e.conftest import read_metric
from tests.e2e.server import running_server

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
FLAGS = ("--max-model-len", "2048", "--kv-cache-memory", str(64 << 20), "--max-num-seqs", "8", "--no-prefix-caching")
PROMPTS = copy_prompts() + open_prompts() + multi_turn_prompts()  # 49
MAX_TOKENS = 24


def chat(base: str, messages: list[dict[str, Any]], **extra: Any) -> str:
    body = {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, **extra}
    request = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(), {"content-type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as r:
        return str(json.load(r)["choices"][0]["message"]["content"])


def chat_streamed(base: str, messages: list[dict[str, Any]]) -> str:
    body = {"model": "tiny", "messages": messages, "max_tokens": MAX_TOKENS, "temperature": 0, "stream": True}
    text = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                for choice in json.loads(line[6:])["choices"]:
                    text.append(choice["delta"].get("content") or "")
    return "".join(text)


SAMPLED = [PROMPTS[i] for i in range(0, len(PROMPTS), 6)]  # 9, of every workload
SAMPLING = {"temperature": 0.5, "top_k": 3, "presence_penalty": 0.1}


def sampled(base: str) -> list[str]:
    return [chat(base, m, seed=100 + i, **SAMPLING) for i, m in enumerate(SAMPLED)]


SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 8},
        "country": {"type": "string", "maxLength": 8},
        "facts": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["city", "country", "facts"],
    "additionalProperties": False,
}
CITIES = ["Rome", "Oslo", "Lima", "Cairo", "Quito", "Hanoi", "Dakar", "Perth", "Bern", "Riga"]


def structured(base: str) -> list[str]:
    """20 json_schema answers, greedy and seeded, to prompts whose example repeats the keys."""
    out = []
    for i, city in enumerate(CITIES * 2):
        ask = f'Reply as JSON like {{"city": "Paris", "country": "France", "facts": ["old", "big"]}} for {city}.'
        sampling = {"seed": i, **SAMPLING} if i >= len(CITIES) else {}
        fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
        out.append(chat(base, [{"role": "user", "content": ask}], response_format=fmt, **{"max_tokens": 200, **sampling}))
    return out


@pytest.fixture(scope="module")
def plain(tiny_model_dir: Path) -> dict[str, list[str]]:
    with running_server("--model", f"tiny={tiny_model_dir}", *FLAGS) as base:
        return {"greedy": [chat(base, m) for m in PROMPTS], "sampled": sampled(base), "structured": structured(base)}


@pytest.fixture(scope="module")
def speculating(tiny_model_dir: Path) -> Iterator[str]:
    with running_server("--model", f"tiny={tiny_model_dir}", *FLAGS, "--speculative-config", json.dumps(SPEC)) as base:
        yield base


@pytest.fixture(scope="module")
def suffix_speculating(tiny_model_dir: Path) -> Iterator[str]:
    spec = {"method": "suffix", "num_speculative_tokens": 6, "suffix_decoding_max_tree_depth": 16}
    with running_server("--model", f"tiny={tiny_model_dir}", *FLAGS, "--speculative-config", json.dumps(spec)) as base:
        yield base


def test_greedy_output_is_the_same_with_suffix_drafts(plain: dict[str, list[str]], suffix_speculating: str) -> None:
    assert [chat(suffix_speculating, m) for m in PROMPTS] == plain["greedy"]
    assert [chat_streamed(suffix_speculating, m) for m in PROMPTS] == plain["greedy"]
    assert read_metric(suffix_speculating, "vllm:spec_decode_num_accepted_tokens_total") > 0
    assert structured(suffix_speculating) == plain["structured"]


def test_greedy_output_is_the_same_with_drafts(plain: dict[str, list[str]], speculating: str) -> None:
    drafts = read_metric(speculating, "vllm:spec_decode_num_drafts_total")
    assert [chat(speculating, m) for m in PROMPTS] == plain["greedy"]
    assert [chat_streamed(speculating, m) for m in PROMPTS] == plain["greedy"]
    # the counters moved: drafts were verified and some were kept
    assert read_metric(speculating, "vllm:spec_decode_num_drafts_total") > drafts
    accepted = read_metric(speculating, "vllm:spec_decode_num_accepted_tokens_total")
    assert accepted > 0
    assert read_metric(speculating, "vllm:spec_decode_num_draft_tokens_total") >= accepted
    assert read_metric(speculating, "vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0


def test_a_seed_gives_the_same_text_with_drafts_and_twice(plain: dict[str, list[str]], speculating: str) -> None:
    """Seeded sampled requests speculate too (drafts kept with the target's probability), and
    each draw is keyed by (seed, position): the plain server's text, on every try."""
    drafts = read_metric(speculating, "vllm:spec_decode_num_draft_tokens_total")
    first = sampled(speculating)
    assert first == plain["sampled"]
    assert sampled(speculating) == first
    assert len(set(first)) == len(first)  # sampled, not one text
    assert read_metric(speculating, "vllm:spec_decode_num_draft_tokens_total") > drafts


def test_json_schema_answers_with_drafts_are_valid_and_the_same(plain: dict[str, list[str]], speculating: str) -> None:
    """Constrained requests speculate: the server checks each draft against the grammar and
    sends a mask per verifying row, so every answer is valid, and the same as without drafts."""
    drafts = read_metric(speculating, "vllm:spec_decode_num_draft_tokens_total")
    answers = structured(speculating)
    for answer in answers:
        jsonschema.validate(json.loads(answer), SCHEMA)
    assert answers == plain["structured"]
    assert read_metric(speculating, "vllm:spec_decode_num_draft_tokens_total") > drafts


def test_a_request_may_opt_out(plain: dict[str, list[str]], speculating: str) -> None:
    drafts = read_metric(speculating, "vllm:spec_decode_num_drafts_total")
    assert [chat(speculating, m, speculative=False) for m in PROMPTS[:6]] == plain["greedy"][:6]
    assert read_metric(speculating, "vllm:spec_decode_num_drafts_total") == drafts
    r = httpx.post(f"{speculating}/v1/chat/completions", json={"model": "tiny", "messages": PROMPTS[0], "speculative": "no"}, timeout=60)
    assert r.status_code == 400 and "speculative" in r.text


def test_a_client_gone_mid_speculation_frees_every_block(speculating: str) -> None:
    body = {"model": "tiny", "messages": copy_prompts()[0], "max_tokens": 400, "ignore_eos": True,
            "temperature": 0, "stream": True}  # fmt: skip
    drafts = read_metric(speculating, "vllm:spec_decode_num_drafts_total")
    with httpx.stream("POST", f"{speculating}/v1/chat/completions", json=body, timeout=120) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("data: ")
            if seen >= 12 and read_metric(speculating, "vllm:spec_decode_num_drafts_total") > drafts:
                break
    deadline = time.monotonic() + 120  # a hang guard, not a timing
    while time.monotonic() < deadline:
        if read_metric(speculating, "vllm:num_requests_running") == 0 and read_metric(speculating, "vllm:kv_cache_usage_perc") == 0:
            break
        time.sleep(0.05)
    assert read_metric(speculating, "vllm:num_requests_running") == 0
    assert read_metric(speculating, "vllm:kv_cache_usage_perc") == 0
    assert chat(speculating, copy_prompts()[1])  # and it serves on
