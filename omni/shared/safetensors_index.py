"""A safetensors checkpoint's names, shapes and headers, read as JSON: no torch, no tensor data.

The published omni checkpoint (omni/model_layout.py) is one sharded safetensors set whose keys
carry one prefix per component; the server sizes and fingerprints components from the headers,
and each worker opens only the shards that hold its own prefix (gpu_workers/encoder/component_files.py).
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
# The published checkpoint's key prefixes, per component; a component is present when its first
# prefix is in the index. model.video_audio_compressor. (MambaMia) is known and not served: the
# reference's deployed path never reaches it (a video's soundtrack is ignored there too).
PUBLISHED_PREFIXES: dict[str, tuple[str, ...]] = {
    "llm": ("model.language_model.",),
    "vision_encoder": ("model.vision_model.", "model.mm_projector."),
    "audio_encoder": ("model.audio_model.", "model.audio_projector."),
    "image_tokenizer": ("model.discrete_vision_model.",),
    "audio_tokenizer": ("model.discrete_audio_model.",),
}
UNSERVED_PREFIXES = ("model.video_audio_compressor.",)
# Under image_tokenizer's prefix: TA-Tok's reconstruction half, which the encoder never loads
# (gpu_workers/models/ta_tok.py skips it; omni/engines/memory_plan.py does not count it)
TA_TOK_UNREAD = ("decoder.", "decode_task_layer.", "bottleneck.out_linear.", "scale_layer.", "teacher.")
# Bytes of each tensor's data, from its start and from its end, that go into a published
# component's revision beside the header (see SafetensorsIndex.revision).
_SAMPLE_BYTES = 4096
_REVISION_CHARS = 16  # 64 bits of sha256: plenty to tell revisions apart


def is_published(root: Path) -> bool:
    """The published omni checkpoint: a root config.json nesting text_config, with an index."""
    config = root / "config.json"
    if not config.is_file() or not ((root / INDEX_FILE).is_file() or (root / SINGLE_FILE).is_file()):
        return False
    try:
        raw = json.loads(config.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(raw, dict) and isinstance(raw.get("text_config"), dict)


@dataclass(frozen=True)
class SafetensorsIndex:
    """A safetensors checkpoint's tensor names and headers, read without torch or the data.

    weight_map: tensor name -> shard file name (model.safetensors.index.json's, or every name of
    a single model.safetensors)."""

    root: Path
    weight_map: dict[str, str]

    @classmethod
    def read(cls, root: Path) -> SafetensorsIndex:
        index = root / INDEX_FILE
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text()).get("weight_map")
            except json.JSONDecodeError as e:
                raise ValueError(f"{index}: not valid JSON ({e})") from None
            if not isinstance(weight_map, dict) or not weight_map:
                raise ValueError(f"{index}: no weight_map")
            return cls(root, {str(k): str(v) for k, v in weight_map.items()})
        single = root / SINGLE_FILE
        if single.is_file():
            return cls(root, {name: SINGLE_FILE for name in read_header(single)})
        raise ValueError(f"{root}: neither {INDEX_FILE} nor {SINGLE_FILE} found")

    def has_prefix(self, prefix: str) -> bool:
        return any(name.startswith(prefix) for name in self.weight_map)

    def names(self, prefixes: tuple[str, ...]) -> list[str]:
        return sorted(n for n in self.weight_map if n.startswith(prefixes))

    def shards(self, prefixes: tuple[str, ...]) -> list[str]:
        """The shard files holding any tensor under the prefixes (the only ones a worker opens)."""
        return sorted({self.weight_map[n] for n in self.names(prefixes)})

    @cached_property
    def _headers(self) -> dict[str, dict[str, Any]]:
        return {}

    def header(self, shard: str) -> dict[str, Any]:
        if shard not in self._headers:
            path = self.root / shard
            if not path.is_file():
                raise ValueError(f"{self.root / INDEX_FILE}: shard file not found: {shard}")
            self._headers[shard] = read_header(path)
        return self._headers[shard]

    def shape(self, name: str) -> tuple[int, ...] | None:
        shard = self.weight_map.get(name)
        if shard is None:
            return None
        entry = self.header(shard).get(name)
        return tuple(int(d) for d in entry["shape"]) if entry else None

    def nbytes(self, prefixes: tuple[str, ...]) -> int:
        """Bytes of the tensors under the prefixes, as stored."""
        total = 0
        for name in self.names(prefixes):
            begin, end = self.header(self.weight_map[name])[name]["data_offsets"]
            total += int(end) - int(begin)
        return total

    def revision(self, prefixes: tuple[str, ...]) -> str:
        """A cheap fingerprint of the tensors under the prefixes: each one's name, dtype, shape and
        place in its shard, and its first and last few KiB of data. A retrained checkpoint of the
        same shapes changes every tensor's bytes, so the sampled bytes tell it apart; hashing
        every byte (gigabytes for the real model) at each start would not be cheap."""
        h = hashlib.sha256()
        by_shard: dict[str, list[str]] = {}
        for name in self.names(prefixes):
            by_shard.setdefault(self.weight_map[name], []).append(name)
        for shard, names in sorted(by_shard.items()):
            header = self.header(shard)
            data_start = 8 + _header_length(self.root / shard)
            with (self.root / shard).open("rb") as f:
                for name in names:
                    entry = header.get(name)
                    if entry is None:
                        raise ValueError(f"{self.root / shard}: the index names {name}, the shard lacks it")
                    begin, end = (int(o) for o in entry["data_offsets"])
                    h.update(json.dumps([name, entry["dtype"], entry["shape"], begin, end]).encode())
                    f.seek(data_start + begin)
                    h.update(f.read(min(_SAMPLE_BYTES, end - begin)))
                    if end - begin > _SAMPLE_BYTES:
                        f.seek(data_start + max(begin + _SAMPLE_BYTES, end - _SAMPLE_BYTES))
                        h.update(f.read(end - max(begin + _SAMPLE_BYTES, end - _SAMPLE_BYTES)))
        return h.hexdigest()[:_REVISION_CHARS]


def _header_length(path: Path) -> int:
    with path.open("rb") as f:
        raw = f.read(8)
    if len(raw) != 8:
        raise ValueError(f"{path}: not a safetensors file (shorter than its header length)")
    (length,) = struct.unpack("<Q", raw)
    return int(length)


def read_header(path: Path) -> dict[str, Any]:
    """A safetensors file's header: tensor name -> {dtype, shape, data_offsets} (no metadata)."""
    length = _header_length(path)
    if length > 100 << 20:
        raise ValueError(f"{path}: a {length}-byte safetensors header is not believable")
    with path.open("rb") as f:
        f.seek(8)
        try:
            header = json.loads(f.read(length))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: the safetensors header is not valid JSON ({e})") from None
    header.pop("__metadata__", None)
    return dict(header)
