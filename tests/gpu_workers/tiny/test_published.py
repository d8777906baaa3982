"""The tiny checkpoint in the published layout: deterministic, laid out as the download is, and
every part of it loads through the paths real users take."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
import torch

from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.encoder.component_files import ComponentFiles
from gpu_workers.encoder.components import Component
from gpu_workers.llm.loader import load_model
from gpu_workers.tiny.published import TINY_S3_FSQ_DIMS, TINY_TA_TOK, make_tiny_published_checkpoint
from omni.model_layout import ModelLayout
from omni.shared.safetensors_index import INDEX_FILE, PUBLISHED_PREFIXES, UNSERVED_PREFIXES

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_published_checkpoint(tmp_path_factory.mktemp("published") / "ckpt")


def _digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_same_seed_same_bytes(checkpoint: Path, tmp_path: Path) -> None:
    assert _digest(make_tiny_published_checkpoint(tmp_path / "again")) == _digest(checkpoint)


def test_laid_out_as_the_download(checkpoint: Path) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    assert {"text_config", "vision_config", "audio_config"} <= set(config)
    assert config["text_config"]["model_type"] == "hyperclovax"
    weight_map = json.loads((checkpoint / INDEX_FILE).read_text())["weight_map"]
    prefixes = {p for group in PUBLISHED_PREFIXES.values() for p in group} | set(UNSERVED_PREFIXES)
    assert all(name.startswith(tuple(prefixes)) for name in weight_map)
    # the LLM and the encoders share shards, as in the real download
    shards = {f: {n.split(".")[1] for n, g in weight_map.items() if g == f} for f in set(weight_map.values())}
    assert len(shards) == 2 and all(len(parts) > 1 for parts in shards.values())
    assert "model.language_model.lm_head.weight" in weight_map
    assert "model.discrete_vision_model.encoder.encoder.layers.0.self_attn.q_proj.weight" in weight_map
    assert (checkpoint / "tokenizer.json").is_file() and (checkpoint / "preprocessor_config.json").is_file()


def test_layout_sees_every_served_component(checkpoint: Path) -> None:
    layout = ModelLayout.from_dir(checkpoint)
    assert layout.published and layout.llm_dir == checkpoint
    assert layout.vision_decoder == checkpoint / "decoder" / "vision"
    assert set(layout.components) == {"vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer"}
    assert layout.codebook_sizes() == {"image_tokenizer": TINY_TA_TOK["codes"], "audio_tokenizer": 3**TINY_S3_FSQ_DIMS}
    revisions = {name: read() for name, read in layout.revisions().items()}
    assert len(set(revisions.values())) == len(revisions)


def test_the_llm_and_each_encoder_load(checkpoint: Path) -> None:
    model = load_model(checkpoint, device=CPU, dtype=torch.float32, backend=TorchSDPABackend(4, CPU))
    assert model.config.model_type == "hyperclovax"
    for name in ("vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer"):
        Component.create(name, ComponentFiles.open(checkpoint, name, published=True), CPU, torch.float32)


def test_the_image_tokenizer_folds_its_codebook(checkpoint: Path) -> None:
    from safetensors import safe_open

    files = ComponentFiles.open(checkpoint, "image_tokenizer", published=True)
    tensors = files.tensors()
    assert not any(k.startswith(("decoder.", "decode_task_layer.", "scale_layer.")) for k in tensors)
    index = json.loads((checkpoint / INDEX_FILE).read_text())["weight_map"]
    raw = {}
    for key in ("embedding.weight", "embedding_proj.weight", "embedding_proj.bias"):
        full = "model.discrete_vision_model.bottleneck.regularizer." + key
        with safe_open(str(checkpoint / index[full]), framework="pt") as f:
            raw[key] = f.get_tensor(full)
    expected = raw["embedding.weight"] @ raw["embedding_proj.weight"].T + raw["embedding_proj.bias"]
    torch.testing.assert_close(tensors["codebook.weight"], expected)
