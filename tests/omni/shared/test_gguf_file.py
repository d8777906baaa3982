"""GgufFile: the HF config a GGUF file's metadata gives, against transformers' own
(load_gguf_checkpoint's config, which AutoConfig.from_pretrained(dir, gguf_file=...) uses for
llama), on SmolLM2-135M-Instruct's file; and which paths are GGUF."""

from __future__ import annotations

from pathlib import Path

import pytest

from omni.shared.gguf_file import GgufFile, is_gguf


def test_hf_config_is_transformers_gguf_config(smollm2_gguf: Path) -> None:
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    ours = GgufFile(smollm2_gguf).hf_config()
    theirs = load_gguf_checkpoint(str(smollm2_gguf), return_tensors=False)["config"]
    theirs.pop("_model_name_or_path")
    assert ours == theirs
    config = AutoConfig.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)
    assert (config.model_type, config.num_hidden_layers, config.hidden_size) == ("llama", 30, 576)
    assert ours["num_key_value_heads"] == config.num_key_value_heads == 3
    assert ours["tie_word_embeddings"] is True


def test_is_gguf_reads_the_magic(tmp_path: Path, smollm2_gguf: Path) -> None:
    assert is_gguf(smollm2_gguf)
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not gguf")
    assert not is_gguf(fake) and not is_gguf(tmp_path) and not is_gguf(tmp_path / "absent.gguf")
    truncated = tmp_path / "cut.gguf"
    truncated.write_bytes(smollm2_gguf.read_bytes()[:4096])
    assert is_gguf(truncated)
    with pytest.raises(ValueError, match="not a readable GGUF file"):
        GgufFile(truncated)
