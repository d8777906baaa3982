"""Reading a vision decoder directory in either layout: the published decoder/vision/ (a
tiny one in its layout) and ours; what the reference could not run is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from gpu_workers.tiny.checkpoints import make_tiny_vision_decoder
from gpu_workers.tiny.published_vision_decoder import make_tiny_published_vision_decoder
from gpu_workers.vision_decoder.layout import DecoderFolder, VisionDecoderConfig

CODEBOOK = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
CPU = torch.device("cpu")


def make(path: Path, use_patchify: bool = True) -> Path:
    return make_tiny_published_vision_decoder(
        path, seed=2, codebook=CODEBOOK, code_grid=(8, 8), use_patchify=use_patchify
    )


def test_both_layouts_read_to_the_same_kind_of_folder(tmp_path: Path) -> None:
    published = DecoderFolder.read(make(tmp_path / "published"), CPU)
    assert published.config == VisionDecoderConfig((8, 8), "autoguidance", 0.75)
    assert torch.equal(published.codebook, CODEBOOK)  # token_embedder's vocab_embeddings
    assert published.weak_dir == tmp_path / "published" / "transformer2"
    assert not published.schedule.use_dynamic_shifting and published.schedule.shift == 3.0

    ours = DecoderFolder.read(make_tiny_vision_decoder(tmp_path / "ours", seed=1, codebook=CODEBOOK), CPU)
    assert ours.config == VisionDecoderConfig((8, 8), "autoguidance", 0.75)
    assert torch.equal(ours.codebook, CODEBOOK)
    assert ours.weak_dir == tmp_path / "ours" / "weak_transformer"


def test_a_folder_the_reference_could_not_run_is_refused(tmp_path: Path) -> None:
    root = make(tmp_path / "vision")
    config_path = root / "scheduler/scheduler_config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "use_dynamic_shifting": True}))
    with pytest.raises(ValueError, match="without mu"):
        DecoderFolder.read(root, torch.device("cpu"))

    root = make(tmp_path / "square")
    embedder_path = root / "token_embedder/config.json"
    embedder = json.loads(embedder_path.read_text())
    embedder_path.write_text(json.dumps({**embedder, "token_length": 60}))
    with pytest.raises(ValueError, match="not a square"):
        DecoderFolder.read(root, torch.device("cpu"))
    embedder_path.write_text(json.dumps({**embedder, "vocab_size": 65}))
    with pytest.raises(ValueError, match="vocab_embeddings"):
        DecoderFolder.read(root, torch.device("cpu"))

    index_path = root / "model_index.json"
    index = json.loads(index_path.read_text())
    del index["token_embedder"]
    index_path.write_text(json.dumps(index))
    with pytest.raises(ValueError, match="no token_embedder"):
        DecoderFolder.read(root, torch.device("cpu"))
