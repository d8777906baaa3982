"""One bounds table, read by both sides: a value the table refuses is a 400 at the API and a
refusal at the worker, a value it admits passes both, and no request Struct bounds a sampling
field otherwise (the two cannot drift apart without a test here failing)."""

from __future__ import annotations

import importlib
import inspect
import math
import pkgutil
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest

import omni.serving.requests
from gpu_workers.sample.sampler import validate_options
from omni.engines.step import sampling_options
from omni.errors import APIError
from omni.serving.requests import parse_chat_completion_request, parse_completion_request
from omni.serving.sampling import sampling_params
from omni.shared.protocol import SamplingOptions
from omni.shared.sampling_bounds import SAMPLING_BOUNDS, Bound, sampling_bound
from omni.text.tokenizer import TextTokenizer
from scheduler.request import Request, RequestId

ENDS = ("ge", "gt", "le", "lt")


def probes(bound: Bound) -> list[tuple[float, bool]]:
    """(value, whether the bound admits it) at each end: the end itself, the next value past it
    and the next value inside; NaN and the infinities for a float bound."""
    out: list[tuple[float, bool]] = []
    for end, outward in (("ge", -1), ("gt", -1), ("le", 1), ("lt", 1)):
        e = getattr(bound, end)
        if e is None:
            continue
        closed = end in ("ge", "le")
        if isinstance(e, int):
            out += [(e, closed), (e + outward, False), (e - outward, True)]
        else:
            out += [(e, closed), (math.nextafter(e, outward * math.inf), False)]
            out += [(math.nextafter(e, -outward * math.inf), True)]
    if not any(isinstance(getattr(bound, end), int) for end in ENDS):
        out += [(math.nan, False), (math.inf, False), (-math.inf, False)]
    return out


CASES = [(name, value, admitted) for name, bound in SAMPLING_BOUNDS.items() for value, admitted in probes(bound)]
IDS = [f"{name}={value!r}" for name, value, _ in CASES]


def api_fields(name: str, value: float) -> dict[str, Any]:
    if name == "logit_bias_values":
        return {"logit_bias": {"5": value}}
    return {name: value}


def wire_options(name: str, value: float) -> SamplingOptions:
    if name == "logit_bias_values":
        return SamplingOptions(logit_bias_token_ids=[5], logit_bias_values=[value])
    return SamplingOptions(**{name: value})


def test_the_probes_test_both_sides_of_every_end() -> None:
    for name, bound in SAMPLING_BOUNDS.items():
        verdicts = {admitted for _, admitted in probes(bound)}
        assert verdicts == {True, False}, name
        assert all(bound.admits(v) is admitted for v, admitted in probes(bound)), name


@pytest.mark.parametrize(("name", "value", "admitted"), CASES, ids=IDS)
def test_the_api_refuses_exactly_what_the_table_refuses(name: str, value: float, admitted: bool) -> None:
    for parse, body in (
        (parse_chat_completion_request, {"model": "m", "messages": [{"role": "user", "content": "hi"}]}),
        (parse_completion_request, {"model": "m", "prompt": "hi"}),
    ):
        if admitted:
            parse(body | api_fields(name, value))
        else:
            with pytest.raises(APIError) as e:
                parse(body | api_fields(name, value))
            assert (e.value.status, e.value.param) == (400, "logit_bias" if name == "logit_bias_values" else name)


@pytest.mark.parametrize(("name", "value", "admitted"), CASES, ids=IDS)
def test_the_worker_refuses_exactly_what_the_table_refuses(name: str, value: float, admitted: bool) -> None:
    if admitted:
        validate_options(wire_options(name, value))
    else:
        with pytest.raises(ValueError, match=name):
            validate_options(wire_options(name, value))


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.mark.parametrize(("name", "value"), [(n, v) for n, v, ok in CASES if ok], ids=[i for i, c in zip(IDS, CASES) if c[2]])
def test_what_the_api_admits_reaches_the_worker_admitted(tok: TextTokenizer, name: str, value: float) -> None:
    """Through the server's own conversions (the request, its SamplingParams, the wire's
    SamplingOptions): nothing between them moves a value out of bounds."""
    req = parse_chat_completion_request({"model": "m", "messages": [{"role": "user", "content": "hi"}]} | api_fields(name, value))
    params = sampling_params(req, num_prompt_tokens=3, max_model_len=64, tokenizer=tok)
    options = sampling_options(Request(RequestId("r"), [1, 2, 3], params))
    got = options.logit_bias_values[0] if name == "logit_bias_values" else getattr(options, name)
    assert got == value
    validate_options(options, tok.num_token_ids)


# ---------------------------------------------------------------- every Struct's bounds

# An endpoint whose range lies inside the table's says so here (and reads the table for the rest).
NARROWER = {("TranscriptionFields", "temperature"): {"le": 1.0}}


def _bounds(annotation: Any) -> dict[str, float]:
    """Every numeric end a Meta anywhere in the annotation sets (a map's values, a union's members)."""
    found: dict[str, float] = {}
    if typing.get_origin(annotation) is typing.Annotated:
        for meta in annotation.__metadata__:
            if isinstance(meta, msgspec.Meta):
                found |= {k: getattr(meta, k) for k in ENDS if getattr(meta, k) is not None}
        return found | _bounds(annotation.__origin__)
    for arg in typing.get_args(annotation):
        found |= _bounds(arg)
    return found


def _request_structs() -> list[type[msgspec.Struct]]:
    modules = [f"omni.serving.requests.{m.name}" for m in pkgutil.iter_modules(omni.serving.requests.__path__)]
    modules.append("omni.serving.realtime.client_events")
    found = []
    for name in modules:
        module = importlib.import_module(name)
        found += [
            c for c in vars(module).values()
            if inspect.isclass(c) and issubclass(c, msgspec.Struct) and c.__module__ == name
        ]  # fmt: skip
    return found


def test_every_request_struct_bounds_a_sampling_field_as_the_table_does() -> None:
    checked = set()
    for cls in _request_structs():
        hints = typing.get_type_hints(cls, include_extras=True)
        for f in msgspec.structs.fields(cls):
            key = "logit_bias_values" if f.encode_name == "logit_bias" else f.encode_name
            if key not in SAMPLING_BOUNDS:
                continue
            expected = sampling_bound(key, **NARROWER.get((cls.__name__, key), {}))
            assert _bounds(hints[f.name]) == expected, f"{cls.__name__}.{f.encode_name}"
            checked.add((cls.__name__, key))
    # the walk found the endpoints that have these fields (it is not vacuous)
    assert {
        ("GenerationFields", "temperature"), ("GenerationFields", "repetition_penalty"),
        ("GenerationFields", "logit_bias_values"), ("TranscriptionFields", "temperature"),
        ("SessionFields", "temperature"), ("ResponseFields", "logit_bias_values"), ("ResponseRequest", "top_p"),
    } <= checked, checked  # fmt: skip


def test_a_narrower_end_outside_the_table_is_refused() -> None:
    assert sampling_bound("temperature", le=1.0) == {"ge": 0.0, "le": 1.0}
    with pytest.raises(AssertionError):
        sampling_bound("temperature", le=3.0)  # the worker would refuse what the endpoint admits


def test_bounds_read_as_intervals() -> None:
    assert [str(SAMPLING_BOUNDS[n]) for n in ("temperature", "top_p", "min_tokens")] == ["[0, 2]", "(0, 1]", "[0, inf)"]
    assert not Bound(ge=0.0).admits(math.nan)
