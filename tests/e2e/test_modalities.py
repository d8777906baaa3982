"""Output modalities through the official client: audio from a model that cannot speak is a 400."""

from __future__ import annotations

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam

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
