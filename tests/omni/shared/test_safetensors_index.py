"""The published checkpoint's index and headers, read as JSON, and the cheap component revision."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from omni.shared.safetensors_index import INDEX_FILE, SafetensorsIndex, is_published, read_header


def _checkpoint(root: Path, tensors: dict[str, torch.Tensor], shards: dict[str, list[str]]) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for file, names in shards.items():
        save_file({n: tensors[n] for n in names}, str(root / file))
        weight_map |= {n: file for n in names}
    (root / INDEX_FILE).write_text(json.dumps({"weight_map": weight_map}))
    (root / "config.json").write_text(json.dumps({"text_config": {}}))
    return root


TENSORS = {
    "model.language_model.model.embed_tokens.weight": torch.arange(40_000, dtype=torch.float32).view(400, 100),
    "model.vision_model.blocks.0.norm1.weight": torch.ones(8),
    "model.mm_projector.weight": torch.zeros(4, 8),
}
SHARDS = {
    "model-00001-of-00002.safetensors": ["model.language_model.model.embed_tokens.weight"],
    "model-00002-of-00002.safetensors": ["model.vision_model.blocks.0.norm1.weight", "model.mm_projector.weight"],
}
VISION = ("model.vision_model.", "model.mm_projector.")


def test_index_names_shapes_and_shards(tmp_path: Path) -> None:
    index = SafetensorsIndex.read(_checkpoint(tmp_path, TENSORS, SHARDS))
    assert is_published(tmp_path)
    assert index.has_prefix("model.vision_model.") and not index.has_prefix("model.audio_model.")
    assert index.names(VISION) == ["model.mm_projector.weight", "model.vision_model.blocks.0.norm1.weight"]
    assert index.shards(VISION) == ["model-00002-of-00002.safetensors"]
    assert index.shape("model.language_model.model.embed_tokens.weight") == (400, 100)
    assert index.shape("model.nothing") is None
    header = read_header(tmp_path / "model-00002-of-00002.safetensors")
    assert header["model.mm_projector.weight"]["shape"] == [4, 8]


def test_a_single_file_checkpoint_is_its_own_index(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    save_file(TENSORS, str(tmp_path / "model.safetensors"))
    index = SafetensorsIndex.read(tmp_path)
    assert set(index.weight_map) == set(TENSORS)
    assert set(index.weight_map.values()) == {"model.safetensors"}


def test_revision_follows_the_component_s_own_bytes_only(tmp_path: Path) -> None:
    base = SafetensorsIndex.read(_checkpoint(tmp_path / "a", TENSORS, SHARDS))
    same = SafetensorsIndex.read(_checkpoint(tmp_path / "b", TENSORS, SHARDS))
    assert base.revision(VISION) == same.revision(VISION)
    assert base.revision(VISION) != base.revision(("model.language_model.",))
    # another component's weights change: this one's revision does not
    llm_changed = {**TENSORS, "model.language_model.model.embed_tokens.weight": -TENSORS[
        "model.language_model.model.embed_tokens.weight"]}
    other = SafetensorsIndex.read(_checkpoint(tmp_path / "c", llm_changed, SHARDS))
    assert other.revision(VISION) == base.revision(VISION)
    assert other.revision(("model.language_model.",)) != base.revision(("model.language_model.",))
    # a retrained tensor of the same shape: its sampled bytes change the revision
    retrained = {**TENSORS, "model.vision_model.blocks.0.norm1.weight": torch.full((8,), 1.5)}
    changed = SafetensorsIndex.read(_checkpoint(tmp_path / "d", retrained, SHARDS))
    assert changed.revision(VISION) != base.revision(VISION)


def test_revision_reads_headers_and_a_few_kib_not_the_data(tmp_path: Path) -> None:
    big = {"model.vision_model.w": torch.zeros(4 << 20, dtype=torch.uint8)}  # 4 MiB of data
    index = SafetensorsIndex.read(_checkpoint(tmp_path, big, {"model.safetensors": ["model.vision_model.w"]}))
    reads: list[int] = []
    real_open = Path.open

    def counting_open(self: Path, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        f = real_open(self, *args, **kwargs)  # type: ignore[arg-type]
        real_read = f.read

        def read(n: int = -1) -> bytes:
            data = real_read(n)
            reads.append(len(data))
            return data

        f.read = read  # type: ignore[method-assign]
        return f

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(Path, "open", counting_open)
        index.revision(("model.vision_model.",))
    assert 0 < sum(reads) < 64 << 10


def test_a_torn_header_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(ValueError, match="not believable"):
        read_header(tmp_path / "model.safetensors")
    (tmp_path / "model.safetensors").write_bytes(b"abc")
    with pytest.raises(ValueError, match="not a safetensors file"):
        read_header(tmp_path / "model.safetensors")
