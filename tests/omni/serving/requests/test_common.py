"""Each field declared once with its disposition: the table read back from a Struct, what each
disposition takes (honoured: the Struct judges; default-only: the values that change nothing,
compared as JSON; informational: its shape; rejected: nothing but null), and the 400s naming the
field. GenerationFields is the base both generation bodies share."""

from __future__ import annotations

from typing import Annotated, Any

import pytest
from msgspec import Struct

from omni.errors import APIError
from omni.serving.requests.common import (
    STRING_MAP,
    Disposition,
    GenerationFields,
    KnownField,
    Refused,
    SameAs,
    check_known,
    default_only,
    honoured,
    informational,
    known_fields,
    rejected,
)


class Body(Struct, kw_only=True):
    n: Annotated[int, honoured("choices", ge=1)] = 1
    best_of: Annotated[Refused, default_only("best_of is n", SameAs("n", 1))] = None
    echo: Annotated[Refused, default_only("no echo here", False)] = None
    metadata: Annotated[Refused, informational("kept for the client", STRING_MAP)] = None
    functions: Annotated[Refused, rejected("use tools")] = None


TABLE = known_fields(Body)


def refused(body: dict[str, Any], **kwargs: Any) -> APIError:
    with pytest.raises(APIError) as e:
        check_known(body, TABLE, "/v1/x", **kwargs)
    assert e.value.status == 400
    return e.value


def test_the_table_is_each_fields_disposition_by_its_json_name() -> None:
    assert {name: known.disposition for name, known in TABLE.items()} == {
        "n": Disposition.HONOURED,
        "best_of": Disposition.ACCEPTED_DEFAULT_ONLY,
        "echo": Disposition.ACCEPTED_DEFAULT_ONLY,
        "metadata": Disposition.INFORMATIONAL,
        "functions": Disposition.REJECTED,
    }

    class Undeclared(Struct):
        x: int = 0

    with pytest.raises(AssertionError, match="Undeclared.x has no disposition"):
        known_fields(Undeclared)


def test_every_generation_field_says_what_happens_to_it() -> None:
    table = known_fields(GenerationFields)
    assert {"temperature", "max_tokens", "seed", "stop", "n"} <= set(table)
    assert all(known.reason for known in table.values())


def test_an_unknown_field_is_named_and_with_list_fields_the_known_ones_too() -> None:
    error = refused({"frobnicate": 1})
    assert (error.param, error.code) == ("frobnicate", "unknown_parameter")
    assert "'frobnicate' is not a field of /v1/x." in str(error)
    listed = refused({"frobnicate": 1}, list_fields=True)
    assert "(fields: best_of, echo, functions, metadata, n)" in str(listed)


def test_a_default_only_field_takes_the_values_that_change_nothing_compared_as_json() -> None:
    check_known({"echo": False, "best_of": 3, "n": 3}, TABLE, "/v1/x")  # best_of equal to n
    check_known({"best_of": 1.0}, TABLE, "/v1/x")  # n's own default; 1.0 is 1 as JSON
    assert refused({"echo": 0}).param == "echo"  # 0 is not false
    error = refused({"best_of": 2, "n": 3})
    assert (error.param, error.code) == ("best_of", "unsupported_parameter")
    assert "only a value equal to 'n' or null is accepted, got 2" in str(error)


def test_informational_checks_its_shape_and_rejected_takes_only_null() -> None:
    check_known({"metadata": {"a": "b"}, "functions": None}, TABLE, "/v1/x")
    assert refused({"metadata": {"a": 1}}).code == "invalid_type"
    error = refused({"functions": []})
    assert (error.param, error.code, error.message) == ("functions", "unsupported_parameter", "'functions' is not supported: use tools.")


def test_a_refused_value_names_what_is_accepted() -> None:
    assert KnownField(Disposition.ACCEPTED_DEFAULT_ONLY, "r", defaults=(False,)).accepted == "false or null"
    assert KnownField(Disposition.ACCEPTED_DEFAULT_ONLY, "r", defaults=("auto", 0)).accepted == '"auto" or 0 or null'
