"""GrammarSpec: the output constraint a request asked for, as the API parsed it."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class GrammarKind(enum.Enum):
    JSON_SCHEMA = "json_schema"  # source: the schema as JSON text
    JSON_OBJECT = "json_object"  # any JSON object; source unused
    REGEX = "regex"  # source: the pattern (Rust regex syntax, as vLLM's guided_regex)
    CHOICE = "choice"  # source: a JSON array of the strings, exactly one of which is output
    GRAMMAR = "grammar"  # source: a Lark grammar, or GBNF/EBNF (rules written with ::=)


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """Hashable, so the compiler caches by it. param names the request field, for errors."""

    kind: GrammarKind
    source: str = ""
    param: str = "response_format"
