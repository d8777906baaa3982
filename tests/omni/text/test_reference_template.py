"""omni/text/templates/hyperclovax_omni.jinja renders the reference deployment's prompts.

The expected prompts below were written by reading the reference's template,
NAVER-Cloud-HyperCLOVA-X/OmniServe omni_chainer/tests/chat_template/track_b/chat_template.jinja
at commit ae0d33fe61773e099b5c221afed4bc23949181ed ("Initial release of OmniServe"), branch by
branch (it cannot be fetched at test time). Each case names the branches it covers; the strings
are compared byte for byte (worst difference allowed: none).

Where the two differ on purpose (the server's media parts, with durations; a video_url part; an
assistant turn whose content is none, which the reference cannot render) the test says so.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from gpu_workers.tiny.tokenizer import build_tiny_tokenizer
from omni.text.chat_format import ChatFormat
from omni.text.tokenizer import REFERENCE_TEMPLATE, TextTokenizer, reference_chat_template


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    build_tiny_tokenizer(out)
    (out / "chat_template.jinja").unlink()  # as the published download: no template shipped
    return out


@pytest.fixture(scope="module")
def tokenizer(tok_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tok_dir)


TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "날씨", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "t2i_model_generation", "parameters": {
        "type": "object", "properties": {"discrete_image_token": {"type": "string"}}}}},
]  # fmt: skip

# The tools block: the schemas back to back (tojson, no separator), then the call format.
TOOLS_BLOCK = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n"
    '{"type": "function", "function": {"name": "get_weather", "description": "날씨", "parameters": '
    '{"type": "object", "properties": {"city": {"type": "string"}}}}}'
    '{"type": "function", "function": {"name": "t2i_model_generation", "parameters": '
    '{"type": "object", "properties": {"discrete_image_token": {"type": "string"}}}}}'
    "\n</tools>\n\nFor each function call, output the function name and arguments within the "
    "following XML format:\n<tool_call>{function-name}\n<arg_key>{arg-key-1}</arg_key>\n"
    "<arg_value>{arg-value-1}</arg_value>\n<arg_key>{arg-key-2}</arg_key>\n<arg_value>{arg-value-2}</arg_value>\n"
    "...\n</tool_call><|im_end|>\n"
)
GEN = "<|im_start|>assistant\n<think>\n"


def image(n: int) -> str:
    return (
        f'<|mime_start|>{{"id": "image_{n:02d}", "type": "image/jpeg", "filename": "image.jpg"}}<|mime_end|>\n'
        "<|discrete_image_start|><|DISCRETE_IMAGE_PAD|><|discrete_image_end|>\n<|image_start|><|IMAGE_PAD|><|image_end|>"
    )


def video(n: int, duration: str = "<|video_meta_duration|>") -> str:
    return (
        f'<|mime_start|>{{"id": "video_{n:02d}", "type": "video/mp4", "filename": "video.mp4"}}<|mime_end|>\n'
        "<|video_aux_start|>다음 중 video_duration은 비디오 길이 정보입니다. 참고하여 답변하세요. "
        f'{{"video_duration": "{duration}"}}<|video_aux_end|>\n<|video_start|><|VIDEO_PAD|><|video_end|>'
    )


def audio(n: int, duration: str = "<|audio_meta_duration|>") -> str:
    return (
        f'<|mime_start|>{{"id": "audio_{n:02d}", "type": "audio/mpeg", "filename": "user_query.wav"}}<|mime_end|>\n'
        "<|audio_aux_start|>다음 중 audio_duration은 오디오 길이 정보입니다. 참고하여 답변하세요. "
        f'{{"audio_duration": "{duration}"}}<|audio_aux_end|>\n'
        "<|discrete_audio_start|><|DISCRETE_AUDIO_PAD|><|discrete_audio_end|>\n<|audio_start|><|AUDIO_PAD|><|audio_end|>"
    )


CASES = {
    # no tools, no system message; the generation prompt opens the reasoning
    "text": (
        dict(messages=[{"role": "user", "content": "Hello"}], add_generation_prompt=True),
        "<|im_start|>user\nHello<|im_end|>\n" + GEN,
    ),
    # no tools: the first system message as its own turn
    "system": (
        dict(messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
             add_generation_prompt=True),
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n" + GEN,
    ),
    # tools: the system message's text parts joined, a blank line, the tools block
    "system_parts_and_tools": (
        dict(messages=[{"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
                       {"role": "user", "content": "Hi"}], tools=TOOLS, add_generation_prompt=True),
        "<|im_start|>system\nAB\n\n" + TOOLS_BLOCK + "<|im_start|>user\nHi<|im_end|>\n" + GEN,
    ),
    # tools without a system message; skip_reasoning closes the empty reasoning block
    "tools_skip_reasoning": (
        dict(messages=[{"role": "user", "content": "Hi"}], tools=TOOLS, add_generation_prompt=True, skip_reasoning=True),
        "<|im_start|>system\n" + TOOLS_BLOCK + "<|im_start|>user\nHi<|im_end|>\n" + GEN + "\n</think>\n\n",
    ),
    # parts joined by newlines; a video told by its URL's extension (any case), a data: URL is an
    # image; ids counted per kind over the whole conversation
    "media": (
        dict(messages=[
            {"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": "https://x/cat.png"}},
                {"type": "text", "text": "and"},
                {"type": "image_url", "image_url": {"url": "https://x/clip.MP4"}},
                {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                {"type": "text", "text": "What?"}]},
            {"role": "assistant", "content": "A cat."},
            {"role": "user", "content": [
                {"type": "input_audio", "input_audio": {"data": "BBBB", "format": "mp3"}},
                {"type": "image_url", "image_url": {"url": "https://x/m.webm"}}]},
        ], add_generation_prompt=True),
        "<|im_start|>user\n" + "\n".join([image(0), "and", video(0), audio(0), image(1), "What?"]) + "<|im_end|>\n"
        "<|im_start|>assistant\nA cat.<|im_end|>\n"
        "<|im_start|>user\n" + audio(1) + "\n" + video(1) + "<|im_end|>\n" + GEN,
    ),
    # reasoning: dropped before the last user message; after it, from reasoning_content or split
    # at </think>, and an empty block on the last message
    "reasoning": (
        dict(messages=[
            {"role": "user", "content": "Q1"},
            {"role": "assistant", "content": "<think>\nold\n</think>\n\nA1"},
            {"role": "user", "content": "Q2"},
            {"role": "assistant", "content": "<think>\nhmm\n</think>\n\nA2"},
            {"role": "assistant", "content": "more", "reasoning_content": "\nr2\n"},
            {"role": "assistant", "content": "last"},
        ]),
        "<|im_start|>user\nQ1<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n"
        "<|im_start|>user\nQ2<|im_end|>\n<|im_start|>assistant\n<think>\nhmm\n</think>\n\nA2<|im_end|>\n"
        "<|im_start|>assistant\n<think>\nr2\n</think>\n\nmore<|im_end|>\n"
        "<|im_start|>assistant\n<think>\n\n</think>\n\nlast<|im_end|>\n",
    ),
    # calls (a string value as it is, others as JSON; a call given without its function
    # wrapper), consecutive tool results in one turn (a missing name is empty), a later system
    # message as a turn of its own
    "tool_calls": (
        dict(messages=[
            {"role": "system", "content": "S"},
            {"role": "user", "content": "weather?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"type": "function", "function": {"name": "get_weather",
                                                  "arguments": {"city": "Seoul", "days": 3, "opts": {"u": "c"}}}},
                {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Busan"}}}]},
            {"role": "tool", "name": "get_weather", "content": "sunny"},
            {"role": "tool", "content": "rain"},
            {"role": "assistant", "content": "Sunny and rain.", "tool_calls": [{"name": "x", "arguments": {}}]},
            {"role": "system", "content": [{"type": "text", "text": "late system"}]},
            {"role": "user", "content": "thanks"},
        ], tools=TOOLS, add_generation_prompt=True, skip_reasoning=False),
        "<|im_start|>system\nS\n\n" + TOOLS_BLOCK + "<|im_start|>user\nweather?<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Seoul</arg_value>\n"
        '<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n<arg_key>opts</arg_key>\n<arg_value>{"u": "c"}</arg_value>\n'
        "</tool_call>\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Busan</arg_value>\n</tool_call><|im_end|>\n"
        "<|im_start|>tool\n<tool_response>get_weather\nsunny\n</tool_response>\n<tool_response>\nrain\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nSunny and rain.\n<tool_call>x\n</tool_call><|im_end|>\n"
        "<|im_start|>system\nlate system<|im_end|>\n<|im_start|>user\nthanks<|im_end|>\n" + GEN,
    ),
}


def render(tokenizer: TextTokenizer, case: dict) -> str:
    case = dict(case)
    return tokenizer.render_chat(case.pop("messages"), **case)


@pytest.mark.parametrize("name", sorted(CASES))
def test_renders_the_reference_prompt(tokenizer: TextTokenizer, name: str) -> None:
    case, expected = CASES[name]
    case = {"add_generation_prompt": False, **case}
    assert render(tokenizer, case) == expected


def test_a_checkpoint_without_a_template_gets_it(tokenizer: TextTokenizer) -> None:
    assert tokenizer.hf_tokenizer.chat_template == reference_chat_template() == REFERENCE_TEMPLATE.read_text()
    fmt = ChatFormat.resolve(tokenizer)
    assert (fmt.tool_parser, fmt.reasoning_parser) == ("hyperclovax", "think")


def test_its_own_template_and_chat_template_win(tok_dir: Path, tmp_path: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_bytes((tok_dir / name).read_bytes())
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0].content }}")
    tok = TextTokenizer.from_dir(tmp_path)
    assert tok.render_chat([{"role": "user", "content": "x"}]) == "x"
    # --chat-template (ChatFormat.chat_template, passed as chat_template) overrides either
    assert tok.render_chat([{"role": "user", "content": "x"}], chat_template="<{{ messages[0].content }}>") == "<x>"


def test_no_template_without_the_reference_vocabulary(tmp_path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    t = Tokenizer(models.BPE())
    t.pre_tokenizer = pre_tokenizers.ByteLevel()
    t.add_special_tokens(["<|im_start|>", "<|im_end|>"])  # ChatML, but no media header
    t.save(str(tmp_path / "tokenizer.json"))
    assert not TextTokenizer.from_dir(tmp_path).hf_tokenizer.chat_template


def test_the_servers_media_parts_render_as_openais(tokenizer: TextTokenizer) -> None:
    """The media pipeline's parts ({"type": kind}) render as the OpenAI parts they came from;
    with a duration (omni-serve's addition) it stands where the placeholder does."""
    openai = CASES["media"][0]["messages"][0]
    server = {"role": "user", "content": [
        {"type": "image", "id": "image_0"}, {"type": "text", "text": "and"}, {"type": "video", "id": "video_0"},
        {"type": "audio", "id": "audio_0"}, {"type": "image", "id": "image_1"}, {"type": "text", "text": "What?"}]}  # fmt: skip
    assert tokenizer.render_chat([server]) == tokenizer.render_chat([openai])
    server["content"][2]["duration"] = 12.5
    server["content"][3]["duration"] = 3.0
    text = tokenizer.render_chat([server], add_generation_prompt=False)
    assert video(0, "12.5") in text and audio(0, "3.0") in text
    assert "_meta_duration" not in text


def test_video_url_is_a_video(tokenizer: TextTokenizer) -> None:
    """(The reference's template has no branch for video_url and renders nothing for it.)"""
    part = {"type": "video_url", "video_url": {"url": "https://x/v"}}
    text = tokenizer.render_chat([{"role": "user", "content": [part]}], add_generation_prompt=False)
    assert text == "<|im_start|>user\n" + video(0) + "<|im_end|>\n"


def test_assistant_content_none_reads_as_empty(tokenizer: TextTokenizer) -> None:
    """(The reference's template raises on it: `'</think>' in none`.)"""
    call = {"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    msgs = [{"role": "user", "content": "q"}, {"role": "assistant", "content": None, "tool_calls": [call]}]
    empty = [msgs[0], {**msgs[1], "content": ""}]
    assert tokenizer.render_chat(msgs, add_generation_prompt=False) == tokenizer.render_chat(empty, add_generation_prompt=False)


def test_placeholders_are_special_tokens(tokenizer: TextTokenizer) -> None:
    """Each placeholder the template writes is one special token, once per item."""
    ids = tokenizer.encode_prompt(render(tokenizer, CASES["media"][0]))
    for token, count in [("<|IMAGE_PAD|>", 2), ("<|DISCRETE_IMAGE_PAD|>", 2), ("<|VIDEO_PAD|>", 2),
                         ("<|AUDIO_PAD|>", 2), ("<|DISCRETE_AUDIO_PAD|>", 2)]:  # fmt: skip
        token_id = tokenizer.token_to_id(token)
        assert token_id is not None and ids.count(token_id) == count, token
