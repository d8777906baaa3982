from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from gpu_workers.models.unit_vocoder import load_unit_vocoder
from gpu_workers.tiny.checkpoints import (
    TINY_VOICES,
    make_tiny_checkpoint,
    make_tiny_component_checkpoint,
)
from gpu_workers.tiny.published import TINY_CHECKPOINT_VERSION, default_checkpoint_dir
from gpu_workers.vision_decoder.decoder import VisionDecoder
from gpu_workers.vision_decoder.guidance import AutoGuidance
from omni.model_layout import ENCODER_COMPONENTS, ModelLayout, component_revision
from omni.shared import protocol
from tests.gpu_workers.models.test_llama import our_logits

PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "granite"])
def test_loads_in_transformers_with_the_same_logits(tmp_path: Path, model_type: str) -> None:
    from transformers import AutoModelForCausalLM

    d = make_tiny_checkpoint(tmp_path, model_type, num_hidden_layers=1)
    loaded: Any = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
    hf, info = loaded
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        expected = hf.eval()(torch.tensor([PROMPT])).logits[0]
    assert (our_logits(d, PROMPT) - expected).abs().max().item() < 1e-4


def test_deterministic_and_vocab_covers_the_tokenizer(tmp_path: Path) -> None:
    a = make_tiny_checkpoint(tmp_path / "a", seed=3)
    b = make_tiny_checkpoint(tmp_path / "b", seed=3)
    c = make_tiny_checkpoint(tmp_path / "c", seed=4)
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    config = json.loads((a / "config.json").read_text())
    assert config["model_type"] == "hyperclovax" and config["use_post_norm"] is True
    if (a / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        size = Tokenizer.from_file(str(a / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
        assert size <= config["vocab_size"] and config["vocab_size"] % 64 == 0
        assert json.loads((a / "generation_config.json").read_text())["eos_token_id"] == config["eos_token_id"]


def test_hyperclovax_without_post_norm_is_granite(tmp_path: Path) -> None:
    # granite divides the logits by its logits_scaling (2.0), hyperclovax multiplies by its own
    # (0.5): the same halving, bit for bit, since both are powers of two
    granite = make_tiny_checkpoint(tmp_path / "g", "granite")
    hcx = make_tiny_checkpoint(tmp_path / "h", "hyperclovax", use_post_norm=False)
    assert json.loads((granite / "config.json").read_text())["logits_scaling"] == 2.0
    assert json.loads((hcx / "config.json").read_text())["logits_scaling"] == 0.5
    assert load_file(granite / "model.safetensors").keys() == load_file(hcx / "model.safetensors").keys()
    torch.testing.assert_close(our_logits(hcx, PROMPT), our_logits(granite, PROMPT), rtol=0, atol=0)

    peri = make_tiny_checkpoint(tmp_path / "p", "hyperclovax")
    tensors = load_file(peri / "model.safetensors")
    assert "model.layers.1.post_norm2.weight" in tensors
    with_post_norm = our_logits(peri, PROMPT)
    # the same weights with the post-norms dropped
    save_file({k: v for k, v in tensors.items() if ".post_norm" not in k}, peri / "model.safetensors",
              metadata={"format": "pt"})  # fmt: skip
    config = json.loads((peri / "config.json").read_text())
    (peri / "config.json").write_text(json.dumps(config | {"use_post_norm": False}))
    without = our_logits(peri, PROMPT)
    assert torch.isfinite(with_post_norm).all()
    assert (with_post_norm - without).abs().max().item() > 1e-3


def test_default_checkpoint_is_built_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = default_checkpoint_dir(tmp_path)
    weights = d / "model.safetensors.index.json"
    stamp = weights.stat().st_mtime_ns
    assert default_checkpoint_dir(tmp_path) == d
    assert weights.stat().st_mtime_ns == stamp
    layout = ModelLayout.from_dir(d)  # the published layout, as users download the real model
    assert layout.published and layout.llm_dir == d
    assert sorted(layout.components) == sorted(ENCODER_COMPONENTS)
    assert (layout.vision_decoder, layout.audio_decoder) == (d / "decoder" / "vision", d / "decoder" / "audio")
    assert [p.name for p in tmp_path.iterdir()] == [d.name]  # no temp dirs left behind
    # the embedded default: no reasoning block unless asked for, and it says its weights are random
    generation = json.loads((d / "generation_config.json").read_text())
    assert generation["default_chat_template_kwargs"] == {"skip_reasoning": True, "enable_thinking": False}
    assert json.loads((d / "config.json").read_text())["random_weights"] is True
    monkeypatch.setenv("OMNI_SERVE_CACHE", str(tmp_path))
    assert default_checkpoint_dir() == d


def test_omni_checkpoint_is_deterministic_and_revisions_track_weights(tmp_path: Path) -> None:
    a = make_tiny_component_checkpoint(tmp_path / "a")
    b = make_tiny_component_checkpoint(tmp_path / "b")
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file())
    for rel in files:
        assert (a / rel).read_bytes() == (b / rel).read_bytes(), rel
    # the revision in encoder store keys follows the weights, not the directory's path
    assert component_revision(a / "vision_encoder") == component_revision(b / "vision_encoder")
    assert component_revision(a / "vision_encoder") != component_revision(a / "audio_encoder")
    c = make_tiny_component_checkpoint(tmp_path / "c", seed=1)
    assert component_revision(c / "vision_encoder") != component_revision(a / "vision_encoder")


def test_the_omni_checkpoints_decoders_match_its_tokenizers(tmp_path: Path) -> None:
    assert TINY_CHECKPOINT_VERSION == "omni-v7"  # v7: its generation defaults; v6: logits_scaling multiplies; the dialect tokens
    root = make_tiny_component_checkpoint(tmp_path / "omni")
    codebook = load_file(root / "image_tokenizer" / "model.safetensors")["codebook.weight"]
    assert torch.equal(load_file(root / "vision_decoder" / "codebook.safetensors")["codebook"], codebook)
    decoder = VisionDecoder.from_dir(root / "vision_decoder")
    assert decoder.config.code_grid == (8, 8) and decoder.num_codes == 64
    assert (decoder.config.guidance, decoder.config.guidance_scale) == ("autoguidance", 0.75)
    assert isinstance(decoder.guidance, AutoGuidance) and decoder.guidance.weak is not None
    assert decoder.guidance.weak.config.num_layers == 1
    assert decoder.transformer.config.patch == 2
    assert decoder.schedule.use_dynamic_shifting
    job = protocol.ImageJob(1, list(range(64)), 128, 128, 2, seed=0)
    image = decoder.decode([job]).images[0]
    assert image.error is None and image.data.startswith(b"\x89PNG")
    # the audio decoder has one unit per <|audioNNNN|> token of the LLM's vocabulary
    vocab = json.loads((root / "llm" / "tokenizer.json").read_text())["added_tokens"]
    audio_tokens = [t["content"] for t in vocab if re.fullmatch(r"<\|audio\d{4}\|>", t["content"])]
    vocoder = load_unit_vocoder(root / "audio_decoder")
    assert vocoder.config.num_units == len(audio_tokens) == 81 and audio_tokens[-1] == "<|audio0080|>"
    assert vocoder.voices == TINY_VOICES and vocoder.speaker_encoder is not None
