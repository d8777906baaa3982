"""Every output kind the server knows, in the order a model's outputs are built and started: the
one list the layers above iterate (a new output modality adds its kind here)."""

from __future__ import annotations

from omni.modalities.outputs.audio import AUDIO
from omni.modalities.outputs.image import IMAGE
from omni.modalities.outputs.kind import OutputKind

OUTPUT_KINDS: tuple[OutputKind, ...] = (IMAGE, AUDIO)  # type: ignore[type-arg]
