"""Which components a checkpoint directory holds (omni/model_layout.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni.model_layout import ModelLayout, vision_decoder_guidance


def component(root: Path, name: str) -> Path:
    (root / name).mkdir(parents=True)
    (root / name / "config.json").write_text("{}")
    return root / name


def test_decoders_are_found_by_their_config(tmp_path: Path) -> None:
    component(tmp_path, "llm")
    component(tmp_path, "vision_encoder")
    layout = ModelLayout.from_dir(tmp_path)
    assert (layout.vision_decoder, layout.audio_decoder) == (None, None)
    (tmp_path / "audio_decoder").mkdir()  # a directory without its config is not a component
    assert ModelLayout.from_dir(tmp_path).audio_decoder is None
    (tmp_path / "audio_decoder" / "config.json").write_text("{}")
    layout = ModelLayout.from_dir(tmp_path)
    assert layout.audio_decoder == tmp_path / "audio_decoder" and layout.vision_decoder is None
    assert list(layout.components) == ["vision_encoder"]  # decoders are not encoder components
    component(tmp_path, "vision_decoder")
    assert ModelLayout.from_dir(tmp_path).vision_decoder == tmp_path / "vision_decoder"


def test_a_bare_llm_has_no_decoders(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    layout = ModelLayout.from_dir(tmp_path)
    assert layout.llm_dir == tmp_path and (layout.vision_decoder, layout.audio_decoder) == (None, None)
    with pytest.raises(ValueError, match="is it a checkpoint"):
        ModelLayout.from_dir(tmp_path / "missing")


def test_published_weight_bytes_come_from_the_headers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from gpu_workers.tiny.published import make_tiny_published_checkpoint
    from omni.model_layout import main, weight_bytes
    from omni.shared.safetensors_index import SafetensorsIndex

    root = make_tiny_published_checkpoint(tmp_path / "ckpt")
    sizes = weight_bytes(ModelLayout.from_dir(root))
    index = SafetensorsIndex.read(root)
    stored = sum((root / shard).stat().st_size for shard in set(index.weight_map.values()))
    unserved = index.nbytes(("model.video_audio_compressor.",))
    parts = sum(v for k, v in sizes.items() if not k.endswith("_decoder"))
    assert 0 < stored - parts - unserved < 64 << 10  # the rest is the shards' JSON headers
    main([str(root)])
    assert "published layout" in capsys.readouterr().out


def test_the_image_decoders_guidance_is_read_from_its_json(tmp_path: Path) -> None:
    """As the worker reads it: the published folder guides with transformer2 when its
    model_index.json lists it; ours names it in config.json; what the worker would refuse is "none"."""
    published = tmp_path / "published"
    published.mkdir()
    index = {"transformer": ["pipeline", "VisionTransformer"], "transformer2": ["pipeline", "VisionTransformer"]}
    (published / "model_index.json").write_text(json.dumps(index))
    assert vision_decoder_guidance(published) == "autoguidance"
    (published / "model_index.json").write_text(json.dumps({**index, "transformer2": [None, None]}))
    assert vision_decoder_guidance(published) == "none"
    ours = tmp_path / "ours"
    ours.mkdir()
    for guidance, read in (("cfg", "cfg"), ("autoguidance", "autoguidance"), ("none", "none"), ("weird", "none")):
        (ours / "config.json").write_text(json.dumps({"model_type": "omni_vision_decoder", "guidance": guidance}))
        assert vision_decoder_guidance(ours) == read
    (ours / "config.json").write_text("[not json")
    assert vision_decoder_guidance(ours) == "none"
    assert vision_decoder_guidance(tmp_path / "absent") == "none"
