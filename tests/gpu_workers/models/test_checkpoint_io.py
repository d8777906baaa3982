"""Checkpoint files: a JSON object file, and every tensor of a single or sharded safetensors
checkpoint by its stored name, with an error that names what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from gpu_workers.models.checkpoint_io import INDEX_FILE, SINGLE_FILE, checkpoint_files, load_safetensors, read_json


def test_read_json_reads_an_object_and_names_the_file_when_it_cannot(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"a": 1, "b": [2]}')
    assert read_json(tmp_path / "config.json") == {"a": 1, "b": [2]}
    with pytest.raises(ValueError, match=rf"^{tmp_path}: no missing\.json$"):
        read_json(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{nope")
    with pytest.raises(ValueError, match=r"bad\.json: not valid JSON"):
        read_json(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"list\.json: want a JSON object$"):
        read_json(tmp_path / "list.json")


def test_a_single_file_checkpoint_is_read_whole(tmp_path: Path) -> None:
    save_file({"a": torch.arange(3.0), "b.c": torch.ones(2, 2, dtype=torch.int64)}, str(tmp_path / SINGLE_FILE))
    assert checkpoint_files(tmp_path) == [tmp_path / SINGLE_FILE]
    tensors = load_safetensors(tmp_path)
    assert sorted(tensors) == ["a", "b.c"]
    assert tensors["a"].tolist() == [0.0, 1.0, 2.0]
    assert tensors["b.c"].dtype == torch.int64 and tensors["b.c"].tolist() == [[1, 1], [1, 1]]


def test_a_sharded_checkpoint_reads_each_shard_once(tmp_path: Path) -> None:
    save_file({"a": torch.zeros(1)}, str(tmp_path / "s-2.safetensors"))
    save_file({"b": torch.ones(1), "c": torch.full((1,), 2.0)}, str(tmp_path / "s-1.safetensors"))
    weight_map = {"a": "s-2.safetensors", "b": "s-1.safetensors", "c": "s-1.safetensors"}
    (tmp_path / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    assert checkpoint_files(tmp_path) == [tmp_path / "s-1.safetensors", tmp_path / "s-2.safetensors"]
    assert {k: v.tolist() for k, v in load_safetensors(tmp_path).items()} == {"a": [0.0], "b": [1.0], "c": [2.0]}


@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({INDEX_FILE: "{}"}, "no weight_map"),
        (
            {INDEX_FILE: json.dumps({"weight_map": {"a": "gone.safetensors"}})},
            "shard files not found: gone.safetensors",
        ),
        ({"pytorch_model.bin": ""}, r"only pickle weights \(.bin/.pt\) found"),
        ({"notes.txt": ""}, f"neither {SINGLE_FILE} nor {INDEX_FILE} found"),
    ],
)
def test_what_is_not_a_safetensors_checkpoint_is_named(tmp_path: Path, files: dict[str, str], error: str) -> None:
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError, match=error):
        load_safetensors(tmp_path)
