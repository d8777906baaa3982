"""GrammarSpec: a constraint as the API parsed it, and the compiler's cache key: equal specs are
one key, any field differing is another."""

from __future__ import annotations

from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.spec import GrammarKind, GrammarSpec


def test_the_kinds_are_the_apis_names() -> None:
    assert [k.value for k in GrammarKind] == ["json_schema", "json_object", "regex", "choice", "grammar"]
    assert GrammarKind("regex") is GrammarKind.REGEX


def test_equal_specs_are_one_key_and_any_field_makes_another() -> None:
    spec = GrammarSpec(GrammarKind.REGEX, "a+")
    assert spec == GrammarSpec(GrammarKind.REGEX, "a+", "response_format")
    keys = {spec, GrammarSpec(GrammarKind.REGEX, "a+"), GrammarSpec(GrammarKind.REGEX, "b+"),
            GrammarSpec(GrammarKind.GRAMMAR, "a+"), GrammarSpec(GrammarKind.REGEX, "a+", "structured_outputs.regex")}  # fmt: skip
    assert len(keys) == 4


async def test_the_compiler_caches_by_it(compiler: GrammarCompiler) -> None:
    first = await compiler.compile(GrammarSpec(GrammarKind.CHOICE, '["yes", "no"]'))
    assert await compiler.compile(GrammarSpec(GrammarKind.CHOICE, '["yes", "no"]')) is first
    assert await compiler.compile(GrammarSpec(GrammarKind.CHOICE, '["yes", "no"]', "tool_choice")) is not first
