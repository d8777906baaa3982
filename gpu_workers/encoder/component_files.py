"""What a component loader reads: its config, its side files and its tensors, from either layout.

    DirFiles        one directory per component (config.json, model.safetensors, side files)
    PublishedFiles  one component of the published checkpoint: its tensors are those under its
                    prefixes (PUBLISHED_PREFIXES), read from the shards that hold them only,
                    renamed to the names the component's module loads; its config is made from
                    the root config.json's sub-config and the tensors' shapes.

A loader sees a component's own tensors and nothing else: `model.vision_model.` is the
Qwen2.5-VL ViT in the published checkpoint while TA-Tok's SigLIP tower sits under
`model.discrete_vision_model.encoder.`, so the outer prefix is stripped before any module's
own name rules see a key. Each published component's adapter lists the tensors it ignores; any
other tensor it does not map is an error, as a missing one is.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from gpu_workers.models import ta_tok
from gpu_workers.models.checkpoint_io import load_safetensors, read_json
from omni.shared.safetensors_index import PUBLISHED_PREFIXES, SafetensorsIndex


class ComponentFiles(ABC):
    """One component's config, side files and tensors."""

    where: Path  # named in error messages

    @abstractmethod
    def config(self) -> dict[str, Any]:
        """The component's config.json (made up for the published checkpoint)."""

    @abstractmethod
    def side_json(self, name: str) -> dict[str, Any] | None:
        """Another JSON file the component reads (preprocessor_config.json), None when absent."""

    @abstractmethod
    def tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor the component loads, by the name its module loads it under."""

    @staticmethod
    def open(root: Path, name: str, *, published: bool) -> ComponentFiles:
        return PublishedFiles(root, name) if published else DirFiles(root / name)


class DirFiles(ComponentFiles):
    def __init__(self, directory: Path) -> None:
        self.where = Path(directory)

    def config(self) -> dict[str, Any]:
        return read_json(self.where / "config.json")

    def side_json(self, name: str) -> dict[str, Any] | None:
        path = self.where / name
        return read_json(path) if path.is_file() else None

    def tensors(self) -> dict[str, torch.Tensor]:
        return load_safetensors(self.where)


class PrefixTensors:
    """The tensors under some prefixes of a (sharded) safetensors checkpoint, prefix stripped.

    Only the shards that hold them are opened, memory-mapped, and only these tensors are read."""

    def __init__(self, index: SafetensorsIndex, prefixes: tuple[str, ...]) -> None:
        self.index = index
        self.prefixes = prefixes
        self._full = {self._strip(n): n for n in index.names(prefixes)}

    def _strip(self, name: str) -> str:
        prefix = next(p for p in self.prefixes if name.startswith(p))
        # the first prefix is the component's own; the others keep their last word
        # (model.mm_projector.weight -> mm_projector.weight) so two prefixes never collide
        if prefix == self.prefixes[0]:
            return name[len(prefix) :]
        return prefix.split(".")[-2] + "." + name[len(prefix) :]

    def keys(self) -> list[str]:
        return sorted(self._full)

    def shape(self, key: str) -> tuple[int, ...]:
        shape = self.index.shape(self._full[key])
        assert shape is not None
        return shape

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: self.shape(k) for k in self.keys()}

    def read(self, keys: Iterable[str]) -> dict[str, torch.Tensor]:
        """The named tensors (stripped names), each shard opened once."""
        by_shard: dict[str, list[str]] = {}
        for key in keys:
            if key not in self._full:
                raise KeyError(key)
            by_shard.setdefault(self.index.weight_map[self._full[key]], []).append(key)
        out: dict[str, torch.Tensor] = {}
        for shard, shard_keys in sorted(by_shard.items()):
            with safe_open(str(self.index.root / shard), framework="pt") as f:
                for key in shard_keys:
                    out[key] = f.get_tensor(self._full[key])
        return out


@dataclass(frozen=True, slots=True)
class Adapter:
    """How one published component becomes what its module loads."""

    # (root config, shapes by stripped name) -> the component's config.json
    config: Callable[[Mapping[str, Any], Mapping[str, tuple[int, ...]]], dict[str, Any]]
    rename: Callable[[str], str | None]  # stripped name -> module name; None: ignored
    # (stripped name -> tensor) -> extra tensors computed at load (e.g. a folded codebook)
    derive: Callable[[PrefixTensors], dict[str, torch.Tensor]] | None = None
    side_files: tuple[str, ...] = ()  # root files the component reads as they are


class PublishedFiles(ComponentFiles):
    def __init__(self, root: Path, name: str) -> None:
        if name not in ADAPTERS:
            raise ValueError(f"{root}: omni-serve cannot load the published checkpoint's {name}")
        self.where = Path(root)
        self.name = name
        self.adapter = ADAPTERS[name]
        self.source = PrefixTensors(SafetensorsIndex.read(self.where), PUBLISHED_PREFIXES[name])
        self._root_config = read_json(self.where / "config.json")

    def config(self) -> dict[str, Any]:
        return self.adapter.config(self._root_config, self.source.shapes())

    def side_json(self, name: str) -> dict[str, Any] | None:
        path = self.where / name
        if name not in self.adapter.side_files or not path.is_file():
            return None
        return read_json(path)

    def tensors(self) -> dict[str, torch.Tensor]:
        wanted = {key: new for key in self.source.keys() if (new := self.adapter.rename(key)) is not None}
        read = self.source.read(wanted)
        out = {wanted[k]: t for k, t in read.items()}
        if len(out) != len(read):
            raise ValueError(f"{self.where}: two of the {self.name}'s tensors map to one name")
        if self.adapter.derive is not None:
            out.update(self.adapter.derive(self.source))
        return out


def sub_config(root_config: Mapping[str, Any], key: str) -> dict[str, Any]:
    value = root_config.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"config.json: the published checkpoint's {key} is missing or not an object")
    return dict(value)


def _rename_prefix(table: Mapping[str, str]) -> Callable[[str], str | None]:
    """A rename of leading name parts: a name starting with a key of table gets its value instead;
    any other name is kept."""

    def rename(name: str) -> str | None:
        for old, new in table.items():
            if name.startswith(old):
                return new + name[len(old) :]
        return name

    return rename


def _vision_encoder_config(root: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    projector = shapes.get("mm_projector.weight")
    if projector is None:
        raise ValueError("the published vision encoder has no model.mm_projector.weight")
    return {**sub_config(root, "vision_config"), "projector_hidden_size": int(projector[0])}


def _audio_encoder_config(root: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    fc2 = shapes.get("audio_projector.fc2.weight")
    if fc2 is None:
        raise ValueError("the published audio encoder has no model.audio_projector.fc2.weight")
    return {**sub_config(root, "audio_config"), "projector_hidden_size": int(fc2[0])}


# How each published encoder component becomes what its module loads.
ADAPTERS: dict[str, Adapter] = {
    "vision_encoder": Adapter(
        config=_vision_encoder_config,
        rename=_rename_prefix({"mm_projector.": "projector."}),
        side_files=("preprocessor_config.json",),
    ),
    "audio_encoder": Adapter(
        config=_audio_encoder_config,
        rename=_rename_prefix({"audio_projector.fc1.": "projector.0.", "audio_projector.fc2.": "projector.2."}),
    ),
    "image_tokenizer": Adapter(
        config=ta_tok.published_config, rename=ta_tok.published_rename, derive=ta_tok.published_codebook
    ),
    # CosyVoice2's S3TokenizerV2: its names are the module's own, its sizes its tensors' shapes
    "audio_tokenizer": Adapter(config=lambda root, shapes: {"model_type": "s3_tokenizer_v2"}, rename=lambda n: n),
}
