from pathlib import Path
from typing import Any

import pytest

from omni.errors import APIError
from omni.serving.requests import (
    ChatCompletionRequest,
    ChatMessage,
    CompletionRequest,
    ImageURLPart,
    InputAudioPart,
    TextPart,
    check_token_ids,
    parse_chat_completion_request,
    parse_completion_request,
)
from omni.serving.requests.chat import AudioOutput, ImageURL, InputAudio
from omni.serving.requests.common import StreamOptions
from omni.serving.sampling import sampling_params
from omni.text.tokenizer import TextTokenizer
from scheduler.request import SamplingParams

USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)  # 1458 tokens


def chat(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, **fields}


def completion(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "prompt": "hi", **fields}


def test_an_unknown_field_is_a_400_naming_it() -> None:
    with pytest.raises(APIError) as e:
        parse_chat_completion_request(chat(unknown_field={"a": 1}))
    assert (e.value.status, e.value.param, e.value.code) == (400, "unknown_field", "unknown_parameter")


def test_chat_defaults() -> None:
    r = parse_chat_completion_request(chat(user="x", tools=[]))
    # the Struct keeps the fields as sent (user too); what they mean are properties
    assert r == ChatCompletionRequest(model="m", messages=(ChatMessage(role="user", content="hi"),), user="x")
    assert (r.max_tokens, r.temperature, r.top_p, r.top_k, r.seed, r.stop) == (
        None, 1.0, 1.0, None, None, ()
    )
    assert (r.n, r.stream, r.include_usage, r.logprobs, r.num_logprobs) == (1, False, False, False, None)


def test_chat_all_fields() -> None:
    r = parse_chat_completion_request(
        chat(
            messages=[
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "What is "},
                        {"type": "image_url", "image_url": {"url": "https://x/a.png", "detail": "low"}},
                        {"type": "input_audio", "input_audio": {"data": "UklG", "format": "wav"}},
                    ],
                },
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}],
                },
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
            ],
            stream=True,
            stream_options={"include_usage": True},
            max_completion_tokens=10,
            max_tokens=99,
            temperature=0,
            top_p=0.5,
            top_k=-1,
            seed=7,
            stop="END",
            logprobs=True,
            top_logprobs=3,
            n=2,
            presence_penalty=0,
            frequency_penalty=0.0,
            ignore_eos=True,
            modalities=["text", "text"],
            audio={"voice": "alloy", "format": "wav"},
        )
    )
    assert r.stream and r.include_usage and r.n == 2
    assert r == ChatCompletionRequest(
        model="m",
        messages=r.messages,
        max_tokens=10,  # max_completion_tokens wins
        max_completion_tokens=10,
        temperature=0.0,
        top_p=0.5,
        top_k_sent=-1,
        seed=7,
        stop_sent="END",
        n=2,
        stream=True,
        stream_options=StreamOptions(include_usage=True),
        logprobs=True,
        top_logprobs=3,
        ignore_eos=True,
        modalities_sent=["text", "text"],
        audio=AudioOutput(voice="alloy", format="wav"),
    )
    assert (r.max_tokens_param, r.top_k, r.stop, r.include_usage) == ("max_completion_tokens", None, ("END",), True)
    assert r.modalities == ("text",)
    assert not r.images_allowed  # modalities given without "image"
    assert "audio" not in r.modalities  # nor "audio"
    assert r.num_logprobs == 3
    assert r.messages[1].content == (
        TextPart("What is "),
        ImageURLPart(ImageURL(url="https://x/a.png", detail="low")),
        InputAudioPart(InputAudio(data="UklG", format="wav")),
    )
    assert r.messages[1].text == "What is "
    assert r.messages[2].to_template_dict() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"x": 1}}}],
    }
    assert r.messages[3].to_template_dict() == {"role": "tool", "content": "42", "tool_call_id": "c1"}


def test_chat_logprobs_without_top() -> None:
    assert parse_chat_completion_request(chat(logprobs=True)).num_logprobs == 0
    assert parse_chat_completion_request(chat(logprobs=False)).num_logprobs is None


def test_chat_template_dict_of_text_parts_is_their_text_and_of_media_the_parts() -> None:
    text = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    image = {"type": "image_url", "image_url": {"url": "https://x/y.png"}}
    r = parse_chat_completion_request(
        chat(messages=[{"role": "user", "content": text}, {"role": "user", "content": [*text, image]}])
    )
    assert [m.to_template_dict() for m in r.messages] == [
        {"role": "user", "content": "a\nb"},
        {"role": "user", "content": [*text, {"type": "image_url", "image_url": {"url": "https://x/y.png", "detail": None}}]},
    ]


CHAT_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"messages": USER}, "model"),
    ({"model": 3, "messages": USER}, "model"),
    ({"model": "m"}, "messages"),
    (chat(messages=[]), "messages"),
    (chat(messages="hi"), "messages"),
    (chat(messages=["hi"]), "messages[0]"),
    (chat(messages=[{"content": "x"}]), "messages[0].role"),
    (chat(messages=[{"role": "robot", "content": "x"}]), "messages[0].role"),
    (chat(messages=[USER[0], {"role": "user"}]), "messages[1].content"),
    (chat(messages=[{"role": "user", "content": None}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": 5}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": []}]), "messages[0].content"),
    (chat(messages=[{"role": "user", "content": [{"type": "text"}]}]), "messages[0].content[0].text"),
    (chat(messages=[{"role": "user", "content": [{"type": "text", "text": 1}]}]), "messages[0].content[0].text"),
    (chat(messages=[{"role": "user", "content": [{"type": "file"}]}]), "messages[0].content[0].type"),
    (chat(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages[0].content[0].image_url"),
    (
        chat(messages=[{"role": "system", "content": [{"type": "image_url", "image_url": "http://x"}]}]),
        "messages[0].content",
    ),
    (chat(messages=[{"role": "user", "content": "x", "tool_calls": [{}]}]), "messages[0].tool_calls"),
    (chat(stream="yes"), "stream"),
    (chat(stream_options={"include_usage": True}), "stream_options"),
    (chat(stream=True, stream_options={"include_usage": 1}), "stream_options.include_usage"),
    (chat(stream=True, stream_options=[]), "stream_options"),
    (chat(max_tokens=0), "max_tokens"),
    (chat(max_tokens=1.5), "max_tokens"),
    (chat(max_tokens=True), "max_tokens"),
    (chat(max_tokens="10"), "max_tokens"),
    (chat(max_completion_tokens=-1), "max_completion_tokens"),
    (chat(max_completion_tokens=5, max_tokens=0), "max_tokens"),
    (chat(temperature="hot"), "temperature"),
    (chat(temperature=True), "temperature"),
    (chat(temperature=2.5), "temperature"),
    (chat(temperature=-0.1), "temperature"),
    (chat(temperature=float("nan")), "temperature"),
    (chat(top_p=0), "top_p"),
    (chat(top_p=1.01), "top_p"),
    (chat(top_k=-2), "top_k"),
    (chat(top_k=2.0), "top_k"),
    (chat(seed="1"), "seed"),
    (chat(seed=2**64), "seed"),
    (chat(stop=5), "stop"),
    (chat(stop=["a", 1]), "stop"),
    (chat(stop=["a", "b", "c", "d", "e"]), "stop"),
    (chat(stop=[""]), "stop"),
    (chat(logprobs="yes"), "logprobs"),
    (chat(top_logprobs=2), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=21), "top_logprobs"),
    (chat(logprobs=True, top_logprobs=-1), "top_logprobs"),
    (chat(n=0), "n"),
    (chat(n=129), "n"),  # OpenAI's bound is 128
    (chat(n="2"), "n"),
    (chat(presence_penalty=2.5), "presence_penalty"),
    (chat(frequency_penalty=-2.01), "frequency_penalty"),
    (chat(frequency_penalty=3), "frequency_penalty"),
    (chat(presence_penalty="0"), "presence_penalty"),
    (chat(repetition_penalty=0), "repetition_penalty"),
    (chat(repetition_penalty=-1.1), "repetition_penalty"),
    (chat(repetition_penalty=[1]), "repetition_penalty"),
    (chat(logit_bias=[5]), "logit_bias"),
    (chat(logit_bias={"x": 10}), "logit_bias"),
    (chat(logit_bias={"-5": 10}), "logit_bias"),
    (chat(logit_bias={"²": 10}), "logit_bias"),
    (chat(logit_bias={"5": 100.5}), "logit_bias"),
    (chat(logit_bias={"5": -101}), "logit_bias"),
    (chat(logit_bias={"5": "1"}), "logit_bias"),
    (chat(logit_bias={"5": True}), "logit_bias"),
    (chat(logit_bias={"5": 1, "05": 2}), "logit_bias"),
    (chat(min_p=1.5), "min_p"),
    (chat(min_p=-0.1), "min_p"),
    (chat(min_p="0.1"), "min_p"),
    (chat(min_tokens=-1), "min_tokens"),
    (chat(min_tokens=1.5), "min_tokens"),
    (chat(max_tokens=4, min_tokens=5), "min_tokens"),
    (chat(max_completion_tokens=4, min_tokens=5), "min_tokens"),
    (chat(allowed_token_ids=[]), "allowed_token_ids"),
    (chat(allowed_token_ids=[1, -1]), "allowed_token_ids"),
    (chat(allowed_token_ids=[1, True]), "allowed_token_ids"),
    (chat(allowed_token_ids="1"), "allowed_token_ids"),
    (chat(bad_words="word"), "bad_words"),
    (chat(bad_words=["a", 1]), "bad_words"),
    (chat(bad_words=["a", " "]), "bad_words"),
    (chat(bad_words=[""]), "bad_words"),
    (chat(response_format={"type": "bogus"}), "response_format.type"),
    (chat(modalities=["text", "smell"]), "modalities"),
    (chat(modalities="text"), "modalities"),
    (chat(modalities=["audio"]), "audio"),  # audio output needs its voice and format
    (chat(modalities=["audio"], audio={"voice": "a", "format": "ogg"}), "audio.format"),
    (chat(audio={"format": "wav"}), "audio.voice"),
    (chat(ignore_eos="no"), "ignore_eos"),
]


@pytest.mark.parametrize(("body", "param"), CHAT_ERRORS)
def test_chat_errors(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_chat_completion_request(body)
    assert info.value.status == 400
    assert info.value.type == "invalid_request_error"
    assert info.value.param == param
    assert param in info.value.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (chat(modalities=["audio", "text"]), "audio"),
        (chat(modalities=["text", "audio"], audio={"voice": "alloy", "format": "wav"}, stream=True), "audio.format"),
    ],
)
def test_audio_output_needs_its_voice_and_format_and_streams_pcm16(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_chat_completion_request(body)
    assert (info.value.status, info.value.param) == (400, param)
    ok = parse_chat_completion_request(chat(modalities=["text", "audio"], audio={"voice": "alloy", "format": "pcm16"}, stream=True))
    assert ok.audio == AudioOutput("alloy", "pcm16") and "audio" in ok.modalities


@pytest.mark.parametrize("modalities, allowed", [(["text", "image"], True), (["image"], True), (["text"], False), (None, True)])
def test_image_output_follows_modalities(modalities: list[str] | None, allowed: bool) -> None:
    """Images may come out unless modalities is given without "image"; whether the model can
    draw at all is the lifecycle's question (a 400 there for a model without a decoder)."""
    req = parse_chat_completion_request(chat(modalities=modalities) if modalities is not None else chat())
    assert req.images_allowed is allowed


def test_audio_object_is_validated_before_the_modality_is_refused() -> None:
    with pytest.raises(APIError) as info:
        parse_chat_completion_request(
            chat(modalities=["text", "audio"], audio={"voice": "alloy", "format": "ogg"})
        )
    assert (info.value.status, info.value.param, info.value.code) == (
        400, "audio.format", "invalid_value"
    )


def test_type_error_message() -> None:
    with pytest.raises(APIError) as info:
        parse_chat_completion_request(chat(temperature="hot"))
    assert info.value.message == (
        "Invalid type for 'temperature': expected a number, but got a string instead."
    )
    assert info.value.code == "invalid_type"


def test_completion_prompts() -> None:
    assert parse_completion_request(completion()).prompts == ("hi",)
    assert parse_completion_request(completion(prompt=["a", "b"])).prompts == ("a", "b")
    assert parse_completion_request(completion(prompt=[1, 2, 3])).prompts == ((1, 2, 3),)
    assert parse_completion_request(completion(prompt=[[1], [2, 3]])).prompts == ((1,), (2, 3))
    r = parse_completion_request(completion(logprobs=2, echo=False, suffix=None, stop=["x"]))
    assert r.num_logprobs == 2 and r.stop == ("x",)
    assert parse_completion_request(completion(logprobs=0)).num_logprobs == 0
    assert parse_completion_request(completion()).num_logprobs is None


COMPLETION_ERRORS: list[tuple[dict[str, Any], str]] = [
    ({"model": "m"}, "prompt"),
    ({"prompt": "x"}, "model"),
    (completion(prompt=5), "prompt"),
    (completion(prompt=[]), "prompt"),
    (completion(prompt=["a", 1]), "prompt"),
    (completion(prompt=[1, "a"]), "prompt"),
    (completion(prompt=[1, True]), "prompt"),
    (completion(prompt=[1, -2]), "prompt"),
    (completion(prompt=[[1], []]), "prompt[1]"),
    (completion(prompt=[[1], [0.5]]), "prompt[1]"),
    (completion(echo="no"), "echo"),
    (completion(suffix="tail"), "suffix"),
    (completion(logprobs=6), "logprobs"),
    (completion(logprobs=True), "logprobs"),
    (completion(temperature=[1]), "temperature"),
    (completion(presence_penalty=-3), "presence_penalty"),
    (completion(repetition_penalty=0), "repetition_penalty"),
    (completion(logit_bias={"a": 1}), "logit_bias"),
    (completion(min_p=2), "min_p"),
    (completion(max_tokens=1, min_tokens=2), "min_tokens"),
    (completion(allowed_token_ids=[]), "allowed_token_ids"),
    (completion(bad_words=[None]), "bad_words"),
    (completion(max_tokens=0), "max_tokens"),
]


@pytest.mark.parametrize(("body", "param"), COMPLETION_ERRORS)
def test_completion_errors(body: dict[str, Any], param: str) -> None:
    with pytest.raises(APIError) as info:
        parse_completion_request(body)
    assert info.value.status == 400
    assert info.value.param == param


def test_check_token_ids() -> None:
    check_token_ids((0, 9), vocab_size=10)
    with pytest.raises(APIError) as info:
        check_token_ids((0, 10), vocab_size=10, param="prompt[1]")
    assert info.value.param == "prompt[1]"
    assert info.value.message == (
        "Invalid value for 'prompt[1]': token id 10 is out of range for a vocabulary of 10."
    )


def test_sampling_params(tok: TextTokenizer) -> None:
    r = parse_chat_completion_request(chat(temperature=0.5, top_k=5, seed=3, logprobs=True))
    assert sampling_params(r, num_prompt_tokens=10, max_model_len=100, tokenizer=tok, stop_token_ids=(7,)) == (
        SamplingParams(
            max_tokens=90, temperature=0.5, top_p=1.0, top_k=5, seed=3, logprobs=0, stop_token_ids=(7,)
        )
    )
    c = parse_completion_request(completion(max_tokens=90, ignore_eos=True))
    params = sampling_params(c, num_prompt_tokens=10, max_model_len=100, tokenizer=tok)
    assert params.max_tokens == 90 and params.ignore_eos


SAMPLING_FIELDS: dict[str, Any] = {
    "presence_penalty": -1.5,
    "frequency_penalty": 2,
    "repetition_penalty": 1.2,
    "logit_bias": {"1443": -100, "7": 2.5, "12": 100},
    "min_p": 0.05,
    "min_tokens": 3,
    "allowed_token_ids": [9, 3, 9, 1443],
    "bad_words": ["the", "  hello", "Hello there", "fibonacci"],
}


@pytest.mark.parametrize("parse", [parse_chat_completion_request, parse_completion_request])
def test_sampling_fields_reach_sampling_params(parse: Any, tok: TextTokenizer) -> None:
    body = chat(**SAMPLING_FIELDS) if parse is parse_chat_completion_request else completion(**SAMPLING_FIELDS)
    r = parse(body)
    assert (r.presence_penalty, r.frequency_penalty, r.repetition_penalty, r.min_p, r.min_tokens) == (
        -1.5, 2.0, 1.2, 0.05, 3
    )
    assert r.logit_bias == ((7, 2.5), (12, 100.0), (1443, -100.0))  # sorted by token id
    assert r.allowed_token_ids == (3, 9, 1443)  # a set: sorted, once each
    assert r.bad_words == ("the", "  hello", "Hello there", "fibonacci")
    params = sampling_params(r, num_prompt_tokens=10, max_model_len=100, tokenizer=tok)
    assert params == SamplingParams(
        max_tokens=90,
        min_tokens=3,
        presence_penalty=-1.5,
        frequency_penalty=2.0,
        repetition_penalty=1.2,
        logit_bias=((7, 2.5), (12, 100.0), (1443, -100.0)),
        min_p=0.05,
        allowed_token_ids=(3, 9, 1443),
        # vLLM's rule: the word as text starts ("the" is 735), then after a space when that
        # gives another first token in as many tokens (" the" is 267); " Hello there" and
        # " fibonacci" take another count of tokens, so only their bare form is banned.
        bad_words_token_ids=((735,), (267,), (257, 75, 349), (513, 75, 349), (1256, 964), (69, 571)),
    )
    assert tok.encode("the", add_special_tokens=False) == [735]
    assert tok.encode(" hello", add_special_tokens=False) == [513, 75, 349]
    assert tok.encode(" Hello there", add_special_tokens=False) == [220, 1256, 964]
    assert tok.encode(" fibonacci", add_special_tokens=False) == [1026]


def test_sampling_fields_default_to_doing_nothing(tok: TextTokenizer) -> None:
    r = parse_chat_completion_request(
        chat(presence_penalty=None, frequency_penalty=0, repetition_penalty=1, logit_bias={}, min_tokens=0)
    )
    params = sampling_params(r, num_prompt_tokens=10, max_model_len=100, tokenizer=tok)
    assert params == SamplingParams(max_tokens=90)


def test_sampling_field_messages() -> None:
    cases = {
        "presence_penalty": (chat(presence_penalty=2.5), "must be between -2 and 2, got 2.5."),
        "repetition_penalty": (chat(repetition_penalty=0), "must be between 0.001 and 1000, got 0."),
        "min_p": (chat(min_p=1.5), "must be between 0 and 1, got 1.5."),
        "min_tokens": (chat(max_tokens=4, min_tokens=5), "must be at most max_tokens (4), got 5."),
        "logit_bias": (chat(logit_bias={"5": 101}), "must be between -100 and 100, got 101."),
    }
    for param, (body, detail) in cases.items():
        with pytest.raises(APIError) as info:
            parse_chat_completion_request(body)
        assert (info.value.status, info.value.param, info.value.code) == (400, param, "invalid_value")
        assert info.value.message == f"Invalid value for '{param}': {detail}"
    with pytest.raises(APIError) as info:
        parse_chat_completion_request(chat(logit_bias={"5": None}))
    assert (info.value.param, info.value.code) == ("logit_bias", "invalid_type")


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        ({"logit_bias": {"1458": 1}}, "logit_bias"),
        ({"allowed_token_ids": [5, 1458]}, "allowed_token_ids"),
        # out of the vocabulary, a stop id could never be sampled; banned by min_tokens it
        # indexed past the logits in the worker (a device-side assert on a GPU, issue 22)
        ({"stop_token_ids": [1458], "min_tokens": 2}, "stop_token_ids"),
        ({"stop_token_ids": [3, 1458]}, "stop_token_ids"),
    ],
)
def test_token_ids_must_be_in_the_vocabulary(fields: dict[str, Any], param: str, tok: TextTokenizer) -> None:
    for r in (parse_chat_completion_request(chat(**fields)), parse_completion_request(completion(**fields))):
        with pytest.raises(APIError) as info:
            sampling_params(r, num_prompt_tokens=10, max_model_len=100, tokenizer=tok)
        assert (info.value.status, info.value.param, info.value.code) == (400, param, "invalid_value")
        assert info.value.message == (
            f"Invalid value for '{param}': token id 1458 is out of range for a vocabulary of 1458."
        )


@pytest.mark.parametrize(
    ("body", "num_prompt_tokens", "param", "code"),
    [
        (chat(), 100, "messages", "context_length_exceeded"),
        (chat(), 101, "messages", "context_length_exceeded"),
        (chat(max_tokens=91), 10, "max_tokens", "context_length_exceeded"),
        (chat(max_completion_tokens=91), 10, "max_completion_tokens", "context_length_exceeded"),
        (chat(), 0, "messages", "invalid_value"),
        (completion(), 100, "prompt", "context_length_exceeded"),
        (completion(max_tokens=100), 1, "max_tokens", "context_length_exceeded"),
    ],
)
def test_context_length_errors(
    body: dict[str, Any], num_prompt_tokens: int, param: str, code: str, tok: TextTokenizer
) -> None:
    request: ChatCompletionRequest | CompletionRequest
    if "messages" in body:
        request = parse_chat_completion_request(body)
    else:
        request = parse_completion_request(body)
    with pytest.raises(APIError) as info:
        sampling_params(request, num_prompt_tokens=num_prompt_tokens, max_model_len=100, tokenizer=tok)
    assert info.value.status == 400
    assert info.value.param == param
    assert info.value.code == code


def test_context_length_message(tok: TextTokenizer) -> None:
    r = parse_chat_completion_request(chat(max_tokens=95))
    with pytest.raises(APIError) as info:
        sampling_params(r, num_prompt_tokens=10, max_model_len=100, tokenizer=tok)
    assert info.value.message == (
        "This model's maximum context length is 100 tokens. However, you requested 105 tokens "
        "(10 in the messages, 95 in the completion). Please reduce the length of the messages "
        "or the completion."
    )
