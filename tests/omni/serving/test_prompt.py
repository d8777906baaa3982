"""Prompt building for a text-only model: the chat template's ids, media refused by part, and
completion prompts encoded or checked against the vocabulary. (Media expansion for an omni
model is tests/omni/modalities/inputs/test_pipeline.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from omni.engines.pool import ModelPool
from omni.errors import APIError
from omni.serving.model import ServedModel
from omni.serving.prompt import chat_prompt, completion_prompts, load_media
from omni.serving.requests import parse_chat_completion_request, parse_completion_request
from omni.text.chat_format import ChatFormat
from omni.text.tokenizer import TextTokenizer, reference_chat_template
from tests.omni.fake_pool import FakePool

PNG_URL = "data:image/png;base64,iVBORw0KGgo="


@pytest.fixture(scope="module")
def model(tiny_tokenizer_dir: Path) -> ServedModel:
    tokenizer = TextTokenizer.from_dir(tiny_tokenizer_dir)
    return ServedModel("m", tokenizer, cast(ModelPool, FakePool([1])), created=0)


def chat(*messages: dict[str, Any]) -> Any:
    return parse_chat_completion_request({"model": "m", "messages": list(messages)})


async def test_text_chat_is_the_template_and_no_media(model: ServedModel) -> None:
    req = chat({"role": "user", "content": [{"type": "text", "text": "Hi"}]})
    assert await load_media(model, req) == []
    prompt = await chat_prompt(model, req, [])
    assert prompt.token_ids == model.tokenizer.apply_chat_template(req.messages)
    assert prompt.token_ids == model.tokenizer.encode(
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    assert prompt.media == ()


async def test_a_text_only_model_refuses_the_first_media_part_by_name(model: ServedModel) -> None:
    image = {"type": "image_url", "image_url": {"url": PNG_URL}}
    look = {"role": "user", "content": [{"type": "text", "text": "Look"}, image]}
    req = chat({"role": "user", "content": "Hello"}, look)
    with pytest.raises(APIError) as e:
        await load_media(model, req)
    error = e.value
    assert (error.status, error.param) == (400, "messages[1].content[1]")
    assert error.code == "unsupported_content_type"
    assert error.message == "This model does not accept image_url input."


async def test_completion_prompts_encode_text_and_keep_token_ids(model: ServedModel) -> None:
    req = parse_completion_request({"model": "m", "prompt": ["Hello", "world"]})
    assert await completion_prompts(model, req) == [
        model.tokenizer.encode("Hello"),
        model.tokenizer.encode("world"),
    ]
    req = parse_completion_request({"model": "m", "prompt": [[3, 4], [5]]})
    assert await completion_prompts(model, req) == [[3, 4], [5]]


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([[3], [1 << 20]], "prompt 1 has token ids outside [0, {vocab})"),
        (["Hello", ""], "prompt 1 is empty"),
    ],
)
async def test_bad_completion_prompts_are_400s_naming_the_prompt(
    model: ServedModel, prompt: list[Any], message: str
) -> None:
    req = parse_completion_request({"model": "m", "prompt": prompt})
    with pytest.raises(APIError) as e:
        await completion_prompts(model, req)
    vocab = model.tokenizer.vocab_size
    assert (e.value.status, e.value.param, e.value.message) == (400, "prompt", message.format(vocab=vocab))


def body(**fields: Any) -> Any:
    return parse_chat_completion_request({"model": "m", "messages": [{"role": "user", "content": "Hi"}], **fields})


async def test_a_request_template_needs_the_server_to_trust_it(model: ServedModel, tiny_tokenizer_dir: Path) -> None:
    req = body(chat_template="{{ messages[0]['content'] }}!")
    with pytest.raises(APIError) as e:
        await chat_prompt(model, req, [])
    assert (e.value.status, e.value.param, e.value.code) == (400, "chat_template", "unsupported_parameter")
    trusting = ServedModel(
        "m",
        model.tokenizer,
        model.pool,
        created=0,
        chat_format=ChatFormat(trust_request_chat_template=True),
    )
    prompt = await chat_prompt(trusting, req, [])
    assert prompt.token_ids == model.tokenizer.encode("Hi!", add_special_tokens=False)
    broken = body(chat_template="{{ raise_exception('no') }}")
    with pytest.raises(APIError) as e:
        await chat_prompt(trusting, broken, [])
    assert (e.value.status, e.value.param) == (400, "chat_template")


async def test_the_server_template_replaces_the_checkpoint_one(model: ServedModel) -> None:
    served = ServedModel("m", model.tokenizer, model.pool, created=0, chat_format=ChatFormat(chat_template="<{{ messages[0]['content'] }}>"))
    assert (await chat_prompt(served, body(), [])).token_ids == model.tokenizer.encode("<Hi>", add_special_tokens=False)


async def test_continue_final_message_leaves_the_turn_open(model: ServedModel) -> None:
    req = parse_chat_completion_request(
        {
            "model": "m",
            "messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello, wor"}],
            "continue_final_message": True,
        }
    )
    prompt = await chat_prompt(model, req, [])
    text = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, wor"
    assert prompt.token_ids == model.tokenizer.encode(text, add_special_tokens=False)
    no_prompt = parse_chat_completion_request(
        {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "add_generation_prompt": False}
    )
    ids = (await chat_prompt(model, no_prompt, [])).token_ids
    assert ids == model.tokenizer.encode("<|im_start|>user\nHi<|im_end|>\n", add_special_tokens=False)


async def test_prompt_token_ids_are_bounded_by_the_models_vocabulary(tiny_tokenizer_dir: Path) -> None:
    """A tokenizer of 1458 ids before a model of 1000 rows: id 1200 is a token, but the
    embedding has no row for it (review A3); a 400 naming the prompt, not a worker error."""
    tok = TextTokenizer.from_dir(tiny_tokenizer_dir)
    smaller = ServedModel("m", TextTokenizer(tok.hf_tokenizer, tok.eos_token_ids, 1000), cast(ModelPool, FakePool([1])), created=0)
    assert await completion_prompts(smaller, parse_completion_request({"model": "m", "prompt": [[3, 999]]})) == [[3, 999]]
    with pytest.raises(APIError) as e:
        await completion_prompts(smaller, parse_completion_request({"model": "m", "prompt": [[3], [1200]]}))
    assert (e.value.status, e.value.param, e.value.message) == (400, "prompt", "prompt 1 has token ids outside [0, 1000)")


# The messages around the one under test, so that each role stands where a template expects it.
_AROUND = {
    "system": ([], [{"role": "user", "content": "Hi"}]),
    "developer": ([], [{"role": "user", "content": "Hi"}]),
    "user": ([], []),
    "assistant": ([{"role": "user", "content": "Hi"}], []),
    "tool": (
        [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "tool_calls": [{"id": "c", "function": {"name": "f", "arguments": "{}"}}]},
        ],
        [],
    ),
}


@pytest.mark.parametrize("template", ["checkpoint", "reference"])
@pytest.mark.parametrize("role", list(_AROUND))
async def test_a_message_as_text_parts_renders_as_the_same_text_as_a_string(
    model: ServedModel, template: str, role: str
) -> None:
    """Parts join with "\\n", as vLLM joins them for a template that takes a string: one part is
    its text, two are the text they join to, under either template and for every role."""
    served = model
    if template == "reference":
        served = ServedModel("m", model.tokenizer, model.pool, created=0, chat_format=ChatFormat(chat_template=reference_chat_template()))
    before, after = _AROUND[role]

    async def ids(content: Any) -> list[int]:
        extra = {"tool_call_id": "c"} if role == "tool" else {}
        req = chat(*before, {"role": role, "content": content, **extra}, *after)
        return list((await chat_prompt(served, req, [])).token_ids)

    one = [{"type": "text", "text": "Say hello."}]
    two = [{"type": "text", "text": "Say hello"}, {"type": "text", "text": "in one word."}]
    assert await ids(one) == await ids("Say hello.")
    assert await ids(two) == await ids("Say hello\nin one word.")


@pytest.mark.parametrize("effort", ["none", "minimal", "low", "medium", "high", "xhigh", "max"])
async def test_reasoning_effort_none_or_minimal_closes_the_reasoning_block_others_leave_it_open(
    model: ServedModel, effort: str
) -> None:
    """Under the reference dialect (its generation prompt opens <think>) and the bare LLM's own
    template (which opens none unless told to skip)."""
    reference = ServedModel("m", model.tokenizer, model.pool, created=0, chat_format=ChatFormat(chat_template=reference_chat_template()))
    ask = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": effort}
    skip = effort in ("none", "minimal")
    text = model.tokenizer.decode(
        (await chat_prompt(reference, parse_chat_completion_request(ask), [])).token_ids, skip_special_tokens=False
    )
    assert text.endswith("<|im_start|>assistant\n<think>\n" + ("\n</think>\n\n" if skip else ""))
    text = model.tokenizer.decode(
        (await chat_prompt(model, parse_chat_completion_request(ask), [])).token_ids, skip_special_tokens=False
    )
    assert text.endswith("<|im_start|>assistant\n" + ("<think>\n\n</think>\n\n" if skip else ""))


async def test_a_template_with_no_reasoning_block_renders_the_same_whatever_the_effort(model: ServedModel) -> None:
    plain = ServedModel("m", model.tokenizer, model.pool, created=0, chat_format=ChatFormat(chat_template="<{{ messages[0]['content'] }}>"))
    prompts = [
        (await chat_prompt(plain, body(**({} if effort is None else {"reasoning_effort": effort})), [])).token_ids
        for effort in (None, "none", "high")
    ]
    assert prompts[0] == prompts[1] == prompts[2] == model.tokenizer.encode("<Hi>", add_special_tokens=False)
