import copy
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from omni.shared.gil_free import LARGE, join_str
from omni.text import chat_template
from omni.text.chat_template import ChatTemplate, _join, _rstripped_end, _tagged_joins, _TaggedJoins
from omni.text.tokenizer import TextTokenizer

# Hand-written templates in the styles of real ones.
TEMPLATES = {
    # ChatML joined with `+`, tools as JSON lines, tool calls and responses (Qwen 2.5).
    "chatml_plus": r"""
{%- if tools %}
    {{- '<|im_start|>system\n' + (messages[0]['content'] if messages[0]['role'] == 'system' else 'You are helpful.') }}
    {{- '\n\n# Tools\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + tool | tojson }}
    {%- endfor %}
    {{- '\n</tools><|im_end|>\n' }}
{%- elif messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if message.role == 'user' or (message.role == 'assistant' and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == 'assistant' %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- set call = call.function if call.function is defined else call %}
            {{- '\n<tool_call>\n{"name": "' + call.name + '", "arguments": ' + call.arguments | tojson + '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + message.content + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
""",
    # `~` and a macro for string or multi-part content, trimmed (Gemma).
    "tilde_macro": r"""
{%- macro render(content) -%}
{%- if content is string -%}{{ content }}
{%- else -%}{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{{- bos_token -}}
{%- for message in messages -%}
{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}
{{ '<start_of_turn>' ~ role ~ '\n' ~ render(message['content']) | trim ~ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}
""",
    # Tools, documents and content as JSON.
    "tojson": r"""
{%- if tools -%}<tools>{{ tools | tojson(indent=2) }}</tools>
{% endif -%}
{%- for doc in documents or [] -%}<doc title={{ doc.title | tojson }}>{{ doc.text }}</doc>
{% endfor -%}
{%- for message in messages -%}
<{{ message.role }}>{{ (message.content if message.content is defined else none) | tojson }}
{%- if message.tool_calls %}{{ message.tool_calls | tojson(sort_keys=true) }}{% endif -%}
</{{ message.role }}>
{% endfor -%}
{%- if add_generation_prompt %}<assistant>{% endif -%}
""",
    # reasoning_content, or the reasoning split off the content at </think> (Qwen3).
    "reasoning": r"""
{%- for message in messages %}
{%- if message.role == 'assistant' %}
{%- set content = message.content if message.content is string else '' %}
{%- set reasoning_content = '' %}
{%- if message.reasoning_content is string %}
{%- set reasoning_content = message.reasoning_content %}
{%- elif '</think>' in content %}
{%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
{%- set content = content.split('</think>')[-1].lstrip('\n') %}
{%- endif %}
{%- if loop.last or reasoning_content %}
{{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + content }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|im_start|>assistant\n' }}
{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}{%- endif %}
{%- endif %}
""",
    # The assistant's turns marked for transformers' assistant mask.
    "generation": r"""
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
<|assistant|>{% generation %}{{ message.content }}<|end|>{% endgeneration %}
{% else -%}
<|{{ message.role }}|>{{ message.content }}<|end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|assistant|>{% endif -%}
""",
    # bos_token, template variables with defaults, trimmed content (Llama 3).
    "bos": r"""
{{- bos_token }}
{%- set date_string = date_string if date_string is defined else '26 Jul 2024' %}
{{- '<|start_header_id|>system<|end_header_id|>\n\nToday Date: ' + date_string + '<|eot_id|>' }}
{%- for message in messages %}
{{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{%- endif %}
{{- eos_token if end_with_eos is defined else '' }}
""",
    # Text parts joined by the join filter, in a {% set %} block.
    "join_filter": r"""
{%- for message in messages -%}
{%- if message.content is string -%}{%- set text = message.content -%}
{%- else -%}{%- set text = message.content | selectattr('type', 'equalto', 'text') | map(attribute='text') | join('\n') -%}
{%- endif -%}
{%- set turn %}<|{{ message.role }}|>{{ text }}<|end|>{% endset -%}
{{ turn }}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}
""",
    # The template's own refusal.
    "raises": r"""
{%- for message in messages -%}
{%- if message.role not in ('user', 'assistant') -%}{{ raise_exception('Only user and assistant roles are supported!') }}{%- endif -%}
{{ message.role }}: {{ message.content }}
{% endfor -%}
""",
}

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city, \"now\" <b>",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        },
    }
]
CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there 안녕 😀"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "Tell me  \n"},
]
TOOL_CHAT = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": '{"temp": 21}'},
    {"role": "tool", "tool_call_id": "c2", "content": "sunny"},
    {"role": "user", "content": "Thanks"},
]
REASONING_CHAT = [
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4", "reasoning_content": "Add them."},
    {"role": "user", "content": "3+3?"},
    {"role": "assistant", "content": "6", "reasoning": "Add again."},
    {"role": "user", "content": "4+4?"},
    {"role": "assistant", "content": "<think>\nDouble it.\n</think>\n\n8", "thinking": None},
    {"role": "user", "content": "and 5+5?"},
]
PARTS_CHAT = [
    {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image"}, {"type": "text", "text": "ok?"}]},
    {"role": "assistant", "content": [{"type": "text", "text": "Yes."}]},
]


def _continued(final: Any, **extra: Any) -> list[dict[str, Any]]:
    return [{"role": "user", "content": "Write a poem."}, {"role": "assistant", "content": final, **extra}]


# name -> (messages, render options)
CASES: dict[str, tuple[list[dict[str, Any]], dict[str, Any]]] = {
    "chat": (CHAT, {"add_generation_prompt": True}),
    "chat_no_prompt": (CHAT, {}),
    "tools": (TOOL_CHAT, {"tools": TOOLS, "add_generation_prompt": True}),
    "documents": (CHAT[1:2], {"documents": [{"title": "A \"doc\"", "text": "Its text."}], "add_generation_prompt": True}),
    "reasoning": (REASONING_CHAT, {"add_generation_prompt": True}),
    "parts": (PARTS_CHAT, {"add_generation_prompt": True}),
    "template_kwargs": (
        CHAT,
        {"add_generation_prompt": True, "enable_thinking": False, "date_string": "1 Jan 2025", "end_with_eos": True},
    ),
    "kwarg_over_special_token": (CHAT[1:2], {"bos_token": "<BOS>", "eos_token": "<EOS>", "end_with_eos": True}),
    "continue": (_continued("Roses are"), {"continue_final_message": True}),
    "continue_trailing_space": (_continued("Roses are "), {"continue_final_message": True}),
    "continue_trailing_newlines": (_continued("Roses are\n\n"), {"continue_final_message": True}),
    "continue_parts": (
        _continued([{"type": "text", "text": "Roses "}, {"type": "image"}, {"type": "text", "text": "are red"}]),
        {"continue_final_message": True},
    ),
    "continue_reasoning": (
        _continued("", reasoning_content="Something about"),
        {"continue_final_message": "reasoning_content"},
    ),
    "continue_without_content": (TOOL_CHAT[:2], {"continue_final_message": True, "tools": TOOLS}),
    "continue_and_prompt": (_continued("Roses"), {"continue_final_message": True, "add_generation_prompt": True}),
    "empty": ([], {"add_generation_prompt": True}),
}


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def hf(tok: TextTokenizer) -> PreTrainedTokenizerBase:
    return tok.hf_tokenizer


@pytest.fixture(scope="module")
def ours(hf: PreTrainedTokenizerBase) -> ChatTemplate:
    return ChatTemplate(hf)


def _outcome(render: Callable[[], str]) -> str | type[BaseException]:
    try:
        return render()
    except Exception as e:
        return type(e)


def _compare(
    hf: PreTrainedTokenizerBase, ours: ChatTemplate, source: str, messages: list[dict[str, Any]], options: dict[str, Any]
) -> str | type[BaseException]:
    given = copy.deepcopy(messages)
    want = _outcome(lambda: hf.apply_chat_template(
        copy.deepcopy(messages), chat_template=source, tokenize=False, **options
    ))
    got = _outcome(lambda: ours.render(given, chat_template=source, **options))
    assert got == want
    assert given == messages  # the caller's messages are never tagged
    return got


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(TEMPLATES) + ["tiny"])
def test_renders_as_transformers(
    hf: PreTrainedTokenizerBase, ours: ChatTemplate, name: str, case: str
) -> None:
    source = hf.chat_template if name == "tiny" else TEMPLATES[name]
    messages, options = CASES[case]
    _compare(hf, ours, source, messages, options)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("name", sorted(TEMPLATES) + ["tiny"])
def test_renders_as_transformers_with_every_join_large(
    hf: PreTrainedTokenizerBase, ours: ChatTemplate, name: str, case: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every join takes the join_str path (its copy of small strings is a plain join), and
    # tojson escapes every string three characters at a time.
    monkeypatch.setattr(chat_template, "LARGE", 0)
    monkeypatch.setattr(chat_template, "_TOJSON_WINDOW", 3)
    source = hf.chat_template if name == "tiny" else TEMPLATES[name]
    messages, options = CASES[case]
    _compare(hf, ours, source, messages, options)


def test_the_corpus_mostly_renders(hf: PreTrainedTokenizerBase, ours: ChatTemplate) -> None:
    # Errors compare equal too; most pairs must render, so the comparison is of text.
    outcomes = [
        _compare(hf, ours, hf.chat_template if name == "tiny" else TEMPLATES[name], *CASES[case])
        for name in [*TEMPLATES, "tiny"]
        for case in CASES
    ]
    rendered = [o for o in outcomes if isinstance(o, str)]
    assert len(rendered) >= 0.6 * len(outcomes)
    for case in ("continue", "continue_trailing_space", "continue_trailing_newlines", "continue_parts"):
        assert isinstance(_compare(hf, ours, TEMPLATES["join_filter"], *CASES[case]), str)
    text = _compare(hf, ours, TEMPLATES["reasoning"], *CASES["continue_reasoning"])
    assert isinstance(text, str) and text.endswith("<think>\nSomething about")


@pytest.mark.parametrize(
    "source, expected",
    [
        ("{{ 'a' + messages[0].content }}", ["a", "X"]),
        ("{{ 'a' ~ messages[0].content ~ 1 }}", ["a", "X", "1"]),
        ("{% macro m(c) %}[{{ c }}]{% endmacro %}{{ m(messages[0].content) }}", ["[", "X", "]"]),
        ("{% set s %}<{{ messages[0].content }}>{% endset %}{{ s }}", ["<", "X", ">"]),
        ("{{ messages | map(attribute='content') | join(', ') }}", ["X", ", ", "Y"]),
        ("{% generation %}({{ messages[1].content }}){% endgeneration %}", ["(", "Y", ")"]),
        ("{{ messages[0].content }}/{{ messages[1].content }}", ["X", "/", "Y"]),
    ],
)
def test_each_join_goes_through_join_str(
    ours: ChatTemplate, monkeypatch: pytest.MonkeyPatch, source: str, expected: list[str]
) -> None:
    calls: list[list[str]] = []

    def recording_join_str(pieces: list[str]) -> str:
        calls.append(list(pieces))
        return join_str(pieces)

    monkeypatch.setattr(chat_template, "LARGE", 0)
    monkeypatch.setattr(chat_template, "join_str", recording_join_str)
    messages = [{"role": "user", "content": "X"}, {"role": "assistant", "content": "Y"}]
    ours.render(messages, chat_template=source)
    assert expected in calls


def test_other_additions_keep_their_meaning(hf: PreTrainedTokenizerBase, ours: ChatTemplate) -> None:
    source = "{{ 1 + 2 }} {{ [1] + [2] }} {{ 1.5 + messages | length }} {{ 'a' ~ 'b' }} {{ 'a' + 'b' }}"
    assert _compare(hf, ours, source, CHAT, {}) == "3 [1, 2] 5.5 ab ab"
    assert _compare(hf, ours, "{{ 'a' + 1 }}", CHAT, {}) is TypeError


def test_tagged_joins_cut_at_every_index() -> None:
    joins = _TaggedJoins()
    message = "poem "
    tagged = joins.tag(message)
    token = _tagged_joins.set(joins)
    try:
        inner = _join(["<a>", tagged, "</a>"])
        text = _join(["x", inner, "", "y", _join(["[", tagged, "]"])])
        untouched = _join(["no", "tag"])
    finally:
        _tagged_joins.reset(token)
    assert text == "x<a>poem CONTINUE_FINAL_MESSAGE_TAG </a>y[poem CONTINUE_FINAL_MESSAGE_TAG ]"
    assert joins.contains(text, message) and not joins.contains(untouched, message)
    for end in range(len(text) + 1):
        assert joins.prefix(text, end) == text[:end]
    assert joins.prefix(untouched, 3) == "not"


@pytest.mark.parametrize("name", ["chatml_plus", "reasoning", "generation", "join_filter", "tiny"])
def test_the_continued_message_is_found_among_the_pieces(
    hf: PreTrainedTokenizerBase, ours: ChatTemplate, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # Through `+`, macros, {% set %} blocks, {% generation %}, the join filter and the output,
    # no substring search and no slice of the whole text.
    found: list[bool] = []
    contains = _TaggedJoins.contains

    def recording_contains(self: _TaggedJoins, text: str, part: str) -> bool:
        found.append(contains(self, text, part))
        return found[-1]

    monkeypatch.setattr(_TaggedJoins, "contains", recording_contains)
    source = hf.chat_template if name == "tiny" else TEMPLATES[name]
    # (The other templates print a multi-part content as a list, or do not take one.)
    parts = name in ("join_filter", "tiny")
    for case in ("continue", "continue_trailing_space") + ("continue_parts",) * parts:
        assert isinstance(_compare(hf, ours, source, *CASES[case]), str)
    assert found and all(found)


def test_rstripped_end_reads_back_past_a_window() -> None:
    text = "a" + " \n\t" * 5000 + "b"
    assert _rstripped_end(text, len(text) - 1) == 1
    assert _rstripped_end(text, len(text)) == len(text)
    assert _rstripped_end("   ", 3) == 0


def test_call_options_are_not_template_variables(hf: PreTrainedTokenizerBase, ours: ChatTemplate) -> None:
    # apply_chat_template's own parameters are its options, never template variables; a
    # parameter transformers adds later fails this until render knows it.
    own = set(inspect.signature(PreTrainedTokenizerBase.apply_chat_template).parameters)
    taken = set(inspect.signature(ChatTemplate.render).parameters)
    names = sorted(own - taken - {"self"})
    assert "sanitize_control_tokens" in names and "padding" in names
    for name in names:
        source = "{{ messages[0].content }} {{ " + name + " is defined }}"
        _compare(hf, ours, source, CHAT, {name: True})
        _compare(hf, ours, source, CHAT, {name: None})


def test_templates_compile_once(ours: ChatTemplate) -> None:
    source = "{{ messages[0].content }}!"
    assert ours.render(CHAT, chat_template=source) == "Be brief.!"
    assert ours._compile(source) is ours._compile(source)


def test_render_chat_errors_are_value_errors(tok: TextTokenizer) -> None:
    with pytest.raises(ValueError, match="Only user and assistant roles are supported!"):
        tok.render_chat(CHAT, chat_template=TEMPLATES["raises"])
    with pytest.raises(ValueError, match="no \"content\" to continue"):
        tok.render_chat(_continued(None), add_generation_prompt=False, continue_final_message=True)
    with pytest.raises(ValueError, match="empty conversation"):
        tok.render_chat([])
    with pytest.raises(ValueError, match="could not apply the chat template"):
        tok.render_chat(CHAT, chat_template="{{ messages[0].content + 1 }}")
    assert tok.render_chat(CHAT[1:2], chat_template=TEMPLATES["raises"]) == "user: Hi there 안녕 😀\n"


def test_a_large_continued_message_renders_as_transformers(
    hf: PreTrainedTokenizerBase, ours: ChatTemplate, monkeypatch: pytest.MonkeyPatch
) -> None:
    large: list[int] = []
    found: list[bool] = []
    contains = _TaggedJoins.contains

    def counting_join_str(pieces: list[str]) -> str:
        large.append(sum(map(len, pieces)))
        return join_str(pieces)

    def recording_contains(self: _TaggedJoins, text: str, part: str) -> bool:
        found.append(contains(self, text, part))
        return found[-1]

    monkeypatch.setattr(chat_template, "join_str", counting_join_str)
    monkeypatch.setattr(_TaggedJoins, "contains", recording_contains)
    # 20 MB of two-byte characters: join_str widens the one-byte template text around it.
    content = "안녕 roses are red, " * (20_000_000 // 16)
    messages = _continued(content)
    source = TEMPLATES["chatml_plus"]
    text = ours.render(messages, chat_template=source, continue_final_message=True)
    assert text == hf.apply_chat_template(messages, chat_template=source, tokenize=False, continue_final_message=True)
    assert text.endswith("<|im_start|>assistant\n" + content)
    # The tag, three `+` joins, the output and the cut; the message found among the pieces
    # rather than searched for.
    assert len([n for n in large if n >= LARGE]) >= 5
    assert found == [True]


@pytest.mark.parametrize("options", [{}, {"ensure_ascii": True}, {"indent": 2, "sort_keys": True}, {"separators": (",", ":")}])
def test_tojson_escapes_long_strings_a_window_at_a_time_as_json_dumps_does(
    ours: ChatTemplate, monkeypatch: pytest.MonkeyPatch, options: dict[str, Any]
) -> None:
    monkeypatch.setattr(chat_template, "LARGE", 8)
    monkeypatch.setattr(chat_template, "_TOJSON_WINDOW", 5)
    tricky = 'say "hi"\\ then\n\ttab \x01\x1f 😀 안녕 \u2028 end'
    value = {"b": [tricky, "short", {"deep": tricky * 3}], "a": (tricky, 1, None, 2.5), "k" * 9: True}
    default = chat_template._compile_jinja_template("").environment.filters["tojson"]
    assert ours._env.filters["tojson"](value, **options) == default(value, **options)
