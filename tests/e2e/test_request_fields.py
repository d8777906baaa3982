"""The walk: every request field of both endpoints' tables (omni/serving/requests/dispositions.py),
each sent through the real server at a realistic value.

HONOURED and INFORMATIONAL fields answer 200, and an honoured one shows its effect where that
is cheap to see; a field accepted only at its default answers 200 there and a 400 naming it
elsewhere; a REJECTED field is a 400 naming it. A field added to a table without a sample
here fails test_every_field_has_a_sample.

The tiny checkpoint's weights are random, so effects are made certain by construction (a +100
logit bias on one token, greedy comparisons), not by what the model prefers.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeAlias

import httpx
import pytest

from omni.serving.requests.dispositions import FIELDS, STREAM_OPTIONS_FIELDS, Disposition, Endpoint
from omni.text.tokenizer import TextTokenizer

MODEL = "omni-tiny"
HELLO = [{"role": "user", "content": "Hello there, how are you today?"}]
PREFILL = [*HELLO, {"role": "assistant", "content": "Sure,"}]
PROMPT = "The quick brown fox"
MAX_TOKENS = 4
PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


@dataclass(frozen=True)
class Tokens:
    y: int  # the token "y": a +100 bias makes every sampled token y
    eos: int


@dataclass
class Reply:
    status: int
    body: dict[str, Any]  # the JSON body; for a stream, the last chunk with usage (or {})
    events: list[dict[str, Any]] = field(default_factory=list)  # a stream's chunks

    @property
    def error(self) -> dict[str, Any]:
        return self.body.get("error") or {}

    @property
    def choices(self) -> list[dict[str, Any]]:
        return self.body["choices"]

    @property
    def text(self) -> str:
        """Choice 0's text, of either endpoint, streamed or not."""
        if self.events:
            parts = [c.get("delta", {}).get("content") or c.get("text") or "" for e in self.events for c in e["choices"] if c["index"] == 0]
            return "".join(parts)
        choice = self.choices[0]
        return (choice["message"]["content"] or "") if "message" in choice else choice["text"]

    @property
    def usage(self) -> dict[str, Any]:
        return self.body["usage"]


class Walk:
    """The server, the two token ids, and the plain and greedy replies effects compare with."""

    def __init__(self, client: httpx.Client, tokens: Tokens) -> None:
        self.client = client
        self.tokens = tokens
        self._cached: dict[tuple[Endpoint, str], Reply] = {}

    def post(self, endpoint: Endpoint, fields: dict[str, Any]) -> Reply:
        r = self.client.post(PATHS[endpoint], json=minimal(endpoint) | fields)
        if not fields.get("stream") or r.status_code != 200:
            return Reply(r.status_code, r.json())
        events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ") and line != "data: [DONE]"]
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
        with_usage = [e for e in events if e.get("usage")]
        return Reply(r.status_code, with_usage[-1] if with_usage else {}, events)

    def plain(self, endpoint: Endpoint) -> Reply:
        return self._once(endpoint, "plain", {})

    def greedy(self, endpoint: Endpoint) -> Reply:
        return self._once(endpoint, "greedy", {"temperature": 0})

    def _once(self, endpoint: Endpoint, key: str, fields: dict[str, Any]) -> Reply:
        if (endpoint, key) not in self._cached:
            self._cached[endpoint, key] = self.post(endpoint, fields)
        return self._cached[endpoint, key]


def minimal(endpoint: Endpoint) -> dict[str, Any]:
    first = {"messages": HELLO} if endpoint == "chat" else {"prompt": PROMPT}
    return {"model": MODEL, **first, "max_tokens": MAX_TOKENS}


# ----------------------------------------------------------------------------- the samples

Make: TypeAlias = Any  # a JSON value, or a function of Tokens that gives one
Effect: TypeAlias = Callable[[Reply, Walk, Endpoint], None]


@dataclass(frozen=True)
class Sample:
    value: Make  # realistic; for a default-only field, one that is not a default
    companions: Make = None  # other fields the value needs (stream for stream_options, ...)
    effect: Effect | None = None  # what an honoured value must do, where cheap to see
    default: Make = None  # default-only fields: a value that changes nothing (answers 200)

    def fields(self, name: str, tokens: Tokens, value: Make) -> dict[str, Any]:
        companions = _make(self.companions, tokens) or {}
        if name.startswith("stream_options."):  # a key of stream_options, merged into the companions'
            options = companions.get("stream_options", {}) | {name.split(".", 1)[1]: _make(value, tokens)}
            return companions | {"stream_options": options}
        return companions | {name: _make(value, tokens)}


def _make(value: Make, tokens: Tokens) -> Any:
    return value(tokens) if callable(value) else value


def bias_y(t: Tokens) -> dict[str, Any]:
    return {"logit_bias": {str(t.y): 100}}


def bias_eos(t: Tokens) -> dict[str, Any]:
    return {"logit_bias": {str(t.eos): 100}}


def finish(reply: Reply) -> str:
    return reply.choices[0]["finish_reason"]


def _all_y(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.text == "y" * MAX_TOKENS


def _same_as_greedy(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.text == walk.greedy(endpoint).text


def _fewer_prompt_tokens(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.usage["prompt_tokens"] < walk.plain(endpoint).usage["prompt_tokens"]


def _repeatable(fields: dict[str, Any]) -> Effect:
    def effect(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
        assert walk.post(endpoint, fields).text == reply.text

    return effect


def _one_of(*texts: str) -> Effect:
    def effect(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
        assert reply.text in texts and finish(reply) == "stop", reply.text

    return effect


def _n_choices(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert [c["index"] for c in reply.choices] == [0, 1]  # n: 2, or two prompts


def _at_most(n: int) -> Effect:
    def effect(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
        assert 1 <= reply.usage["completion_tokens"] <= n

    return effect


def _stop_at_y(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert (finish(reply), reply.usage["completion_tokens"]) == ("stop", 1)


def _no_stop_string(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert (reply.text, finish(reply), reply.usage["completion_tokens"]) == ("", "stop", 1)


def _stop_string_kept(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert (reply.text, finish(reply)) == ("y", "stop")


def _runs_to_max_tokens(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert (finish(reply), reply.usage["completion_tokens"]) == ("length", MAX_TOKENS)


def _eos_after_two(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    # two tokens that cannot be EOS, then the EOS the bias forces (usage counts it)
    assert (finish(reply), reply.usage["completion_tokens"]) == ("stop", 3)


def _no_y_token(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    # the +100 bias would make every token y; other tokens may still spell a "y"
    assert "y" not in _token_names(reply, endpoint) and reply.text != "y" * MAX_TOKENS


def _streamed(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.events and reply.events[-1]["choices"][-1]["finish_reason"] in ("length", "stop")


def _usage_chunk_last(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.events[-1]["choices"] == [] and reply.events[-1]["usage"]["completion_tokens"] >= 1


def _usage_on_every_chunk(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert all(e.get("usage") for e in reply.events if e["choices"]), reply.events


def _prompt_truncated(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.usage["prompt_tokens"] == 3


def _prompt_logprobs(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    # vLLM's places: the chat response's top level, each completions choice
    found = reply.body.get("prompt_logprobs") if endpoint == "chat" else reply.choices[0].get("prompt_logprobs")
    assert isinstance(found, list) and len(found) == reply.usage["prompt_tokens"], found


def _echoed(prefix: str) -> Effect:
    def effect(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
        assert reply.text.startswith(prefix), reply.text

    return effect


def _chat_logprobs(top: int) -> Effect:
    def effect(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
        content = reply.choices[0]["logprobs"]["content"]
        assert len(content) == reply.usage["completion_tokens"]
        assert all(len(e["top_logprobs"]) == top for e in content)

    return effect


def _completion_logprobs(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    logprobs = reply.choices[0]["logprobs"]
    assert len(logprobs["tokens"]) == len(logprobs["token_logprobs"]) == reply.usage["completion_tokens"]
    assert all(1 <= len(top) <= 3 for top in logprobs["top_logprobs"])  # up to logprobs + the sampled one


def _token_names(reply: Reply, endpoint: Endpoint) -> list[str]:
    logprobs = reply.choices[0]["logprobs"]
    return [e["token"] for e in logprobs["content"]] if endpoint == "chat" else logprobs["tokens"]


def _token_ids_as_names(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    names = _token_names(reply, endpoint)
    assert names and all(re.fullmatch(r"token_id:\d+", n) for n in names), names


def _request_id_named(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert "walk-request-7" in reply.body["id"], reply.body["id"]


def _forced_tool_call(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    (call,) = reply.choices[0]["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    assert json.loads(call["function"]["arguments"]) == {}


def _turn_left_open(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    # the final assistant message is continued: the template's end of its turn is left out
    closed = walk.post(endpoint, {"messages": PREFILL, "add_generation_prompt": False})
    assert reply.usage["prompt_tokens"] < closed.usage["prompt_tokens"]


def _model_named(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.body["model"] == MODEL


def _longer_prompt(reply: Reply, walk: Walk, endpoint: Endpoint) -> None:
    assert reply.usage["prompt_tokens"] > walk.plain(endpoint).usage["prompt_tokens"]


WEATHER = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather now",
            "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
        },
    }
]
YES_NO = {"max_tokens": 16, "temperature": 1.0, "seed": 3}

# Fields both endpoints share, with the same sample.
SHARED: dict[str, Sample] = {
    "model": Sample(MODEL, effect=_model_named),
    "frequency_penalty": Sample(0.5),
    "presence_penalty": Sample(-0.5),
    "logit_bias": Sample(lambda t: {str(t.y): 100}, effect=_all_y),
    "max_tokens": Sample(2, effect=_at_most(2)),
    "n": Sample(2, effect=_n_choices),
    "seed": Sample(7, {"temperature": 1.0}, effect=_repeatable({"temperature": 1.0, "seed": 7})),
    "stop": Sample(["y"], bias_y, effect=_no_stop_string),
    "stream": Sample(True, effect=_streamed),
    "stream_options": Sample({"include_usage": True}, {"stream": True}, effect=_usage_chunk_last),
    "temperature": Sample(0, effect=_same_as_greedy),
    "top_p": Sample(0.5),
    "user": Sample("user-1234"),
    # vLLM's
    "best_of": Sample(3, default=1),
    "use_beam_search": Sample(True, default=False),
    "length_penalty": Sample(0.8, default=1.0),
    "early_stopping": Sample(True, default=False),
    "watermarking": Sample(True, default=False),
    "top_k": Sample(1, effect=_same_as_greedy),
    "min_p": Sample(1.0, effect=_same_as_greedy),  # only the most likely token is left
    "repetition_penalty": Sample(1.2),
    "stop_token_ids": Sample(lambda t: [t.y], bias_y, effect=_stop_at_y),
    "include_stop_str_in_output": Sample(True, lambda t: {"stop": ["y"], **bias_y(t)}, effect=_stop_string_kept),
    "ignore_eos": Sample(True, bias_eos, effect=_runs_to_max_tokens),
    "speculative": Sample(False),  # the same output (tests/e2e/test_speculative.py checks it drafts none)
    "min_tokens": Sample(2, bias_eos, effect=_eos_after_two),
    "skip_special_tokens": Sample(False),
    "spaces_between_special_tokens": Sample(False, default=True),
    "truncate_prompt_tokens": Sample(3, effect=_prompt_truncated),
    "truncation_side": Sample("right", {"truncate_prompt_tokens": 3}, default="left"),
    "prompt_logprobs": Sample(1, effect=_prompt_logprobs),
    "logprob_token_ids": Sample(lambda t: [t.y]),
    "allowed_token_ids": Sample(lambda t: [t.y], effect=_all_y),
    "response_format": Sample(
        {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"enum": ["yes", "no"]}, "strict": True}},
        YES_NO,
        effect=_one_of('"yes"', '"no"'),
    ),
    "structured_outputs": Sample({"choice": ["yes", "no"]}, YES_NO, effect=_one_of("yes", "no")),
    "guided_json": Sample({"enum": ["yes", "no"]}, YES_NO, effect=_one_of('"yes"', '"no"')),
    "guided_regex": Sample("(yes|no)", YES_NO, effect=_one_of("yes", "no")),
    "guided_choice": Sample(["yes", "no"], YES_NO, effect=_one_of("yes", "no")),
    "guided_grammar": Sample('root ::= "yes" | "no"', YES_NO, effect=_one_of("yes", "no")),
    "guided_decoding_backend": Sample("xgrammar", {"guided_choice": ["yes", "no"], **YES_NO}, effect=_one_of("yes", "no")),
    "guided_whitespace_pattern": Sample(r"[\n\t ]*", {"guided_json": {"type": "object"}}),
    "structural_tag": Sample(json.dumps({"type": "structural_tag", "structures": [], "triggers": []})),
    # the walk's server schedules fcfs, where only 0 is taken (test_priority_needs_the_priority_policy)
    "priority": Sample(0),
    "request_id": Sample("walk-request-7", effect=_request_id_named),
    "session_id": Sample("session-42"),
    "logits_processors": Sample(["my_module.MyLogitsProcessor"]),
    "return_tokens_as_token_ids": Sample(True, effect=_token_ids_as_names),  # logprobs: a companion per endpoint
    "return_token_ids": Sample(True, default=False),
    "return_token_offsets": Sample(True, default=False),
    "return_mm_kwargs": Sample(False, default=True),
    "routed_experts_prompt_start": Sample(2, default=0),
    "cache_salt": Sample("jFLvZ2Hv0rWm2Sk8Q3pcuYVQxJ6b4DkDq1qPZp4Tn3E"),
    "kv_transfer_params": Sample({"do_remote_decode": True, "do_remote_prefill": False}),
    "ec_transfer_params": Sample({"do_remote_encode": True}),
    "vllm_xargs": Sample({"my_extension_flag": 1}),
    "repetition_detection": Sample({"max_pattern_size": 8, "min_count": 3}),
    "stream_interval": Sample(4, {"stream": True}, default=1),
    "thinking_token_budget": Sample(2),
    # keys of stream_options
    "stream_options.include_usage": Sample(True, {"stream": True}, effect=_usage_chunk_last),
    "stream_options.continuous_usage_stats": Sample(
        True, {"stream": True, "stream_options": {"include_usage": True}}, effect=_usage_on_every_chunk
    ),
    "stream_options.include_obfuscation": Sample(True, {"stream": True}, default=False),
}

CHAT: dict[str, Sample] = SHARED | {
    "messages": Sample([{"role": "system", "content": "You are terse."}, *HELLO], effect=_longer_prompt),
    "audio": Sample({"voice": "alloy", "format": "wav"}),  # with audio in modalities, a 400 naming modalities
    "function_call": Sample({"name": "get_weather"}),
    "functions": Sample([WEATHER[0]["function"]]),
    "logprobs": Sample(True, effect=_chat_logprobs(0)),
    "top_logprobs": Sample(2, {"logprobs": True}, effect=_chat_logprobs(2)),
    "max_completion_tokens": Sample(2, effect=_at_most(2)),  # and wins over max_tokens: 4
    "metadata": Sample({"team": "search", "experiment": "walk"}),
    "modalities": Sample(["text"]),
    # how drawn images come back; this model draws none (tests/e2e/test_images.py draws them)
    "image": Sample({"response_format": "b64_json", "size": "768x768", "num_inference_steps": 2, "step_cache_threshold": 0.1}),
    "moderation": Sample({"model": "omni-moderation-latest"}),
    "parallel_tool_calls": Sample(False, {"tools": WEATHER}),
    "prediction": Sample({"type": "content", "content": "Hello, I am fine."}),
    "prompt_cache_key": Sample("walk-cache-key"),
    "prompt_cache_options": Sample({"mode": "implicit", "ttl": "30m"}),
    "prompt_cache_retention": Sample("24h", default="in_memory"),
    "reasoning_effort": Sample("none", effect=_longer_prompt),  # the closed, empty reasoning block
    "safety_identifier": Sample("2f8b0c1e9d"),
    "service_tier": Sample("flex", default="auto"),
    "store": Sample(True, default=False),
    "tool_choice": Sample(
        {"type": "function", "function": {"name": "get_weather"}}, {"tools": WEATHER, **YES_NO}, effect=_forced_tool_call
    ),
    "tools": Sample(WEATHER),
    "verbosity": Sample("low"),
    "web_search_options": Sample({"search_context_size": "low"}),
    # vLLM's
    "return_tokens_as_token_ids": Sample(True, {"logprobs": True}, effect=_token_ids_as_names),
    "bad_words": Sample(["y"], lambda t: {"logprobs": True, **bias_y(t)}, effect=_no_y_token),
    "echo": Sample(
        True, {"messages": PREFILL, "add_generation_prompt": False, "continue_final_message": True}, effect=_echoed("Sure,")
    ),
    "add_generation_prompt": Sample(False, effect=_fewer_prompt_tokens),
    "continue_final_message": Sample(True, {"messages": PREFILL, "add_generation_prompt": False}, effect=_turn_left_open),
    "add_special_tokens": Sample(True, default=False),
    "documents": Sample([{"title": "Foxes", "text": "The quick brown fox jumps over the lazy dog."}]),
    "chat_template": Sample("{% for m in messages %}{{ m['content'] }}{% endfor %}", effect=_fewer_prompt_tokens),
    "chat_template_kwargs": Sample({"enable_thinking": False}),
    "media_io_kwargs": Sample({"video": {"num_frames": 8}}),
    "mm_processor_kwargs": Sample({"num_crops": 4}),
    "return_prompt_text": Sample(True, default=False),
    "include_reasoning": Sample(False, default=True),
}

COMPLETIONS: dict[str, Sample] = SHARED | {
    "prompt": Sample([PROMPT, "Once upon a time"], effect=_n_choices),  # a choice per prompt
    "echo": Sample(True, effect=_echoed(PROMPT)),
    "logprobs": Sample(2, effect=_completion_logprobs),
    "suffix": Sample(" and that was the end.", default=""),
    "return_tokens_as_token_ids": Sample(True, {"logprobs": 0}, effect=_token_ids_as_names),
    "bad_words": Sample(["y"], lambda t: {"logprobs": 0, **bias_y(t)}, effect=_no_y_token),
    "prompt_embeds": Sample("AAAAAA=="),
    "add_special_tokens": Sample(False, default=True),
}

SAMPLES: dict[Endpoint, dict[str, Sample]] = {"chat": CHAT, "completions": COMPLETIONS}

# Honoured in the tables but not yet by the server: these cases fail until the features being
# built land. (endpoint, field); each is the "value" case.
BEING_BUILT: set[tuple[Endpoint, str]] = set()  # fields whose walk case may still fail


def table(endpoint: Endpoint) -> dict[str, Disposition]:
    """The endpoint's fields and stream_options keys, as the walk visits them."""
    keys = {f"stream_options.{k}": f.disposition for k, f in STREAM_OPTIONS_FIELDS.items()}
    return {name: f.disposition for name, f in FIELDS[endpoint].items()} | keys


def cases() -> Iterator[Any]:
    for endpoint in ("chat", "completions"):
        for name, disposition in table(endpoint).items():
            which = ["value", "default"] if disposition is Disposition.ACCEPTED_DEFAULT_ONLY else ["value"]
            for w in which:
                built = (endpoint, name) not in BEING_BUILT or w == "default"
                marks = [] if built else [pytest.mark.xfail(strict=False, reason="being built")]
                case_id = f"{endpoint}-{name}" + ("-default" if w == "default" else "")
                yield pytest.param(endpoint, name, w, marks=marks, id=case_id)


# ----------------------------------------------------------------------------- the tests


@pytest.fixture(scope="module")
def walk(server: str, tiny_model_dir: Path) -> Iterator[Walk]:
    tok = TextTokenizer.from_dir(tiny_model_dir)
    (y,) = tok.encode("y", add_special_tokens=False)
    (eos,) = tok.eos_token_ids
    tokens = Tokens(y=y, eos=eos)
    with httpx.Client(base_url=server, timeout=120) as client:
        yield Walk(client, tokens)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_every_field_has_a_sample(endpoint: Endpoint) -> None:
    fields = table(endpoint)
    samples = SAMPLES[endpoint]
    assert set(fields) - set(samples) == set(), "fields with no sample"
    assert set(samples) - set(fields) == set(), "samples of fields no table has"
    for name, disposition in fields.items():
        has_default = samples[name].default is not None
        assert has_default == (disposition is Disposition.ACCEPTED_DEFAULT_ONLY), name


@pytest.mark.parametrize(("endpoint", "name", "which"), list(cases()))
def test_each_field_is_honoured_or_a_400_naming_it(walk: Walk, endpoint: Endpoint, name: str, which: str) -> None:
    sample = SAMPLES[endpoint][name]
    disposition = table(endpoint)[name]
    value = sample.default if which == "default" else sample.value
    reply = walk.post(endpoint, sample.fields(name, walk.tokens, value))
    refused = disposition is Disposition.REJECTED or (disposition is Disposition.ACCEPTED_DEFAULT_ONLY and which == "value")
    if refused:
        assert reply.status == 400, reply.body
        assert (reply.error["param"], reply.error["code"]) == (name, "unsupported_parameter"), reply.error
        return
    assert reply.status == 200, reply.body
    if sample.effect is not None and which == "value":
        sample.effect(reply, walk, endpoint)


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_a_field_in_neither_api_is_a_400_naming_it(walk: Walk, endpoint: Endpoint) -> None:
    reply = walk.post(endpoint, {"temprature": 0.7})
    assert reply.status == 400
    assert (reply.error["param"], reply.error["code"]) == ("temprature", "unknown_parameter")
    assert "Unrecognized request argument" in reply.error["message"]
    reply = walk.post(endpoint, {"stream": True, "stream_options": {"include_usage": True, "every_chunk": True}})
    assert (reply.status, reply.error["param"]) == (400, "stream_options.every_chunk")


@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_priority_needs_the_priority_policy(walk: Walk, endpoint: Endpoint) -> None:
    """The walk's server runs the default fcfs policy: a non-zero priority is vLLM's 400."""
    reply = walk.post(endpoint, {"priority": -1})
    assert reply.status == 400, reply.body
    assert (reply.error["param"], reply.error["code"]) == ("priority", "unsupported_parameter")
    assert "Priority scheduling is not enabled" in reply.error["message"]
