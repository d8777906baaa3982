"""Chat templates rendered as transformers' apply_chat_template(..., tokenize=False) renders
them, with every large join of the render copied outside the GIL.

The server renders in a worker thread, but a Jinja render of a 60 MB message is a series of
C calls that each copy the whole message with the GIL held (~50 ms apiece), and for each one
the event loop stands still. Those copies are the template's joins, and each is routed
through gil_free.join_str (small joins keep the plain join, cheaper there):

    '<|im_start|>' + m['content'] + '<|im_end|>'   +, str + str    the sandbox's binop_table['+']
    m['role'] ~ ': ' ~ m['content']                ~               the compiled module's str_join
    a macro's, caller()'s or {% set %}'s body       its buffer      environment.concat
    the template's output                           its pieces      environment.concat
    parts | join('\n')                              the filter      filters['join']

The environment is an overlay of the one transformers builds (its sandbox, tojson, the
raise_exception/strftime_now/dict/namespace globals, {% generation %}, trim and lstrip
blocks) that differs only in those joins. What apply_chat_template does around the render
(the special tokens as variables, the reasoning aliases, continue_final_message) is done here
the same way, with transformers' own helpers where it has them.
"""

from __future__ import annotations

import inspect
import re
import secrets
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextvars import ContextVar
from functools import lru_cache
from typing import Any

import jinja2
from jinja2.filters import make_attrgetter
from jinja2.nodes import EvalContext
from jinja2.sandbox import SandboxedEnvironment
from transformers.tokenization_utils_base import PreTrainedTokenizerBase
from transformers.utils.chat_template_utils import (
    _REASONING_FIELDS,
    _alias_reasoning_fields,
    _compile_jinja_template,
    _normalize_chat_messages,
    _plain_template_data,
    get_json_schema,
)

from omni.shared.gil_free import LARGE, join_str

# What transformers appends to the final message under continue_final_message, to find where
# that message ends in the rendered text.
_TAG = "CONTINUE_FINAL_MESSAGE_TAG "

# apply_chat_template's parameters that render has no argument for. A template variable of one
# of these names is taken by that call instead of reaching the template: the first two are
# passed already (a second value is a TypeError), with tokenize=False the next two refuse, and
# the rest change nothing in the text.
_PASSED = frozenset({"conversation", "tokenize"})
_REFUSED = {
    "return_assistant_tokens_mask": "return_assistant_tokens_mask needs the tokens, not the text",
    "sanitize_control_tokens": "sanitize_control_tokens needs the tokens, not the text",
}
_UNUSED = frozenset(
    {"padding", "truncation", "max_length", "return_tensors", "return_dict", "tokenizer_kwargs"}
)

# Templates compiled per environment, one per source; a server sees its model's template and
# the few a client may send.
_CACHED_TEMPLATES = 32


class _TaggedJoins:
    """The joins of one render whose result holds the tagged final message, by their pieces.

    transformers cuts the rendered text at the tag, after checking that the final message is in
    it. Both are single C calls over the whole text with the GIL held: the check a substring
    search as long as the message (~200 ms for 60 MB), the cut a slice of everything before the
    tag. With the pieces of each join that led to the text, the check reads off them that the
    message is one of them, and the cut joins the pieces before the tag:

        text   '<|im_start|>assistant\\n' + (MESSAGE + TAG) + '<|im_end|>'   (nested joins)
        kept   [0, tag_at): the pieces before the tag, MESSAGE among them, joined, not sliced
    """

    def __init__(self) -> None:
        # id(result) -> (result, its pieces). Holding each result keeps its id from being
        # taken by another string while the render lasts.
        self._joined: dict[int, tuple[str, Sequence[str]]] = {}

    def tag(self, value: Any) -> Any:
        if type(value) is not str:
            return value + _TAG  # whatever transformers' own `+` makes of it (a TypeError)
        tagged = _join([value, _TAG])
        self._record(tagged, (value, _TAG))
        return tagged

    def after_join(self, out: str, pieces: Sequence[Any]) -> None:
        if any(id(p) in self._joined for p in pieces):
            self._record(out, pieces)

    def _record(self, out: str, pieces: Sequence[str]) -> None:
        # A join of one piece returns that piece: it is no new string.
        if all(p is not out for p in pieces):
            self._joined[id(out)] = (out, pieces)

    def cut(self, text: str, final: str) -> str:
        """The rendered text up to the end of the final message, where transformers cuts it."""
        tag_at = text.rfind(_TAG.strip())
        if tag_at < 0 or not (self.contains(text, final) or final.strip() in text):
            # (transformers' message quotes the whole rendered chat; a long one is not echoed.)
            raise ValueError(
                "continue_final_message is set but the final message does not appear in the "
                "rendered chat: the chat template changes or drops part of it"
            )
        if text.startswith(_TAG, tag_at):
            return self.prefix(text, tag_at)
        # The template trimmed the space after the tag, and so maybe the message's own
        # trailing whitespace: the text is cut before all of it.
        return self.prefix(text, _rstripped_end(text, tag_at))

    def contains(self, text: str, part: str) -> bool:
        """Whether part is one of the pieces text was joined from, at any depth."""
        stack, seen = [text], set()
        while stack:
            s = stack.pop()
            if s is part:
                return True
            entry = self._joined.get(id(s))
            if entry is not None and id(s) not in seen:
                seen.add(id(s))
                stack.extend(entry[1])
        return False

    def prefix(self, text: str, end: int) -> str:
        """text[:end], as a join of the pieces text was joined from where it was."""
        kept: list[str] = []
        s = text
        while (entry := self._joined.get(id(s))) is not None:
            for piece in entry[1]:
                if end <= len(piece):
                    s = piece
                    break
                kept.append(piece)
                end -= len(piece)
            else:
                return _join(kept)  # end past the pieces (not for end <= len(text))
        # A string that no join of this render made (a filter's, say): sliced, as transformers
        # slices the whole text.
        kept.append(s[:end])
        return _join(kept)

    def release(self) -> None:
        """Drops the strings one at a time. Freeing a large one unmaps its pages with the GIL
        held (~12 ms for 120 MB); between two frees other threads run, where dropping the
        table at once would free them all in one go."""
        while self._joined:
            self._joined.popitem()


# The continued render in progress in this context, if any: renders run in worker threads,
# several at once, over one environment.
_tagged_joins: ContextVar[_TaggedJoins | None] = ContextVar("tagged_joins", default=None)


def _join(pieces: list[Any]) -> str:
    try:
        large = sum(map(len, pieces)) >= LARGE
    except TypeError:
        large = False  # a piece with no length: "".join raises its own error
    out = join_str(pieces) if large else "".join(pieces)
    tagged = _tagged_joins.get()
    if tagged is not None:
        tagged.after_join(out, pieces)
    return out


def _concat(pieces: Iterable[str]) -> str:
    return _join(list(pieces))


def _str_join(values: Iterable[Any]) -> str:
    """`a ~ b ~ c`: jinja2.runtime.str_join's conversion of each value to str, then the join."""
    return _join([str(v) for v in values])


def _join_filter(default: Callable[..., str]) -> Callable[..., str]:
    @jinja2.pass_eval_context
    def join(
        eval_ctx: EvalContext, value: Iterable[Any], d: Any = "", attribute: Any = None
    ) -> str:
        if eval_ctx.autoescape:
            return default(eval_ctx, value, d, attribute)  # Markup's escaping join
        # The order Jinja's filter reads its arguments in: the separator, then each value.
        sep = str(d)
        if attribute is not None:
            value = map(make_attrgetter(eval_ctx.environment, attribute), value)
        items = [str(v) for v in value]
        pieces = [sep] * (2 * len(items) - 1) if items else []
        pieces[::2] = items
        return _join(pieces)

    return join


# Characters of a long string JSON-escaped per json.dumps call in tojson.
_TOJSON_WINDOW = 1 << 18


def _tojson_filter(default: Callable[..., str]) -> Callable[..., str]:
    """`x | tojson`: transformers' filter (json.dumps), with each long string in x escaped a
    window at a time and spliced into the dump of the rest by join_str. json.dumps escapes one
    character at a time, so the windows' escapes are the whole's; the rest is dumped as it is,
    with a placeholder in each long string's place that no client can write."""

    def tojson(x: Any, *args: Any, **kwargs: Any) -> str:
        longs: dict[str, str] = {}
        skeleton = _lift_long_strings(x, longs)
        if not longs:
            return default(x, *args, **kwargs)
        dumped = default(skeleton, *args, **kwargs)
        pieces: list[str] = []
        start = 0
        for match in _PLACEHOLDER.finditer(dumped):
            text = longs[match.group(1)]
            pieces.append(dumped[start : match.start()])
            pieces += ['"', *_escaped_windows(default, text, *args, **kwargs), '"']
            start = match.end()
        pieces.append(dumped[start:])
        return _join(pieces)

    return tojson


_NONCE = secrets.token_hex(8)
_PLACEHOLDER = re.compile(f'"omni-long-{_NONCE}-([0-9]+)"')


def _lift_long_strings(value: Any, longs: dict[str, str]) -> Any:
    """value with each str value (not key) of LARGE or more characters replaced by a placeholder."""
    if type(value) is str:
        if len(value) < max(LARGE, 1):
            return value
        index = str(len(longs))
        longs[index] = value
        return f"omni-long-{_NONCE}-{index}"
    before = len(longs)
    if isinstance(value, dict):
        lifted: Any = {k: _lift_long_strings(v, longs) for k, v in value.items()}
    elif isinstance(value, list | tuple):
        lifted = [_lift_long_strings(v, longs) for v in value]  # json.dumps writes both as arrays
    else:
        return value
    return value if len(longs) == before else lifted  # nothing long: the value itself, not a copy


def _escaped_windows(default: Callable[..., str], text: str, *args: Any, **kwargs: Any) -> list[str]:
    return [
        default(text[at : at + _TOJSON_WINDOW], *args, **kwargs)[1:-1]
        for at in range(0, len(text), _TOJSON_WINDOW)
    ]


def _environment() -> SandboxedEnvironment:
    # transformers builds the same environment for every template; an empty one yields it.
    base: SandboxedEnvironment = _compile_jinja_template("").environment
    env = base.overlay()
    assert isinstance(env, SandboxedEnvironment)
    default_add = base.binop_table["+"]

    def add(left: Any, right: Any) -> Any:
        if type(left) is str and type(right) is str:
            return _join([left, right])
        return default_add(left, right)

    # concat is read when a template is compiled (`concat = environment.concat` in the
    # module, for macros and the output alike): this environment must compile the sources.
    env.concat = _concat  # type: ignore[method-assign]
    env.intercepted_binops = base.intercepted_binops | {"+"}
    env.binop_table = {**base.binop_table, "+": add}
    env.filters = {
        **base.filters,
        "join": _join_filter(base.filters["join"]),
        "tojson": _tojson_filter(base.filters["tojson"]),
    }
    return env


def _tool_schema(tool: Any) -> Any:
    if isinstance(tool, dict):
        return tool
    if inspect.isfunction(tool) or inspect.ismethod(tool):
        return get_json_schema(tool)
    raise ValueError(
        "Tools should either be a JSON schema, or a callable function with type hints "
        "and a docstring suitable for auto-conversion to a schema."
    )


def _rstripped_end(text: str, end: int) -> int:
    """len(text[:end].rstrip()), reading text back from end a window at a time."""
    window = 4096
    while end > 0:
        start = max(0, end - window)
        kept = text[start:end].rstrip()
        if kept:
            return start + len(kept)
        end = start
    return 0


class ChatTemplate:
    """A tokenizer's chat templates, rendered as its apply_chat_template(tokenize=False) does."""

    def __init__(self, hf_tokenizer: PreTrainedTokenizerBase) -> None:
        self.hf_tokenizer = hf_tokenizer
        self._env = _environment()
        self._compile = lru_cache(maxsize=_CACHED_TEMPLATES)(self._compile_source)

    def _compile_source(self, source: str) -> jinja2.Template:
        template = self._env.from_string(source)
        # `~` compiles to a call of the str_join the template's module imports from
        # jinja2.runtime by name, which joins with a plain "".join: rebind that name.
        namespace = getattr(template.root_render_func, "__globals__")
        namespace["str_join"] = _str_join
        return template

    def render(
        self,
        conversation: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Any] | None = None,
        documents: Sequence[Any] | None = None,
        chat_template: str | None = None,
        add_generation_prompt: bool = False,
        continue_final_message: bool | str = False,
        **kwargs: Any,
    ) -> str:
        """The template's text for one conversation; kwargs are template variables."""
        passed = sorted(_PASSED & kwargs.keys())
        if passed:
            raise TypeError(f"apply_chat_template() got multiple values for '{passed[0]}'")
        if kwargs.get("return_assistant_tokens_mask"):
            raise ValueError(_REFUSED["return_assistant_tokens_mask"])
        source = self.hf_tokenizer.get_chat_template(
            chat_template, None if tools is None else list(tools)
        )
        if not conversation:
            raise ValueError("Cannot apply chat template to an empty conversation.")
        chat = _normalize_chat_messages(list(conversation))
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt are not compatible.")
        if kwargs.get("sanitize_control_tokens"):
            raise ValueError(_REFUSED["sanitize_control_tokens"])
        variables = {k: v for k, v in kwargs.items() if k not in _REFUSED and k not in _UNUSED}
        # A variable of the same name as a special token replaces it.
        variables = {**self.hf_tokenizer.special_tokens_map, **variables}
        template = self._compile(source)

        tool_schemas = None if tools is None else [_tool_schema(t) for t in tools]
        if documents is not None and not all(isinstance(d, dict) for d in documents):
            raise TypeError("Documents should be a list of dicts with 'title' and 'text' keys!")
        # Plain JSON values only, as transformers gives the template; the conversation is a
        # fresh copy from here on, so tagging its final message leaves the caller's alone.
        chat = _plain_template_data(chat)
        for message in chat:
            if not isinstance(message, dict):
                raise TypeError(f"Chat messages should be dicts, but got {message!r}.")
        chat = _alias_reasoning_fields(chat)
        values = dict(
            messages=chat,
            tools=_plain_template_data(tool_schemas),
            documents=_plain_template_data(documents),
            add_generation_prompt=add_generation_prompt,
            **_plain_template_data(variables),
        )
        if not continue_final_message:
            return template.render(**values)
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        return self._render_continued(template, source, chat, field, values)

    def _render_continued(
        self,
        template: jinja2.Template,
        source: str,
        chat: list[dict[str, Any]],
        field: str,
        values: dict[str, Any],
    ) -> str:
        """The text up to the end of the final message's field, which the reply continues."""
        last = chat[-1]
        final = last.get(field)
        if final is None:
            raise ValueError(
                f'continue_final_message is set but the final message has no "{field}" to continue'
            )
        fields = [field]
        if field in _REASONING_FIELDS:
            # Reasoning is passed under several names: each copy is tagged, for the template
            # may read any of them.
            fields = [f for f in _REASONING_FIELDS if last.get(f) == final]
        if not any(f in source for f in fields):
            raise ValueError(f'continue_final_message: the chat template never reads "{field}"')
        joins = _TaggedJoins()
        if isinstance(final, list | tuple):
            # The last text part is the one continued.
            for part in reversed(final):
                if "text" in part:
                    final = part["text"]
                    part["text"] = joins.tag(part["text"])
                    break
            else:
                raise ValueError("continue_final_message is set but the final message has no text")
        else:
            for f in fields:
                last[f] = joins.tag(last[f])

        token = _tagged_joins.set(joins)
        try:
            return joins.cut(template.render(**values), final)
        finally:
            _tagged_joins.reset(token)
            joins.release()
