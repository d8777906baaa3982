"""check_fields: every field of OpenAI's and vLLM's two generation APIs is honoured or a 400
naming it; a field in neither API is a 400 too; null is always the default."""

from __future__ import annotations

from typing import Any, get_type_hints

import pytest
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params

from omni.errors import APIError
from omni.serving.requests.dispositions import (
    CHAT_FIELDS,
    COMPLETION_FIELDS,
    FIELDS,
    STREAM_OPTIONS_FIELDS,
    Disposition,
    Endpoint,
    KnownField,
    SameAs,
    check_fields,
)

ENDPOINTS: tuple[Endpoint, ...] = ("chat", "completions")


def error(body: dict[str, Any], endpoint: Endpoint = "chat") -> dict[str, Any]:
    with pytest.raises(APIError) as e:
        check_fields(body, endpoint)
    assert e.value.status == 400
    return e.value.to_dict()["error"]


def fields_of(endpoint: Endpoint, disposition: Disposition) -> list[tuple[Endpoint, str]]:
    return [(endpoint, name) for name, f in FIELDS[endpoint].items() if f.disposition is disposition]


def each(disposition: Disposition) -> list[tuple[Endpoint, str]]:
    return [case for endpoint in ENDPOINTS for case in fields_of(endpoint, disposition)]


# ----------------------------------------------------------------------------- the tables


def test_the_tables_hold_every_field_of_the_openai_client() -> None:
    # openai-python's request params: a field OpenAI adds shows up here on the next upgrade
    chat = set(get_type_hints(chat_params.CompletionCreateParamsStreaming)) | set(
        get_type_hints(chat_params.CompletionCreateParamsNonStreaming)
    )
    completions = set(get_type_hints(completion_params.CompletionCreateParamsStreaming)) | set(
        get_type_hints(completion_params.CompletionCreateParamsNonStreaming)
    )
    assert chat - set(CHAT_FIELDS) == set()
    assert completions - set(COMPLETION_FIELDS) == set()
    assert set(get_type_hints(chat_params.ChatCompletionStreamOptionsParam)) <= set(STREAM_OPTIONS_FIELDS)


def test_the_tables_hold_vllms_extra_fields() -> None:
    vllm_both = {
        "best_of", "use_beam_search", "top_k", "min_p", "repetition_penalty", "length_penalty", "stop_token_ids",
        "include_stop_str_in_output", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
        "truncate_prompt_tokens", "prompt_logprobs", "allowed_token_ids", "bad_words", "structured_outputs",
        "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
        "guided_whitespace_pattern", "priority", "request_id", "logits_processors", "return_tokens_as_token_ids",
        "return_token_ids", "cache_salt", "kv_transfer_params", "vllm_xargs", "thinking_token_budget",
        "add_special_tokens", "response_format",
    }
    vllm_chat = {
        "echo", "add_generation_prompt", "continue_final_message", "documents", "chat_template",
        "chat_template_kwargs", "mm_processor_kwargs", "include_reasoning", "reasoning_effort",
    }
    assert vllm_both | vllm_chat <= set(CHAT_FIELDS)
    assert vllm_both | {"echo", "prompt_embeds", "suffix"} <= set(COMPLETION_FIELDS)
    assert set(STREAM_OPTIONS_FIELDS) == {"include_usage", "continuous_usage_stats", "include_obfuscation"}


@pytest.mark.parametrize(
    "table", [CHAT_FIELDS, COMPLETION_FIELDS, STREAM_OPTIONS_FIELDS], ids=["chat", "completions", "stream_options"]
)
def test_every_entry_says_why_in_one_line_and_has_what_its_disposition_needs(table: dict[str, KnownField]) -> None:
    for name, f in table.items():
        assert f.reason and "\n" not in f.reason and not f.reason.endswith("."), name
        assert bool(f.defaults) == (f.disposition is Disposition.ACCEPTED_DEFAULT_ONLY), name
        assert (f.json_type is not None) == (f.disposition is Disposition.INFORMATIONAL), name


def test_endpoint_only_fields_stay_on_their_endpoint() -> None:
    chat_only = {"messages", "tools", "tool_choice", "max_completion_tokens", "top_logprobs", "chat_template"}
    assert chat_only.isdisjoint(COMPLETION_FIELDS)
    assert {"prompt", "suffix", "prompt_embeds"}.isdisjoint(CHAT_FIELDS)


def test_what_is_refused_today() -> None:
    assert CHAT_FIELDS["functions"].disposition is Disposition.REJECTED
    assert "tools" in CHAT_FIELDS["functions"].reason
    assert "tool_choice" in CHAT_FIELDS["function_call"].reason
    assert CHAT_FIELDS["best_of"].defaults == (SameAs("n", 1),)
    assert CHAT_FIELDS["service_tier"].defaults == ("auto", "default")
    assert CHAT_FIELDS["store"].defaults == (False,)


# ----------------------------------------------------------------------------- unknown fields


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_an_unknown_field_is_a_400_naming_it(endpoint: Endpoint) -> None:
    err = error({"model": "m", "temprature": 0.5}, endpoint)
    assert (err["param"], err["code"]) == ("temprature", "unknown_parameter")
    assert "Unrecognized request argument supplied: 'temprature'" in err["message"]
    assert "not a field of" in err["message"]


def test_a_field_of_the_other_endpoint_says_where_it_belongs() -> None:
    err = error({"prompt": "hi"}, "chat")
    assert (err["param"], err["code"]) == ("prompt", "unknown_parameter")
    assert "it is one of /v1/completions" in err["message"]
    err = error({"max_completion_tokens": 5}, "completions")
    assert err["param"] == "max_completion_tokens"
    assert "it is one of /v1/chat/completions" in err["message"]


def test_an_unknown_key_of_stream_options_is_a_400_naming_it() -> None:
    err = error({"stream": True, "stream_options": {"include_usage": True, "usage_every_chunk": True}})
    assert (err["param"], err["code"]) == ("stream_options.usage_every_chunk", "unknown_parameter")
    assert "not a key of stream_options" in err["message"]


def test_the_first_offending_field_in_body_order_is_named() -> None:
    assert error({"model": "m", "use_beam_search": True, "nope": 1})["param"] == "use_beam_search"
    assert error({"model": "m", "nope": 1, "use_beam_search": True})["param"] == "nope"


def test_a_stream_options_that_is_no_object_is_left_to_the_parser() -> None:
    check_fields({"stream": True, "stream_options": "yes"}, "chat")


# ----------------------------------------------------------------------------- null


@pytest.mark.parametrize("endpoint", ENDPOINTS)
def test_null_is_accepted_for_every_known_field(endpoint: Endpoint) -> None:
    check_fields(dict.fromkeys(FIELDS[endpoint]), endpoint)
    check_fields({"stream": True, "stream_options": dict.fromkeys(STREAM_OPTIONS_FIELDS)}, endpoint)


# ----------------------------------------------------------------------------- rejected


@pytest.mark.parametrize(("endpoint", "name"), each(Disposition.REJECTED))
@pytest.mark.parametrize("value", ["x", {}, [], False, 0], ids=["string", "object", "array", "false", "zero"])
def test_every_rejected_field_is_a_400_naming_it_whatever_its_value(endpoint: Endpoint, name: str, value: Any) -> None:
    err = error({"model": "m", name: value}, endpoint)
    assert (err["param"], err["code"]) == (name, "unsupported_parameter")
    assert err["message"] == f"'{name}' is not supported: {FIELDS[endpoint][name].reason}."


def test_the_deprecated_function_fields_point_at_tools() -> None:
    functions = [{"name": "f", "parameters": {"type": "object"}}]
    assert "use tools" in error({"functions": functions})["message"]
    assert "use tool_choice" in error({"function_call": "auto"})["message"]


# ----------------------------------------------------------------------------- accepted at the default only


def _other_than(default: Any) -> Any:
    """A value clearly not the default, of the same JSON type."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, (int, float)):
        return default + 2
    return f"{default}-x"


@pytest.mark.parametrize(("endpoint", "name"), each(Disposition.ACCEPTED_DEFAULT_ONLY))
def test_a_default_only_field_takes_its_defaults_and_refuses_the_rest(endpoint: Endpoint, name: str) -> None:
    f = FIELDS[endpoint][name]
    for default in f.defaults:
        value = default.default if isinstance(default, SameAs) else default
        check_fields({"model": "m", name: value}, endpoint)
    first = f.defaults[0]
    other = _other_than(first.default if isinstance(first, SameAs) else first)
    err = error({"model": "m", name: other}, endpoint)
    assert (err["param"], err["code"]) == (name, "unsupported_parameter")
    assert err["message"].startswith(f"'{name}' is not supported: {f.reason}; only ")


@pytest.mark.parametrize(
    "body",
    [
        {"best_of": 1},
        {"n": 3, "best_of": 3},
        {"n": None, "best_of": 1},
        {"use_beam_search": False},
        {"length_penalty": 1},  # 1 is 1.0
        {"routed_experts_prompt_start": 0.0},
        {"service_tier": "auto"},
        {"service_tier": "default"},
        {"store": False},
        {"spaces_between_special_tokens": True},
        {"add_special_tokens": False},
        {"stream": True, "stream_options": {"include_usage": True, "include_obfuscation": False}},
    ],
)
def test_no_op_values_are_accepted(body: dict[str, Any]) -> None:
    check_fields(body, "chat")


@pytest.mark.parametrize(
    ("body", "param", "message"),
    [
        ({"best_of": 2}, "best_of", "only a value equal to 'n' or null is accepted, got 2."),
        ({"n": 2, "best_of": 3}, "best_of", "got 3."),
        ({"use_beam_search": True}, "use_beam_search", "only false or null is accepted, got true."),
        ({"use_beam_search": 0}, "use_beam_search", "got 0."),  # 0 is no boolean
        ({"routed_experts_prompt_start": False}, "routed_experts_prompt_start", "only 0 or null is accepted, got false."),
        ({"service_tier": "flex"}, "service_tier", 'only "auto" or "default" or null is accepted, got "flex".'),
        ({"store": True}, "store", "completions are not stored; only false or null is accepted, got true."),
        ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation", "got true."),
    ],
)
def test_other_values_are_400s_naming_the_field(body: dict[str, Any], param: str, message: str) -> None:
    err = error(body)
    assert (err["param"], err["code"]) == (param, "unsupported_parameter")
    assert err["message"].endswith(message)


def test_default_only_is_endpoint_specific() -> None:
    # the chat template writes BOS itself; a completions prompt gets the tokenizer's
    check_fields({"add_special_tokens": False}, "chat")
    check_fields({"add_special_tokens": True}, "completions")
    assert error({"add_special_tokens": True}, "chat")["param"] == "add_special_tokens"
    assert error({"add_special_tokens": False}, "completions")["param"] == "add_special_tokens"
    check_fields({"suffix": ""}, "completions")
    assert error({"suffix": " the end."}, "completions")["param"] == "suffix"


# ----------------------------------------------------------------------------- informational and honoured


@pytest.mark.parametrize(
    ("endpoint", "body"),
    [
        ("chat", {"user": "u-1", "metadata": {"team": "a"}, "safety_identifier": "h", "prompt_cache_key": "k"}),
        ("chat", {"session_id": "s", "guided_decoding_backend": "xgrammar"}),
        ("completions", {"user": "u-1", "session_id": "s"}),
    ],
)
def test_informational_fields_are_accepted(endpoint: Endpoint, body: dict[str, Any]) -> None:
    check_fields(body, endpoint)


@pytest.mark.parametrize(
    ("body", "param"),
    [({"user": 5}, "user"), ({"metadata": {"n": 1}}, "metadata"), ({"metadata": "x"}, "metadata"), ({"session_id": []}, "session_id")],
)
def test_informational_fields_are_type_checked_as_nothing_else_reads_them(body: dict[str, Any], param: str) -> None:
    err = error(body)
    assert (err["param"], err["code"]) == (param, "invalid_type")


def test_honoured_values_are_left_to_the_parser() -> None:
    # check_fields judges only what the parsers do not read; "hot" is chat.py's type error
    check_fields({"temperature": "hot", "n": -1, "tools": [], "echo": True, "request_id": "r"}, "chat")
    check_fields({"echo": True, "logprobs": 9}, "completions")
