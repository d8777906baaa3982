"""A component's files from either layout: the published checkpoint's prefixes, stripped and
renamed, read from the shards that hold them only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import gpu_workers.encoder.component_files as component_files
from gpu_workers.encoder.component_files import ComponentFiles, DirFiles, PrefixTensors, PublishedFiles
from omni.shared.safetensors_index import INDEX_FILE, SafetensorsIndex


def _published(root: Path, shards: dict[str, dict[str, torch.Tensor]], config: dict[str, object]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for file, tensors in shards.items():
        save_file(tensors, str(root / file))
        weight_map |= {n: file for n in tensors}
    (root / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps(config))
    return root


def test_prefix_tensors_open_only_the_shards_holding_the_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _published(
        tmp_path,
        {
            "a.safetensors": {"model.language_model.lm_head.weight": torch.ones(2, 2)},
            "b.safetensors": {"model.audio_model.conv1.weight": torch.ones(3), "model.audio_projector.fc1.weight": torch.ones(1)},
        },
        {"text_config": {}},
    )
    opened: list[str] = []
    real = component_files.safe_open

    def spy(path: str, **kwargs: object):  # type: ignore[no-untyped-def]
        opened.append(Path(path).name)
        return real(path, **kwargs)

    monkeypatch.setattr(component_files, "safe_open", spy)
    source = PrefixTensors(SafetensorsIndex.read(root), ("model.audio_model.", "model.audio_projector."))
    # the component's own prefix is stripped; a second prefix keeps its last word
    assert source.keys() == ["audio_projector.fc1.weight", "conv1.weight"]
    assert source.shape("conv1.weight") == (3,)
    got = source.read(source.keys())
    assert set(got) == {"audio_projector.fc1.weight", "conv1.weight"}
    assert opened == ["b.safetensors"]
    with pytest.raises(KeyError):
        source.read(["lm_head.weight"])


def test_published_audio_encoder_files_rename_the_projector(tmp_path: Path) -> None:
    root = _published(
        tmp_path,
        {
            "a.safetensors": {
                "model.audio_model.layer_norm.weight": torch.ones(4),
                "model.audio_projector.fc1.weight": torch.ones(4, 4),
                "model.audio_projector.fc2.weight": torch.ones(6, 4),
            }
        },
        {"text_config": {}, "audio_config": {"d_model": 4}},
    )
    files = ComponentFiles.open(root, "audio_encoder", published=True)
    assert isinstance(files, PublishedFiles)
    assert files.config() == {"d_model": 4, "projector_hidden_size": 6}
    assert set(files.tensors()) == {"layer_norm.weight", "projector.0.weight", "projector.2.weight"}
    assert files.side_json("preprocessor_config.json") is None


def test_a_missing_sub_config_is_named(tmp_path: Path) -> None:
    root = _published(
        tmp_path, {"a.safetensors": {"model.vision_model.x": torch.ones(1), "model.mm_projector.weight": torch.ones(2, 1)}},
        {"text_config": {}},
    )
    with pytest.raises(ValueError, match="vision_config"):
        ComponentFiles.open(root, "vision_encoder", published=True).config()


def test_dir_files_read_a_component_directory(tmp_path: Path) -> None:
    save_file({"w": torch.ones(2)}, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({"a": 1}))
    (tmp_path / "preprocessor_config.json").write_text(json.dumps({"b": 2}))
    files = ComponentFiles.open(tmp_path.parent, tmp_path.name, published=False)
    assert isinstance(files, DirFiles)
    assert files.config() == {"a": 1}
    assert files.side_json("preprocessor_config.json") == {"b": 2}
    assert files.side_json("absent.json") is None
    assert set(files.tensors()) == {"w"}
