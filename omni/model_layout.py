"""Where a served model's parts live on disk, and the revision that keys its encoder outputs.

Two layouts are served:

    DIR/config.json                  an LLM alone (text only)
    DIR/llm/config.json              an omni checkpoint: one directory per component,
    DIR/vision_encoder/config.json   as a converted reference checkpoint is laid out
    DIR/audio_encoder/ ...           (any encoder may be absent: its inputs are refused)
    DIR/image_tokenizer/ ...
    DIR/audio_tokenizer/ ...
    DIR/vision_decoder/config.json   the image decoder (DiT, weak DiT, VAE, scheduler, codebook)
    DIR/audio_decoder/config.json    the unit vocoder (its weights, voices, speaker encoder)
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

ENCODER_COMPONENTS = ("vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer")
_REVISION_CHARS = 16  # 64 bits of the weights' sha256: plenty to tell revisions apart


@dataclass(frozen=True, slots=True)
class ModelLayout:
    root: Path
    llm_dir: Path
    components: dict[str, Path] = field(default_factory=dict)
    vision_decoder: Path | None = None  # None: the model cannot draw images
    audio_decoder: Path | None = None  # None: the model cannot speak

    @classmethod
    def from_dir(cls, root: Path) -> ModelLayout:
        root = Path(root)
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
        raise ValueError(f"{root} has neither config.json nor llm/config.json; is it a checkpoint?")

    @property
    def has_encoders(self) -> bool:
        return bool(self.components)

    def codebook_sizes(self) -> dict[str, int]:
        """Codes each discrete component can emit, read from its config.json."""
        sizes: dict[str, int] = {}
        for name, path in self.components.items():
            try:
                config = json.loads((path / "config.json").read_text())
                if name == "image_tokenizer":
                    sizes[name] = int(config["codebook_size"])
                elif name == "audio_tokenizer":
                    sizes[name] = math.prod(int(level) for level in config["levels"])
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(f"{path}/config.json: no usable codebook size ({e!r})") from None
        return sizes


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
