"""Worker specs: each crosses the pipe as a protocol message (no pickle), its type names its
worker kind, the ready message it waits for and how logs call it."""

from __future__ import annotations

import pytest

from omni.shared import protocol
from omni.shared.media.limits import MediaLimits

SPECS = [
    protocol.LLMWorkerSpec(worker_id=2, device="cuda:1", model_dir="/m", block_size=8, max_model_len=512,
                           store=protocol.StoreSettings("s3://b/p", "http://minio:9000", "eu")),
    protocol.EncoderWorkerSpec(model_dir="/m", media_limits=MediaLimits(max_items_per_request=3)),
    protocol.VisionDecoderWorkerSpec(model_dir="/m/vd", world_size=2, rank_devices=["cuda:0", "cuda:3"]),
    protocol.AudioDecoderWorkerSpec(model_dir="/m/ad", seed=7),
]  # fmt: skip


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: type(s).__name__)
def test_a_spec_crosses_the_pipe_whole(spec: protocol.WorkerSpec) -> None:
    assert protocol.decode(protocol.encode(spec)) == spec


def test_each_kind_waits_for_its_own_ready_message_and_has_its_label() -> None:
    kinds = [(type(s).READY, type(s).LABEL) for s in SPECS]
    assert kinds == [
        (protocol.LLMReady, "llm worker"),
        (protocol.EncoderReady, "encoder worker"),
        (protocol.VisionDecoderReady, "vision decoder"),
        (protocol.AudioDecoderReady, "audio decoder"),
    ]
    assert len({type(s).TAG for s in SPECS}) == len(SPECS)


def test_a_decoder_group_places_each_rank() -> None:
    spec = protocol.VisionDecoderWorkerSpec(model_dir="/m", device="cuda:0", world_size=2, rank_devices=["cuda:0", "cuda:3"])
    assert [spec.device_of(r) for r in range(2)] == ["cuda:0", "cuda:3"]
    alone = protocol.VisionDecoderWorkerSpec(model_dir="/m", device="cuda:2", world_size=2)
    assert [alone.device_of(r) for r in range(2)] == ["cuda:2", "cuda:2"]


def test_specs_are_frozen_and_keyword_only() -> None:
    spec = protocol.AudioDecoderWorkerSpec(model_dir="/m")
    with pytest.raises(AttributeError):
        spec.model_dir = "/other"  # type: ignore[misc]
    with pytest.raises(TypeError):
        protocol.AudioDecoderWorkerSpec("/m")  # type: ignore[misc]
