"""Every message crosses the pipe and comes back equal; malformed frames are refused."""

from __future__ import annotations

import dataclasses

import msgpack
import pytest

from omni.shared import protocol
from omni.shared.media.limits import MediaLimits
from omni.shared.protocol import wire

SAMPLING = protocol.SamplingOptions(
    temperature=0.7, top_p=0.9, top_k=5, seed=-3, logprobs=2, presence_penalty=-0.5,
    frequency_penalty=1.5, repetition_penalty=1.1, logit_bias_token_ids=[7, 300],
    logit_bias_values=[-100.0, 2.5], min_p=0.05, allowed_token_ids=[7, 9], bad_words_token_ids=[[4], [5, 6]],
    min_tokens=3, min_tokens_stop_ids=[0, 2], prompt_logprobs=1, prefill_only=True,
)  # fmt: skip
MEDIA = protocol.MediaRef("enc/vision_encoder/r/abc", offset=4, num_rows=9)
NEW = protocol.NewRequest("r1", [1, 2, 3], SAMPLING, [7, 2], 0, 3, [MEDIA])
CACHED = protocol.CachedRequest("r0", [5], 17, 1, resumed=True)
TOP = protocol.TopLogprob(11, -0.25)
SAMPLED = protocol.SampledToken("r1", 42, -0.5, [TOP, protocol.TopLogprob(3, -1.5)])
PROMPT_LOGPROBS = protocol.PromptLogprobs("r1", 1, [-0.5, -2.25], [1, 3], [[2], [9]], [[-0.5], [-0.125]])
ITEM = protocol.EncodeItem(3, "audio_encoder", "audio", "enc/a/r/k", b"\x00\xffRIFF", "wav", "messages[0].content[1]")
ENCODED = protocol.EncodedItem(3, 2, [9, 8], error=None, store_error="disk full")
FORWARD = protocol.ForwardTiming("vision_encoder", 4, 0.125)
STORE = protocol.StoreSettings("s3://bucket/prefix", "http://127.0.0.1:9000", "us-east-1")
IMAGE_JOB = protocol.ImageJob(7, [0, 5, 65535], 880, 656, 25, 1234, 0.5, "webp", 90, 2)
DECODED_IMAGE = protocol.DecodedImage(7, b"RIFF....WEBP", 880, 656, error=None)
LIMITS = MediaLimits(max_bytes=123, video_fps=1.5, allow_remote=True)

# One instance of every message type, with no field left at its default where avoidable.
AUDIO_CHUNK = protocol.AudioChunk(3, [17, 6560, 0], speaker_embedding=b"\x00" * 8, first=True)
DECODED_AUDIO = protocol.DecodedAudio(3, b"\x00\x00\x00\x00" * 2880)
EXAMPLES: dict[type, object] = {
    protocol.Shutdown: protocol.Shutdown(),
    protocol.WorkerError: protocol.WorkerError("boom", job_id=4, fatal=True),
    protocol.SamplingOptions: SAMPLING,
    protocol.MediaRef: MEDIA,
    protocol.NewRequest: NEW,
    protocol.CachedRequest: CACHED,
    protocol.Step: protocol.Step(
        8, [NEW], [CACHED], ["gone"], [protocol.TokenMask("r1", b"\x05\x00\x00\x00")], ["enc/a/r/k"], masks_follow=True
    ),
    protocol.StepMasks: protocol.StepMasks(8, [protocol.TokenMask("r0", b"\x01\x00\x00\x00")], error="grammar failed"),
    protocol.TokenMask: protocol.TokenMask("r0", b"\xff\xff\xff\x7f"),
    protocol.LLMReady: protocol.LLMReady(1, "cuda:1", 4096, 16, 8192),
    protocol.TopLogprob: TOP,
    protocol.SampledToken: SAMPLED,
    protocol.FailedRequest: protocol.FailedRequest("r2", "cannot read encoder output"),
    protocol.PromptLogprobs: PROMPT_LOGPROBS,
    protocol.Drafted: protocol.Drafted("r1", [4, 9, 2, 2]),
    protocol.StepResult: protocol.StepResult(
        8, [SAMPLED], [protocol.FailedRequest("r2", "x")], [PROMPT_LOGPROBS], [protocol.Drafted("r1", [5, 6, 7])]
    ),
    protocol.EncodeItem: ITEM,
    protocol.EncodeBatch: protocol.EncodeBatch(2, [ITEM, dataclasses.replace(ITEM, item_id=4, fmt=None)]),
    protocol.EncodedItem: ENCODED,
    protocol.ForwardTiming: FORWARD,
    protocol.EncodeResult: protocol.EncodeResult(2, [ENCODED], [FORWARD], 0.5, 1),
    protocol.EncoderReady: protocol.EncoderReady(0, "cpu", ["vision_encoder", "audio_tokenizer"]),
    protocol.StoreSettings: STORE,
    MediaLimits: LIMITS,
    protocol.LLMWorkerSpec: protocol.LLMWorkerSpec(
        worker_id=2, device="cuda:2", dtype="bfloat16", num_threads=3, world_size=1, model_dir="/m/llm",
        block_size=32, num_kv_blocks=100, kv_cache_memory_bytes=1 << 30, max_model_len=4096,
        attention_backend="flash_attn", store=STORE, embedding_cache_bytes=1 << 20,
    ),  # fmt: skip
    protocol.EncoderWorkerSpec: protocol.EncoderWorkerSpec(
        worker_id=0, device="cuda:3", world_size=1, model_dir="/m", store=STORE, media_limits=LIMITS
    ),
    protocol.ImageJob: IMAGE_JOB,
    protocol.DecodeImages: protocol.DecodeImages(5, [IMAGE_JOB, dataclasses.replace(IMAGE_JOB, job_id=8, seed=-1)]),
    protocol.PartialImage: protocol.PartialImage(5, 7, 1, b"\x89PNG"),
    protocol.DecodedImage: DECODED_IMAGE,
    protocol.DecodeResult: protocol.DecodeResult(5, [DECODED_IMAGE], 0.25, 0.125),
    protocol.VisionDecoderReady: protocol.VisionDecoderReady(0, "cuda:2", 2, 27, 27, 65536, "autoguidance", 0.75, ["768x768"]),
    protocol.VisionDecoderWorkerSpec: protocol.VisionDecoderWorkerSpec(
        worker_id=0, device="cuda:2", dtype="bfloat16", world_size=2, model_dir="/m/vision_decoder",
        rank_devices=["cuda:2", "cuda:3"],
    ),  # fmt: skip
    protocol.AudioChunk: AUDIO_CHUNK,
    protocol.DecodeAudio: protocol.DecodeAudio(6, [AUDIO_CHUNK], closed=[2, 3]),
    protocol.DecodedAudio: DECODED_AUDIO,
    protocol.AudioDecodeResult: protocol.AudioDecodeResult(6, [DECODED_AUDIO, protocol.DecodedAudio(4, b"", "no such unit")], 0.01),
    protocol.EmbedSpeaker: protocol.EmbedSpeaker(7, b"\x00\x00\x80\x3f" * 4, 16000),
    protocol.SpeakerEmbedding: protocol.SpeakerEmbedding(7, b"\x00" * 16),
    protocol.AudioDecoderReady: protocol.AudioDecoderReady(0, "cuda:3", 24000, 960, 6561, ["vivian", "ryan"], True),
    protocol.AudioDecoderWorkerSpec: protocol.AudioDecoderWorkerSpec(worker_id=0, device="cuda:3", model_dir="/m/audio_decoder", seed=3),
}


def _ours() -> set[type]:
    # Tests may register message types of their own (the worker-group test does).
    return {cls for cls in wire.message_types().values() if cls.__module__.startswith("omni.")}


def test_every_message_type_has_an_example() -> None:
    assert set(EXAMPLES) == _ours()


@pytest.mark.parametrize("cls", sorted(EXAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_round_trip(cls: type) -> None:
    message = EXAMPLES[cls]
    decoded = protocol.decode(protocol.encode(message))
    assert type(decoded) is cls
    assert decoded == message


def test_nested_messages_come_back_typed() -> None:
    step = protocol.decode(protocol.encode(EXAMPLES[protocol.Step]))
    assert isinstance(step, protocol.Step)
    assert isinstance(step.new_requests[0].sampling, protocol.SamplingOptions)
    assert isinstance(step.new_requests[0].media[0], protocol.MediaRef)
    result = protocol.decode(protocol.encode(EXAMPLES[protocol.StepResult]))
    assert isinstance(result.sampled[0].top_logprobs[0], protocol.TopLogprob)
    assert isinstance(result.failed[0], protocol.FailedRequest)
    assert isinstance(result.prompt_logprobs[0], protocol.PromptLogprobs)
    spec = protocol.decode(protocol.encode(EXAMPLES[protocol.EncoderWorkerSpec]))
    assert isinstance(spec.media_limits, MediaLimits) and isinstance(spec.store, protocol.StoreSettings)


def _wire(message: object) -> list:
    return msgpack.unpackb(protocol.encode(message), raw=False)


def test_unknown_tag_is_refused() -> None:
    with pytest.raises(ValueError, match="not an omni-serve message"):
        protocol.decode(msgpack.packb([999, 1, 2]))
    with pytest.raises(ValueError, match="not an omni-serve message"):
        protocol.decode(msgpack.packb({"tag": 4}))


@pytest.mark.parametrize("cls", sorted(EXAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_wrong_field_count_is_refused(cls: type) -> None:
    items = _wire(EXAMPLES[cls])
    with pytest.raises(ValueError, match=f"{cls.__name__}: expected {len(items) - 1} fields"):
        protocol.decode(msgpack.packb(items + [None], use_bin_type=True))
    if len(items) > 1:
        with pytest.raises(ValueError, match=f"{cls.__name__}: expected"):
            protocol.decode(msgpack.packb(items[:-1], use_bin_type=True))


def test_a_nested_message_with_the_wrong_tag_is_refused() -> None:
    items = _wire(EXAMPLES[protocol.Step])
    items[2][0][0] = protocol.CachedRequest.TAG  # a CachedRequest tag where a NewRequest goes
    with pytest.raises(ValueError, match="expected a NewRequest message"):
        protocol.decode(msgpack.packb(items, use_bin_type=True))
    items = _wire(EXAMPLES[protocol.LLMWorkerSpec])
    store_at = [f.name for f in dataclasses.fields(protocol.LLMWorkerSpec)].index("store") + 1
    items[store_at] = ["s3://x", None, None]  # the nested message's tag is missing
    with pytest.raises(ValueError, match="expected a StoreSettings message"):
        protocol.decode(msgpack.packb(items, use_bin_type=True))


def test_a_list_field_that_is_not_a_list_is_refused() -> None:
    items = _wire(EXAMPLES[protocol.EncodeBatch])
    items[2] = 5
    with pytest.raises(ValueError, match="EncodeBatch.items: expected a list of EncodeItem"):
        protocol.decode(msgpack.packb(items, use_bin_type=True))


def test_only_registered_messages_are_encoded() -> None:
    @dataclasses.dataclass
    class Stray:
        x: int = 1

    with pytest.raises(TypeError, match="not a registered message"):
        protocol.encode(Stray())


def test_tags_never_repeat() -> None:
    @dataclasses.dataclass
    class Impostor:
        TAG = protocol.Step.TAG

    with pytest.raises(ValueError, match="tag 4 is taken by Step"):
        protocol.register(Impostor)
