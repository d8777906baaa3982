"""Output modalities through the official client: audio from a model that cannot speak is a 400;
on the published default (the reference dialect, reasoning on), audio comes only when
modalities asks for it, and no media span opens inside the reasoning."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

from omni.text.constrained.audio_span import START as AUDIO_START
from omni.text.constrained.image_span import START as IMAGE_START
from omni.text.tokenizer import TextTokenizer

pytestmark = pytest.mark.slow

MODEL = "omni-tiny"
HELLO: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Hello there, how are you today?"}
]


def test_audio_output_is_a_400_naming_modalities(server: str) -> None:
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            max_tokens=2,
            modalities=["text", "audio"],
            audio={"voice": "alloy", "format": "wav"},
        )
    assert info.value.status_code == 400
    assert info.value.param == "modalities"
    assert "no audio decoder" in info.value.message  # a text-only model cannot speak
    # ...and the server keeps serving plain text requests.
    ok = client.chat.completions.with_raw_response.create(
        model=MODEL,
        messages=HELLO,
        max_tokens=2,
    )
    assert ok.status_code == 200
    assert ok.parse().choices[0].message.role == "assistant"


# The published default with its reasoning on: random weights write the dialect's bare audio
# units everywhere and open spans now and then. Before audio needed modalities and the openers
# were held back in the reasoning, seed 3 spoke unasked (its reasoning's bare units), seed 1
# drew an image inside its reasoning, and with a bias on an opener seed 0 opened it there.
PUBLISHED = "omni"
SEEDS = range(8)
TELL = [{"role": "user", "content": "Tell me something."}]
SPEAK = {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "wav"}}


def _turn(base: str, seed: int, **extra: Any) -> dict[str, Any]:
    body = {"model": PUBLISHED, "messages": TELL, "seed": seed, "temperature": 1.0, "max_tokens": 300, "logprobs": True}
    r = httpx.post(f"{base}/v1/chat/completions", json=body | extra, timeout=300)
    assert r.status_code == 200, r.text
    choice: dict[str, Any] = r.json()["choices"][0]
    return choice


@pytest.mark.parametrize("extra", [{}, {"audio": {"voice": "alloy", "format": "wav"}}, {"modalities": ["text", "image"]}])
def test_a_turn_that_does_not_ask_for_audio_gets_none(speaking_server: str, extra: dict[str, Any]) -> None:
    """No modalities (or none naming audio; `audio` alone asks for nothing, as on OpenAI's chat):
    no audio object, streamed or not, whatever the model writes."""
    client = openai.OpenAI(base_url=f"{speaking_server}/v1", api_key="none", max_retries=0, timeout=300)
    for seed in SEEDS:
        choice = _turn(speaking_server, seed, **extra)
        assert choice["message"].get("audio") is None, seed
        stream = client.chat.completions.create(
            model=PUBLISHED, messages=TELL, seed=seed, temperature=1.0, max_tokens=300, stream=True, extra_body=extra  # type: ignore[arg-type]
        )
        for chunk in stream:
            for c in chunk.choices:
                assert c.delta.model_dump().get("audio") is None, seed


@pytest.fixture(scope="module")
def openers(omni_dir: Path) -> dict[str, int]:
    tokenizer = TextTokenizer.from_dir(omni_dir)
    ids = {"image": tokenizer.token_to_id(IMAGE_START), "audio": tokenizer.token_to_id(AUDIO_START)}
    assert None not in ids.values()
    return cast(dict[str, int], ids)


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_no_media_span_opens_inside_the_reasoning(speaking_server: str, openers: dict[str, int], kind: str) -> None:
    """A bias that makes the model open a span at once (an image with no modalities, audio asked
    for): not one opening token (nor, speaking in the dialect, a bare unit: it would open a span)
    is sampled before </think>, which a thinking budget brings soon; after it the span comes.
    (Unasked, the dialect's bare units are special tokens that reach neither text nor audio.)"""
    bias = {"logit_bias": {str(openers[kind]): 100}, "thinking_token_budget": 20}
    for seed in SEEDS:
        choice = _turn(speaking_server, seed, **bias, **(SPEAK if kind == "audio" else {}))
        tokens = [e["token"] for e in choice["logprobs"]["content"]]
        assert "</think>" in tokens, (seed, tokens)
        reasoning = tokens[: tokens.index("</think>")]
        assert not [t for t in reasoning if t in (IMAGE_START, AUDIO_START)], seed
        if kind == "audio":  # a bare unit (<|audioNNNN|>); <|audio_start|> is the input's marker
            assert not [t for t in reasoning if re.fullmatch(r"<\|audio\d+\|>", t)], seed
        if kind == "image":  # the rule for images is unchanged: drawn unasked, after the reasoning
            content = choice["message"]["content"]
            assert isinstance(content, list) and content[-1]["type"] == "image_url", (seed, content)
        else:
            assert choice["message"]["audio"]["data"], seed
