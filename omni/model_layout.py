"""Where a served model's parts live on disk, and the revision that keys its encoder outputs.

Three layouts are served:

    DIR/config.json + text_config    the published omni checkpoint, as downloaded: one sharded
    DIR/model.safetensors.index.json safetensors set whose keys carry one prefix per component
    DIR/decoder/vision/model_index.json   (PUBLISHED_PREFIXES), the image decoder as a diffusers
    DIR/decoder/audio/*.mar               folder, the audio decoder as TorchServe archives
    DIR/config.json                  an LLM alone (text only)
    FILE.gguf                        an LLM alone in one GGUF file (text only; omni/shared/gguf_file.py)
    DIR/llm/config.json              an omni checkpoint: one directory per component,
    DIR/vision_encoder/config.json   as a converted reference checkpoint is laid out
    DIR/audio_encoder/ ...           (any encoder may be absent: its inputs are refused)
    DIR/image_tokenizer/ ...
    DIR/audio_tokenizer/ ...
    DIR/vision_decoder/config.json   the image decoder (DiT, weak DiT, VAE, scheduler, codebook)
    DIR/audio_decoder/config.json    the unit vocoder (its weights, voices, speaker encoder)

Nothing here imports torch: the published checkpoint's index and safetensors headers are JSON
(omni/shared/safetensors_index.py).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from omni.shared.gguf_file import is_gguf
from omni.shared.safetensors_index import PUBLISHED_PREFIXES, SafetensorsIndex, is_published

ENCODER_COMPONENTS = ("vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer")
_REVISION_CHARS = 16  # 64 bits of sha256: plenty to tell revisions apart

PUBLISHED_VISION_DECODER = Path("decoder") / "vision"
PUBLISHED_AUDIO_DECODER = Path("decoder") / "audio"


@dataclass(frozen=True, slots=True)
class ModelLayout:
    root: Path
    llm_dir: Path
    components: dict[str, Path] = field(default_factory=dict)
    vision_decoder: Path | None = None  # None: the model cannot draw images
    audio_decoder: Path | None = None  # None: the model cannot speak
    published: bool = False  # one root for every component (PUBLISHED_PREFIXES)

    @classmethod
    def from_dir(cls, root: Path) -> ModelLayout:
        root = Path(root)
        if is_gguf(root):
            return cls(root, root)  # the file stands for the LLM's directory: it holds config, tokenizer and weights
        if is_published(root):
            index = SafetensorsIndex.read(root)
            found = {
                name: root
                for name in ENCODER_COMPONENTS
                if index.has_prefix(PUBLISHED_PREFIXES[name][0])
            }
            if not index.has_prefix(PUBLISHED_PREFIXES["llm"][0]):
                raise ValueError(f"{root}: the index has no {PUBLISHED_PREFIXES['llm'][0]}* tensors (no LLM)")
            vision = root / PUBLISHED_VISION_DECODER
            audio = root / PUBLISHED_AUDIO_DECODER
            return cls(
                root,
                root,
                found,
                vision_decoder=vision if (vision / "model_index.json").is_file() else None,
                audio_decoder=audio if audio.is_dir() and any(audio.glob("*.mar")) else None,
                published=True,
            )
        if (root / "llm" / "config.json").is_file():
            found = {
                name: root / name for name in ENCODER_COMPONENTS if (root / name / "config.json").is_file()
            }
            return cls(
                root,
                root / "llm",
                found,
                vision_decoder=_component(root, "vision_decoder"),
                audio_decoder=_component(root, "audio_decoder"),
            )
        if (root / "config.json").is_file():
            return cls(root, root)
        raise ValueError(f"{root} is not a GGUF file and has neither config.json nor llm/config.json; is it a checkpoint?")

    @property
    def has_encoders(self) -> bool:
        return bool(self.components)

    def codebook_sizes(self) -> dict[str, int]:
        """Codes each discrete component can emit: from its config.json, or for the published
        checkpoint from its tensors' shapes (the codebook's rows; 3 ** the FSQ dimensions)."""
        if self.published:
            return _published_codebook_sizes(SafetensorsIndex.read(self.root), self.components)
        sizes: dict[str, int] = {}
        for name, path in self.components.items():
            try:
                config = json.loads((path / "config.json").read_text())
                if name == "image_tokenizer":
                    sizes[name] = int(config["codebook_size"])
                elif name == "audio_tokenizer":
                    if config.get("model_type") == "s3_tokenizer_v2":
                        continue  # sized by its weights, read by the worker
                    sizes[name] = math.prod(int(level) for level in config["levels"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}/config.json: no usable codebook size ({e!r})") from None
        return sizes

    def revisions(self) -> dict[str, Callable[[], str]]:
        """Per encoder component, how to get the revision that keys its outputs in the store."""
        if self.published:
            index = SafetensorsIndex.read(self.root)
            return {name: partial(index.revision, PUBLISHED_PREFIXES[name]) for name in self.components}
        return {name: partial(component_revision, path) for name, path in self.components.items()}


def _published_codebook_sizes(index: SafetensorsIndex, components: dict[str, Path]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    wanted = {
        "image_tokenizer": "model.discrete_vision_model.bottleneck.regularizer.embedding.weight",
        "audio_tokenizer": "model.discrete_audio_model.quantizer._codebook.project_down.weight",
    }
    for name, key in wanted.items():
        if name not in components:
            continue
        shape = index.shape(key)
        if shape is None or len(shape) != 2:
            raise ValueError(f"{index.root}: {key} is missing or not a matrix; cannot size the {name}'s codes")
        sizes[name] = shape[0] if name == "image_tokenizer" else 3 ** shape[0]
    return sizes


def vision_decoder_guidance(path: Path) -> str:
    """The image decoder's guidance ("autoguidance", "cfg" or "none") from its folder's JSON, as
    the worker will read it (gpu_workers/vision_decoder/layout.py): the published folder guides
    with transformer2 when model_index.json lists it; ours names it in config.json. What the
    worker would refuse reads as "none" here: the worker names the fault at start."""
    try:
        if (path / "model_index.json").is_file():
            entry = json.loads((path / "model_index.json").read_text()).get("transformer2")
            # diffusers writes an absent optional component as [null, null]
            listed = isinstance(entry, list) and len(entry) == 2 and entry[1] is not None
            return "autoguidance" if listed else "none"
        guidance = json.loads((path / "config.json").read_text()).get("guidance")
    except (OSError, ValueError, AttributeError):
        return "none"
    return guidance if guidance in ("autoguidance", "cfg") else "none"


def _component(root: Path, name: str) -> Path | None:
    path = root / name
    return path if (path / "config.json").is_file() else None


def component_revision(component_dir: Path) -> str:
    """A short sha256 of the component's files (configs and weights, in name order).

    Part of every encoder output's store key, so new weights never read old outputs. Reads
    every byte once at start-up (a second or two for a real encoder's weights).
    """
    h = hashlib.sha256()
    for path in sorted(component_dir.iterdir()):
        if path.is_file() and path.suffix in (".json", ".safetensors"):
            h.update(path.name.encode() + b"\0")
            with path.open("rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
    return h.hexdigest()[:_REVISION_CHARS]


def weight_bytes(layout: ModelLayout) -> dict[str, int]:
    """Bytes each part's weights take on disk (as stored: bf16 in the real download), the first
    figure of a memory plan (docs/CHECKPOINT.md)."""
    out: dict[str, int] = {}
    if layout.published:
        index = SafetensorsIndex.read(layout.root)
        out["llm"] = index.nbytes(PUBLISHED_PREFIXES["llm"])
        out |= {name: index.nbytes(PUBLISHED_PREFIXES[name]) for name in layout.components}
    elif layout.llm_dir.is_file():  # GGUF: as stored, most tensors quantized
        out["llm"] = layout.llm_dir.stat().st_size
    else:
        out["llm"] = _folder_bytes(layout.llm_dir, recurse=False)
        out |= {name: _folder_bytes(path) for name, path in layout.components.items()}
    for name, path in (("vision_decoder", layout.vision_decoder), ("audio_decoder", layout.audio_decoder)):
        if path is not None:
            out[name] = _folder_bytes(path)
    return out


def _folder_bytes(path: Path, *, recurse: bool = True) -> int:
    files = path.rglob("*") if recurse else path.glob("*")
    return sum(f.stat().st_size for f in files if f.is_file() and f.suffix in (".safetensors", ".mar", ".bin", ".pt"))


def main(argv: list[str] | None = None) -> None:
    """python -m omni.model_layout DIR: what omni-serve finds in a checkpoint, and its sizes."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m omni.model_layout", description=main.__doc__)
    parser.add_argument("dir", type=Path)
    args = parser.parse_args(argv)
    layout = ModelLayout.from_dir(args.dir)
    kind = "published" if layout.published else ("per-component" if layout.components else "text-only")
    kind += " (GGUF)" if layout.llm_dir.is_file() else ""
    print(f"{layout.root}: {kind} layout")
    for name, size in weight_bytes(layout).items():
        print(f"  {name:<16} {size / 2**20:10.1f} MiB")
    for name, codes in layout.codebook_sizes().items():
        print(f"  {name} codes: {codes}")


if __name__ == "__main__":
    main()
