"""Tool calls in generated text: find them, take them out of the content, stream them.

A model writes a call as markup inside its text, `<tool_call>...</tool_call>`; the body's format
is the model family's (a subclass per format). Everything outside the calls is content, except
whitespace that touches a call: models put newlines around their calls, and a client would see
them as a stray message.

    "I'll look.\\n<tool_call>..</tool_call>\\n<tool_call>..</tool_call>\\n"
     |-content-||------- call 0 ------||gap||------- call 1 ------||tail|
    the "\\n" before call 0, the gap and the tail are whitespace touching a call: dropped

A call whose body does not parse, or that is never closed, stays in the content as it was
written, so nothing the model wrote is lost. parse() and the streaming push()/finish() give the
same result for any chunking of the same text; the tests check exactly that.

Streaming sends a call once its `</tool_call>` arrives, as one or more argument fragments: a
call is only known to be a call when it closes, and a fragment once sent cannot be taken back.
"""

from __future__ import annotations

import json
import re
import secrets
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


@dataclass(frozen=True, slots=True)
class ToolFunction:
    """One function of a request's `tools`; parameters is the JSON schema of its arguments."""

    name: str
    description: str | None = None
    parameters: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments: str  # the arguments object as JSON text


@dataclass(slots=True)
class ToolCallDelta:
    """One streamed piece of a call (OpenAI's delta.tool_calls[i]). The call's first piece
    carries its id and name; the arguments of all its pieces concatenate to the call's."""

    index: int
    id: str | None
    name: str | None
    arguments: str


@dataclass(frozen=True, slots=True)
class _Call:
    """A parsed call body: the arguments JSON text, already cut into its streamed pieces."""

    name: str
    pieces: tuple[str, ...]


def new_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def is_string_schema(schema: Any) -> bool:
    """Whether a property's schema only admits strings (null aside). Formats that write
    argument values bare, like hyperclovax's, read such a value as the text itself."""
    if not isinstance(schema, Mapping):
        return False
    kind = schema.get("type")
    if isinstance(kind, str):
        return kind == "string"
    if isinstance(kind, list):
        return "string" in kind and all(k in ("string", "null") for k in kind)
    if "enum" in schema or "const" in schema:
        values = schema.get("enum", [schema.get("const")])
        return bool(values) and all(isinstance(v, str) for v in values)
    return False


def _no_constant(name: str) -> Any:
    # NaN and Infinity are not JSON; json.dumps would write them back out as invalid text.
    raise ValueError(name)


def _loads(text: str) -> Any:
    return json.loads(text, parse_constant=_no_constant)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False)


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest end of text that is a proper beginning of marker."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


def _trailing_space(text: str) -> int:
    return len(text) - len(text.rstrip())


class ToolParser(ABC):
    name: ClassVar[str]
    markup_tokens: ClassVar[tuple[str, ...]]  # the detokenizer keeps these in the text
    call_start: ClassVar[str] = "<tool_call>"
    call_end: ClassVar[str] = "</tool_call>"

    def __init__(self, tools: Sequence[ToolFunction]) -> None:
        self.tools = {t.name: t for t in tools}
        # Streaming state. _buffer is text not yet decided on: in a call, the call so far from
        # its start marker; outside, a possible beginning of the start marker.
        self._buffer = ""
        self._in_call = False
        self._searched = 0  # in a call: where in _buffer to look for its end marker
        self._held_space = ""  # whitespace sent only if no call follows it
        self._after_call = False  # leading whitespace is dropped
        self._num_calls = 0

    @abstractmethod
    def _read_call(self, body: str) -> _Call | None:
        """The call in the text between the markers; None when it is not a well-formed call."""

    @abstractmethod
    def _read_cut_call(self, body: str) -> _Call | None:
        """A call the length limit cut (the text after its start marker): its name and its
        arguments as far as they were written, the JSON left open; None before the name is whole."""

    def parse(self, text: str, *, cut: bool = False) -> tuple[str, list[ToolCall]]:
        """The whole output -> (content without the calls, the calls in order). cut: the output
        ended at the length limit, so an unclosed call at its end is a call, not content."""
        texts: list[str] = []  # texts[k] is the text before call k; the last one is the tail
        calls: list[_Call] = []
        run = ""  # text since the last call, malformed calls included
        pos = 0
        start, end = self.call_start, self.call_end
        while (i := text.find(start, pos)) >= 0 and (j := text.find(end, i + len(start))) >= 0:
            call = self._read_call(text[i + len(start) : j])
            if call is None:
                run += text[pos : j + len(end)]
            else:
                texts.append(run + text[pos:i])
                calls.append(call)
                run = ""
            pos = j + len(end)
        tail = text[pos:]
        i = tail.find(start) if cut else -1
        if i >= 0:  # the length limit cut a call: it is one, with its arguments as written
            partial = self._read_cut_call(tail[i + len(start) :])
            texts.append((run + tail[:i]).rstrip())  # as before a whole call, the space touching it goes
            if partial is not None:
                calls.append(partial)
                texts.append("")
        else:
            texts.append(run + tail)
        pieces = []
        for k, piece in enumerate(texts):
            if k > 0:
                piece = piece.lstrip()
            if k < len(calls):
                piece = piece.rstrip()
            pieces.append(piece)
        content = "".join(pieces)
        return content, [ToolCall(new_call_id(), c.name, "".join(c.pieces)) for c in calls]

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        """The next piece of output -> (content to send now, call pieces to send now)."""
        self._buffer += text
        content: list[str] = []
        deltas: list[ToolCallDelta] = []
        start, end = self.call_start, self.call_end
        while True:
            if self._in_call:
                j = self._buffer.find(end, self._searched)
                if j < 0:  # the next search starts where an end marker could still begin
                    self._searched = max(len(start), len(self._buffer) - len(end) + 1)
                    break
                raw, self._buffer = self._buffer[: j + len(end)], self._buffer[j + len(end) :]
                self._in_call = False
                call = self._read_call(raw[len(start) : -len(end)])
                if call is None:
                    content.append(self._held_space + raw)
                else:
                    deltas.extend(self._deltas(call))
                self._held_space = ""
                self._after_call = call is not None
                continue
            if self._after_call:
                self._buffer = self._buffer.lstrip()
                if not self._buffer:
                    break
                self._after_call = False
            i = self._buffer.find(start)
            cut = i if i >= 0 else len(self._buffer) - _partial_suffix(self._buffer, start)
            ready = self._held_space + self._buffer[:cut]
            n = _trailing_space(ready)
            content.append(ready[: len(ready) - n])
            self._held_space = ready[len(ready) - n :]
            self._buffer = self._buffer[cut:]
            if i < 0:
                break
            self._in_call, self._searched = True, len(start)
        return "".join(content), deltas

    def finish(self, *, cut: bool = False) -> tuple[str, list[ToolCallDelta]]:
        """End of output: what was held back is content (an unclosed call as written), unless
        the length limit cut it (cut): then it is a call with its arguments as far as written."""
        if cut and self._in_call:
            partial = self._read_cut_call(self._buffer[len(self.call_start) :])
            self._buffer, self._held_space, self._in_call = "", "", False
            return "", [] if partial is None else self._deltas(partial)
        content = self._held_space + self._buffer
        self._buffer, self._held_space, self._in_call = "", "", False
        return content, []

    def _deltas(self, call: _Call) -> list[ToolCallDelta]:
        index = self._num_calls
        self._num_calls += 1
        first, *rest = call.pieces
        return [ToolCallDelta(index, new_call_id(), call.name, first)] + [
            ToolCallDelta(index, None, None, piece) for piece in rest
        ]


class HermesToolParser(ToolParser):
    """Hermes / Qwen2.5: `<tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>`.

    The arguments are written back with json.dumps, so a call's arguments text does not depend
    on the model's spacing; some models say "parameters", and some give the object as a string.
    """

    name = "hermes"
    markup_tokens = ("<tool_call>", "</tool_call>")

    def _read_call(self, body: str) -> _Call | None:
        try:
            obj = _loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            return None
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):
            try:
                args = _loads(args)
            except ValueError:
                return None
        if not isinstance(args, dict):
            return None
        return _Call(obj["name"], (_dumps(args),))

    def _read_cut_call(self, body: str) -> _Call | None:
        name = _HERMES_NAME.search(body)
        if name is None:
            return None
        args = _HERMES_ARGS.search(body, name.end())
        return _Call(json.loads(f'"{name.group(1)}"'), (body[args.end() :] if args else "",))


_HERMES_NAME = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)+)"')
_HERMES_ARGS = re.compile(r'"(?:arguments|parameters)"\s*:\s*')
_ARG_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>\s*", re.DOTALL)
_FUNCTION_NAME = re.compile(r"\s*([^\s<>]+)\s*")


class HyperCLOVAXToolParser(ToolParser):
    """HyperCLOVAX-SEED-Omni (GLM-4.5's format):
    `<tool_call>f\\n<arg_key>k</arg_key>\\n<arg_value>v</arg_value>\\n</tool_call>`.

    A value is bare text: it is the string itself when the function's schema types the
    property as a string, and JSON otherwise (or the text, when it is not valid JSON). Each
    key/value pair is one streamed fragment: `{"k": v`, then `, "k2": v2`, then `}`.
    """

    name = "hyperclovax"
    markup_tokens = ("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>")

    def _read_call(self, body: str) -> _Call | None:
        head = _FUNCTION_NAME.match(body)
        if head is None:
            return None
        name = head.group(1)
        tool = self.tools.get(name)
        properties = tool.parameters.get("properties", {}) if tool is not None else {}
        args: dict[str, Any] = {}
        pos = head.end()
        while pos < len(body):
            pair = _ARG_PAIR.match(body, pos)
            if pair is None:
                return None
            key, value = pair.group(1).strip(), pair.group(2)
            if not key:
                return None
            args[key] = value if is_string_schema(properties.get(key)) else _json_or_text(value)
            pos = pair.end()
        if not args:
            return _Call(name, ("{}",))
        items = [f"{_dumps(k)}: {_dumps(v)}" for k, v in args.items()]
        return _Call(name, ("{" + items[0], *(", " + item for item in items[1:]), "}"))

    def _read_cut_call(self, body: str) -> _Call | None:
        head = _FUNCTION_NAME.match(body)
        if head is None or head.end() == len(body):  # the name may not be whole yet
            return None
        name = head.group(1)
        tool = self.tools.get(name)
        properties = tool.parameters.get("properties", {}) if tool is not None else {}
        items: list[str] = []
        pos = head.end()
        while (pair := _ARG_PAIR.match(body, pos)) is not None:
            key, value = pair.group(1).strip(), pair.group(2)
            typed = value if is_string_schema(properties.get(key)) else _json_or_text(value)
            items.append(f"{_dumps(key)}: {_dumps(typed)}")
            pos = pair.end()
        # A pair the limit cut: its key, once whole, and its value as far as written (a string
        # value left open).
        rest = _CUT_PAIR.match(body, pos)
        if rest is not None:
            key, value = rest.group(1).strip(), rest.group(2)
            if is_string_schema(properties.get(key)):
                items.append(f"{_dumps(key)}: {_dumps(value)[:-1]}")
            else:
                items.append(f"{_dumps(key)}: {value}")
        arguments = "{" + ", ".join(items)
        return _Call(name, (arguments,))


_CUT_PAIR = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*)", re.DOTALL)


def _json_or_text(text: str) -> Any:
    try:
        return _loads(text)
    except ValueError:
        return text


class _WholeOutputParser(ToolParser):
    """A format with no markup, whose whole output is the call(s) (a forced call on a model whose
    chat format has none, as vLLM serves it; the grammar is tool_grammar.py's of the same name).
    Streamed, the calls come when the output ends: JSON is only known to be whole then. Output
    that does not read as the format stays content, as it was written."""

    markup_tokens = ()

    @abstractmethod
    def _read_output(self, text: str, *, cut: bool) -> list[_Call] | None:
        """The calls in the whole output; None when it is not this format. cut: the length
        limit ended it, so the last call may be partial."""

    def parse(self, text: str, *, cut: bool = False) -> tuple[str, list[ToolCall]]:
        calls = self._read_output(text, cut=cut)
        if calls is None:
            return text, []
        return "", [ToolCall(new_call_id(), c.name, "".join(c.pieces)) for c in calls]

    def push(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buffer += text
        return "", []

    def finish(self, *, cut: bool = False) -> tuple[str, list[ToolCallDelta]]:
        text, self._buffer = self._buffer, ""
        calls = self._read_output(text, cut=cut)
        if calls is None:
            return text, []
        return "", [delta for call in calls for delta in self._deltas(call)]

    def _read_cut_call(self, body: str) -> _Call | None:
        return None  # (not used: _read_output reads a cut output whole)


class JsonCallsParser(_WholeOutputParser):
    """tool_choice "required": `[{"name": "f", "parameters": {...}}, ...]`, vLLM's list of calls
    ("arguments" read as well). Cut by the length limit: the calls it holds whole, then the one
    it cut, once its name is whole, with its arguments as far as written."""

    name = "json_calls"

    def _read_output(self, text: str, *, cut: bool) -> list[_Call] | None:
        try:
            items = _loads(text)
        except ValueError:
            return self._read_cut_list(text) if cut else None
        if not isinstance(items, list) or not items:
            return None
        calls = [self._read_item(item) for item in items]
        return None if any(c is None for c in calls) else [c for c in calls if c is not None]

    def _read_call(self, body: str) -> _Call | None:
        try:
            return self._read_item(_loads(body))
        except ValueError:
            return None

    @staticmethod
    def _read_item(item: Any) -> _Call | None:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            return None
        args = item.get("parameters", item.get("arguments", {}))
        return _Call(item["name"], (_dumps(args),)) if isinstance(args, dict) else None

    def _read_cut_list(self, text: str) -> list[_Call]:
        """    [{"name":"f","parameters":{..}},{"name":"g","parameters":{"a":1
                |------- whole: decoded ------| |-- cut: name, then the rest as written"""
        decoder = json.JSONDecoder(parse_constant=_no_constant)
        calls: list[_Call] = []
        pos = len(text) - len(text.lstrip())
        if not text.startswith("[", pos):
            return calls
        pos += 1
        while pos < len(text):
            pos += len(text[pos:]) - len(text[pos:].lstrip(" \t\n\r,"))
            try:
                item, pos = decoder.raw_decode(text, pos)
            except ValueError:
                name = _HERMES_NAME.search(text, pos)
                if name is not None:
                    args = _JSON_PARAMETERS.search(text, name.end())
                    calls.append(_Call(json.loads(f'"{name.group(1)}"'), (text[args.end() :] if args else "",)))
                break
            call = self._read_item(item)
            if call is None:
                break
            calls.append(call)
        return calls


class JsonArgumentsParser(_WholeOutputParser):
    """A named function: the whole output is its arguments object (as vLLM's named tool_choice).
    Cut by the length limit: a call with the arguments as far as written."""

    name = "json_arguments"

    def _read_output(self, text: str, *, cut: bool) -> list[_Call] | None:
        if len(self.tools) != 1:
            return None
        call = self._read_call(text)
        if call is None and cut and text.lstrip().startswith("{"):
            call = _Call(next(iter(self.tools)), (text.strip(),))
        return None if call is None else [call]

    def _read_call(self, body: str) -> _Call | None:
        try:
            args = _loads(body)
        except ValueError:
            return None
        return _Call(next(iter(self.tools)), (_dumps(args),)) if isinstance(args, dict) else None


_JSON_PARAMETERS = re.compile(r'"(?:parameters|arguments)"\s*:\s*')

# The formats a chat template writes, which --tool-call-parser names.
TOOL_PARSERS: dict[str, type[ToolParser]] = {
    "hermes": HermesToolParser,
    "hyperclovax": HyperCLOVAXToolParser,
    "glm45": HyperCLOVAXToolParser,  # vLLM's name for the same format
}
# The server's own, for forced calls on a model whose template has no tool format.
JSON_TOOL_PARSERS: dict[str, type[ToolParser]] = {p.name: p for p in (JsonCallsParser, JsonArgumentsParser)}


def tool_parser_class(name: str) -> type[ToolParser]:
    try:
        return TOOL_PARSERS.get(name) or JSON_TOOL_PARSERS[name]
    except KeyError:
        known = sorted([*TOOL_PARSERS, *JSON_TOOL_PARSERS])
        raise ValueError(f"unknown tool call parser {name!r}; known: {', '.join(known)}") from None
