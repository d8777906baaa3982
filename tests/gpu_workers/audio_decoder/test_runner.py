"""AudioDecoderRunner in-process on the tiny audio decoder: streams decoded chunk by chunk, in
batches with other streams, give the samples of decoding each span at once; a bad chunk fails
its stream alone; voices come from the table or from a reference recording."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from gpu_workers.audio_decoder.runner import AudioDecoderRunner, PublishedAudioDecoderRunner
from gpu_workers.distributed import GroupMember
from gpu_workers.tiny.checkpoints import make_tiny_audio_decoder
from gpu_workers.tiny.published_audio_decoder import make_tiny_published_audio_decoder
from omni.shared import protocol


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> AudioDecoderRunner:
    directory = make_tiny_audio_decoder(tmp_path_factory.mktemp("ad") / "audio_decoder", seed=0, num_units=64)
    spec = protocol.AudioDecoderWorkerSpec(model_dir=str(directory))
    return AudioDecoderRunner.from_spec(spec, GroupMember(0, 1, None))


def _decode(
    runner: AudioDecoderRunner, batch_id: int, chunks: list[protocol.AudioChunk], closed: list[int] | None = None
) -> dict[int, np.ndarray]:
    result = runner.run(protocol.DecodeAudio(batch_id, chunks, closed=closed or []))
    assert isinstance(result, protocol.AudioDecodeResult) and result.batch_id == batch_id
    assert [r.stream_id for r in result.chunks] == [c.stream_id for c in chunks]
    assert all(r.error is None for r in result.chunks), [r.error for r in result.chunks]
    return {r.stream_id: np.frombuffer(r.samples, dtype="<f4") for r in result.chunks}


def _one_shot(runner: AudioDecoderRunner, units: list[int], speaker: int) -> np.ndarray:
    with torch.inference_mode():
        voice = runner.vocoder.speaker_embedding(torch.tensor([speaker]))
        return runner.vocoder(torch.tensor([units]), voice)[0].numpy()


def test_ready_message(runner: AudioDecoderRunner) -> None:
    ready = runner.ready_message(protocol.AudioDecoderWorkerSpec(model_dir="x"))
    assert (ready.sample_rate, ready.hop, ready.num_units) == (24000, 960, 64)
    assert len(ready.speakers) >= 2 and ready.speaker_encoder


def test_streams_in_shared_batches_equal_each_span_decoded_at_once(runner: AudioDecoderRunner) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 64, 31).tolist(), rng.integers(0, 64, 12).tolist()
    # a: 4, 25, 2 units; b: 3, 9 (last) - b joins a batch late and leaves early
    got = {1: [], 2: []}
    batches = [
        [protocol.AudioChunk(1, a[:4], speaker=0, first=True)],
        [protocol.AudioChunk(1, a[4:29]), protocol.AudioChunk(2, b[:3], speaker=1, first=True)],
        [protocol.AudioChunk(2, b[3:], last=True), protocol.AudioChunk(1, a[29:], last=True)],
    ]
    for i, chunks in enumerate(batches):
        for stream_id, samples in _decode(runner, i, chunks).items():
            got[stream_id].append(samples)
    for stream_id, units, speaker in ((1, a, 0), (2, b, 1)):
        streamed = np.concatenate(got[stream_id])
        assert streamed.shape == (len(units) * 960,)
        np.testing.assert_array_equal(streamed, _one_shot(runner, units, speaker))
    assert runner.streams == {}  # both ended: their states are freed


def test_streams_keep_their_state_in_reused_rows_and_equal_each_span_decoded_at_once(
    runner: AudioDecoderRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """20 streams, up to 11 open at once: more than the state's first 8 rows
    (it grows), rows freed by streams that end or are closed are taken by later ones (which
    must start from zeros), a stream's chunks land in batches of changing makeup and order.
    Every stream that ends gives, exactly, its span decoded at once."""
    fresh = AudioDecoderRunner(runner.loaded)
    seen: list[tuple[str, str]] = []
    decode_chunk = fresh.vocoder.decode_chunk

    def on_host(units: torch.Tensor, speaker: torch.Tensor, state: Any, lengths: Any = None) -> Any:
        seen.append((units.device.type, lengths.device.type))  # checked there: no read from the device
        return decode_chunk(units, speaker, state, lengths)

    monkeypatch.setattr(fresh.vocoder, "decode_chunk", on_host)
    rng = np.random.default_rng(7)
    spans = {s: rng.integers(0, 64, int(rng.integers(3, 30))).tolist() for s in range(20)}
    left = {s: list(units) for s, units in spans.items()}
    got: dict[int, list[np.ndarray]] = {s: [] for s in spans}
    waiting, open_ = list(spans), list[int]()
    closed_early = {4, 11}
    for batch_id in range(40):
        while waiting and len(open_) < 11 and rng.random() < 0.7:
            open_.append(waiting.pop(0))
        chunks, closed = [], []
        for s in rng.permutation(open_).tolist():
            if s in closed_early and len(left[s]) < len(spans[s]):
                closed.append(s)  # a client that left mid-way
                open_.remove(s)
                continue
            n = min(len(left[s]), int(rng.integers(1, 9)))
            first, units = len(left[s]) == len(spans[s]), left[s][:n]
            left[s] = left[s][n:]
            chunks.append(protocol.AudioChunk(s, units, speaker=s % 2, first=first, last=not left[s]))
            if not left[s]:
                open_.remove(s)
        for stream_id, samples in _decode(fresh, batch_id, chunks, closed).items():
            got[stream_id].append(samples)
        if not waiting and not open_:
            break
    assert not waiting and not open_
    monkeypatch.undo()
    for s, units in spans.items():
        if s not in closed_early:
            np.testing.assert_array_equal(np.concatenate(got[s]), _one_shot(fresh, units, s % 2))
    assert fresh.streams == {} and fresh.slots.num_taken == 0 and fresh.slots.capacity == 16
    assert set(seen) == {("cpu", "cpu")}


def test_a_bad_chunk_fails_its_stream_alone(runner: AudioDecoderRunner) -> None:
    result = runner.run(protocol.DecodeAudio(9, [
        protocol.AudioChunk(5, [1, 2, 64], first=True),  # 64 is past the units
        protocol.AudioChunk(6, [1, 2, 3], first=True),
        protocol.AudioChunk(7, [1, 2, 3]),  # never opened
        protocol.AudioChunk(8, [1, 2, 3], speaker=99, first=True),
    ]))  # fmt: skip
    assert isinstance(result, protocol.AudioDecodeResult)
    errors = {r.stream_id: r.error for r in result.chunks}
    assert "not in [0, 64)" in (errors[5] or "") and errors[6] is None
    assert "not open" in (errors[7] or "") and "speaker 99" in (errors[8] or "")
    assert set(runner.streams) == {6}
    runner.run(protocol.DecodeAudio(10, [], closed=[6]))  # a client that left: closed
    assert runner.streams == {}


def test_a_voice_from_a_recording(runner: AudioDecoderRunner) -> None:
    t = np.arange(16000 * 2) / 16000
    wave = (0.3 * np.sin(2 * np.pi * 220 * t)).astype("<f4")
    reply = runner.run(protocol.EmbedSpeaker(3, wave.tobytes(), 16000))
    assert isinstance(reply, protocol.SpeakerEmbedding) and reply.error is None
    embedding = np.frombuffer(reply.embedding, dtype="<f4")
    assert embedding.shape == (runner.config.speaker_embed_dim,) and np.isfinite(embedding).all()
    samples = _decode(runner, 11, [protocol.AudioChunk(4, [5, 6, 7], speaker_embedding=reply.embedding, first=True, last=True)])[4]
    assert samples.shape == (3 * 960,) and np.abs(samples).max() > 0
    wrong_rate = runner.run(protocol.EmbedSpeaker(4, wave.tobytes(), 24000))
    assert isinstance(wrong_rate, protocol.SpeakerEmbedding) and "16000 Hz" in (wrong_rate.error or "")


# ---------------------------------------------------------------------------------------------
# The published layout: decoder/audio/ with the reference's two .mar archives.


@pytest.fixture(scope="module")
def published(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AudioDecoderRunner]:
    directory = make_tiny_published_audio_decoder(
        tmp_path_factory.mktemp("pub") / "audio", seed=0, num_units=64, voices=("fkms", "mhwj")
    )
    yield AudioDecoderRunner.from_spec(protocol.AudioDecoderWorkerSpec(model_dir=str(directory)), GroupMember(0, 1, None))


def test_published_ready_message(published: AudioDecoderRunner) -> None:
    assert isinstance(published, PublishedAudioDecoderRunner)
    ready = published.ready_message(protocol.AudioDecoderWorkerSpec(model_dir="x"))
    assert (ready.sample_rate, ready.hop, ready.num_units) == (24000, 960, 64)
    assert ready.speakers == ["fkms", "mhwj"] and ready.speaker_encoder and ready.speaker_sample_rate == 24000


def _published_one_shot(runner: PublishedAudioDecoderRunner, units: list[int], speaker: torch.Tensor, zero_shot: bool) -> np.ndarray:
    part = runner.decoder.zero_shot if zero_shot else runner.decoder.named
    assert part is not None
    with torch.inference_mode():
        return part.generator(torch.tensor([units]), speaker[None])[0].numpy()


def test_published_streams_equal_each_span_decoded_at_once(published: AudioDecoderRunner) -> None:
    """Named voice and a recording's voice, in shared batches, chunks of 4, 25, 2 and 3, 9 (an
    empty last chunk too): each stream's samples, joined, are its one-shot decode (worst
    difference measured 0 here: the same lengths reach the same kernels); the held-back look-ahead comes with later chunks."""
    assert isinstance(published, PublishedAudioDecoderRunner)
    t = np.arange(24000) / 24000
    wave = (0.3 * np.sin(2 * np.pi * 220 * t)).astype("<f4")
    reply = published.run(protocol.EmbedSpeaker(1, wave.tobytes(), 24000))
    assert isinstance(reply, protocol.SpeakerEmbedding) and reply.error is None, reply
    rng = np.random.default_rng(0)
    a, b = rng.integers(0, 64, 31).tolist(), rng.integers(0, 64, 12).tolist()
    got: dict[int, list[np.ndarray]] = {1: [], 2: []}
    batches = [
        [protocol.AudioChunk(1, a[:4], speaker=1, first=True)],
        [protocol.AudioChunk(1, a[4:29]), protocol.AudioChunk(2, b[:3], speaker_embedding=reply.embedding, first=True)],
        [protocol.AudioChunk(2, b[3:]), protocol.AudioChunk(1, a[29:], last=True)],
        [protocol.AudioChunk(2, [], last=True)],
    ]
    for i, chunks in enumerate(batches):
        for stream_id, samples in _decode(published, i, chunks).items():
            got[stream_id].append(samples)
    assert got[1][0].size < 4 * 960  # held back
    named = published.decoder.named
    assert named is not None
    voice = named.generator.voice_embedding(torch.tensor([1]))[0]
    embedding = torch.from_numpy(np.frombuffer(reply.embedding, dtype="<f4").copy())
    for stream_id, units, speaker, zero_shot in ((1, a, voice, False), (2, b, embedding, True)):
        streamed = np.concatenate(got[stream_id])
        want = _published_one_shot(published, units, speaker, zero_shot)
        assert streamed.shape == want.shape == (len(units) * 960,)
        assert np.abs(streamed - want).max() < 5e-6
    assert published.streams == {}


def test_published_refusals(published: AudioDecoderRunner) -> None:
    result = published.run(protocol.DecodeAudio(20, [
        protocol.AudioChunk(5, [1, 64], first=True),
        protocol.AudioChunk(6, [1, 2], speaker=7, first=True),
        protocol.AudioChunk(7, [1, 2], speaker_embedding=b"\0" * 12, first=True),
    ]))  # fmt: skip
    assert isinstance(result, protocol.AudioDecodeResult)
    errors = {r.stream_id: r.error or "" for r in result.chunks}
    assert "not in [0, 64)" in errors[5] and "speaker 7" in errors[6] and "16 values, not 3" in errors[7]
    wrong_rate = published.run(protocol.EmbedSpeaker(4, b"\0" * 4000, 16000))
    assert isinstance(wrong_rate, protocol.SpeakerEmbedding) and "24000 Hz" in (wrong_rate.error or "")
