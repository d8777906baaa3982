"""A GGUF checkpoint (llama.cpp's single-file format) read with the `gguf` package.

One file holds what a HF model directory spreads over config.json, tokenizer.json,
tokenizer_config.json and the safetensors: typed key/value metadata (`llama.block_count`,
`tokenizer.ggml.tokens`, `tokenizer.chat_template`, ...) and the tensors under llama.cpp's
names (`blk.0.attn_q.weight`), most of them quantized in blocks.

The HF config is rebuilt from the metadata as transformers' GGUF loader rebuilds it
(modeling_gguf_pytorch_utils.load_gguf_checkpoint, on transformers' own key map): the server
reads the tokenizer from here and the worker the config and tensors (gpu_workers/llm/gguf_weights.py).
Nothing here imports torch.
"""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Any

SUFFIX = ".gguf"
_MAGIC = b"GGUF"


def is_gguf(path: Path) -> bool:
    """A file that says it is GGUF (its magic), whatever its name."""
    try:
        with Path(path).open("rb") as f:
            return f.read(4) == _MAGIC
    except (IsADirectoryError, FileNotFoundError, PermissionError):
        return False


class GgufFile:
    """The file's metadata and tensor table (memory-mapped: the tensor bytes are read on use)."""

    def __init__(self, path: Path) -> None:
        from gguf import GGUFReader

        self.path = Path(path)
        try:
            self.reader = GGUFReader(self.path)
        except (ValueError, OSError) as e:  # bad magic or version, truncated file
            raise ValueError(f"{self.path}: not a readable GGUF file ({e})") from None

    @cached_property
    def fields(self) -> dict[str, Any]:
        """Every metadata key's value: str, int, float, bool, or a list of them."""
        return {name: field.contents() for name, field in self.reader.fields.items()}

    @property
    def architecture(self) -> str:
        arch = self.fields.get("general.architecture")
        if not isinstance(arch, str):
            raise ValueError(f"{self.path}: no general.architecture in its metadata")  # noqa: TRY004 - a bad file
        return arch

    @cached_property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.reader.tensors)

    def hf_config(self) -> dict[str, Any]:
        """config.json's dict, as transformers' load_gguf_checkpoint builds it: each
        `{arch}.{key}` renamed by transformers' GGUF_CONFIG_MAPPING, the head tied when the file
        has no output.weight, the vocabulary sized by the token list when the file does not say."""
        from transformers.integrations.ggml import GGUF_CONFIG_DEFAULTS_MAPPING, GGUF_CONFIG_MAPPING

        arch = self.architecture
        model_type = arch
        name = self.fields.get("general.name")
        if "llama" in arch and isinstance(name, str) and "mistral" in name:
            model_type = "mistral"  # llama.cpp converts Mistral as llama; transformers tells them apart by name
        if model_type not in GGUF_CONFIG_MAPPING:
            raise ValueError(f"{self.path}: GGUF architecture {arch!r} has no config mapping in transformers")
        config: dict[str, Any] = {"tie_word_embeddings": "output.weight" not in self.tensor_names}
        config |= GGUF_CONFIG_DEFAULTS_MAPPING.get(model_type, {})
        mapping: dict[str, Any] = GGUF_CONFIG_MAPPING
        for key, value in self.fields.items():
            prefix, _, rest = key.partition(".")  # general.*, tokenizer.ggml.*_token_id, {arch}.*
            hf_key = mapping.get(model_type if prefix == arch else prefix, {}).get(rest)
            if hf_key is not None and hf_key != -1 and hf_key != "_model_name_or_path":
                config[hf_key] = value
        config["model_type"] = model_type
        if "vocab_size" not in config and isinstance(self.fields.get("tokenizer.ggml.tokens"), list):
            config["vocab_size"] = len(self.fields["tokenizer.ggml.tokens"])
        return config
