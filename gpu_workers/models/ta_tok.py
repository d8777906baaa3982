"""TA-Tok-style discrete image tokenizer: an image in, grid*grid codebook indices out.

    image -> RGB, resize S x S (PIL bicubic), (x/255 - mean) / std       (B, 3, S, S)
          -> SigLIP tower, hidden_states[feature_layer]                   (B, G*G, hidden)
          -> bottleneck Linear, L2-normalise                              (B, G*G, bottleneck_dim)
          -> nearest row of the L2-normalised codebook by cosine          (B, G*G) codes

The reference model (SigLIP2-so400m-patch14-384, 65,536 x 1536 codebook) gives 27 x 27 = 729
codes, row-major over the patch grid. It samples a code from softmax(cosine / temperature);
here the code is the argmax, ties to the lowest index, so the same image always gives the
same codes. Similarities are float32 whatever dtype the tower runs in, and the codebook is
kept in float32 by from_dir: a near-tie must not flip with the storage precision.

On disk (from_dir): config.json {"model_type": "ta_tok", "vision_config": {...}, "bottleneck_dim",
"codebook_size", "feature_layer", "image_mean", "image_std"} and model.safetensors holding the
tower under "vision_model." (transformers names, as a full SigLIP checkpoint has them),
"bottleneck.weight", "bottleneck.bias" and "codebook.weight" (and "encode_task_layer.0.*" when
the config sets encode_task_layer). A converter from the public TA-Tok folds its codebook
projection into codebook.weight (normalize(embedding_proj(embedding.weight)) is what it
compares against) and moves its tower from "encoder." to "vision_model.".
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file
from torch import nn

from gpu_workers.models.checkpoint_io import load_safetensors, read_json
from gpu_workers.models.hf_weights import load_exact
from gpu_workers.models.siglip_vision import SiglipVisionConfig, SiglipVisionTower, num_layers_for
from gpu_workers.preprocess.image import to_rgb
from omni.shared.safetensors_index import TA_TOK_UNREAD

_TOWER_PREFIX = "vision_model."
# rows of similarities per matmul: 2048 x 65,536 float32 is 512 MiB for the reference codebook
_SIMILARITY_CHUNK = 2048


@dataclass(frozen=True, slots=True)
class TATokConfig:
    vision: SiglipVisionConfig
    bottleneck_dim: int
    codebook_size: int
    feature_layer: int = -2
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # The public TA-Tok applies Linear(hidden, hidden) + Tanh to the SigLIP features before
    # the bottleneck ("encode_task_layer"); converted real checkpoints set this.
    encode_task_layer: bool = False

    @property
    def num_codes(self) -> int:
        return self.vision.num_patches

    @classmethod
    def from_hf(cls, config: Mapping[str, Any]) -> TATokConfig:
        if not isinstance(config, Mapping):
            raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
        if config.get("model_type", "ta_tok") != "ta_tok":
            raise ValueError(f"ta_tok config: model_type is {config['model_type']!r}")
        if "vision_config" not in config:
            raise ValueError("ta_tok config: vision_config is missing")
        vision = SiglipVisionConfig.from_hf(config["vision_config"])

        def require_int(key: str) -> int:
            value = config.get(key)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ta_tok config: {key} must be a positive int, got {value!r}")
            return value

        def triple(key: str) -> tuple[float, float, float]:
            value = config.get(key, (0.5, 0.5, 0.5))
            if len(value) != 3 or (key == "image_std" and min(value) <= 0):
                raise ValueError(f"ta_tok config: {key} must be 3 numbers, got {value!r}")
            return (float(value[0]), float(value[1]), float(value[2]))

        feature_layer = config.get("feature_layer", -2)
        if not isinstance(feature_layer, int) or isinstance(feature_layer, bool):
            raise ValueError(f"ta_tok config: feature_layer must be an int, got {feature_layer!r}")
        num_layers_for(vision, feature_layer)  # raises when out of range
        if vision.num_channels != 3:
            raise ValueError(f"ta_tok config: num_channels is {vision.num_channels}; images are RGB")
        return cls(
            vision=vision,
            bottleneck_dim=require_int("bottleneck_dim"),
            codebook_size=require_int("codebook_size"),
            feature_layer=feature_layer,
            image_mean=triple("image_mean"),
            image_std=triple("image_std"),
            encode_task_layer=bool(config.get("encode_task_layer", False)),
        )


def nearest_code(z: torch.Tensor, codebook: torch.Tensor) -> torch.Tensor:
    """z (M, D) and codebook (K, D), both L2-normalised float32 -> (M,) int64: the row of the
    largest cosine similarity; argmax returns the first maximum, so ties go to the lowest index."""
    return torch.cat([(rows @ codebook.T).argmax(dim=-1) for rows in z.split(_SIMILARITY_CHUNK)])


class TATokImageTokenizer(nn.Module):
    def __init__(self, config: TATokConfig) -> None:
        super().__init__()
        self.config = config
        self.vision_model = SiglipVisionTower(config.vision, config.feature_layer)
        h = config.vision.hidden_size
        self.encode_task_layer = (
            nn.Sequential(nn.Linear(h, h), nn.Tanh()) if config.encode_task_layer else None
        )
        self.bottleneck = nn.Linear(config.vision.hidden_size, config.bottleneck_dim)
        self.codebook = nn.Embedding(config.codebook_size, config.bottleneck_dim)

    @property
    def num_codes(self) -> int:
        return self.config.num_codes

    def preprocess(self, images: list[Image.Image]) -> torch.Tensor:
        """PIL images of any size and mode -> pixel_values (B, 3, S, S) float32."""
        c = self.config
        size = c.vision.image_size
        mean = np.asarray(c.image_mean, dtype=np.float32)[:, None, None]
        std = np.asarray(c.image_std, dtype=np.float32)[:, None, None]
        batch = []
        for image in images:
            image = to_rgb(image)  # alpha composited onto white
            if image.size != (size, size):
                image = image.resize((size, size), resample=Image.Resampling.BICUBIC)
            x = np.asarray(image, dtype=np.float32).transpose(2, 0, 1)  # (3, S, S) in [0, 255]
            batch.append((x * np.float32(1 / 255) - mean) / std)
        return torch.from_numpy(np.stack(batch))

    def features(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values (B, 3, S, S) -> L2-normalised bottleneck features (B, G*G, bottleneck_dim) float32."""
        h = self.vision_model(pixel_values)  # (B, G*G, hidden)
        if self.encode_task_layer is not None:
            h = self.encode_task_layer(h)
        return F.normalize(self.bottleneck(h).float(), dim=-1)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """pixel_values (B, 3, S, S) -> codes (B, G*G) int64 in [0, codebook_size), patches row-major."""
        z = self.features(pixel_values)  # (B, N, D)
        # normalised per call: one pass over K*D floats, small next to the K*D*B*N matmul
        codebook = F.normalize(self.codebook.weight.float(), dim=-1)  # (K, D)
        return nearest_code(z.flatten(0, 1), codebook).view(z.shape[:2])

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a from_dir checkpoint's tensors: the tower under "vision_model." (layers past the
        feature layer and post_layernorm are dropped), bottleneck.* and codebook.weight."""
        self.vision_model.load_hf_state_dict({k: v for k, v in state_dict.items() if k.startswith(_TOWER_PREFIX)})
        rest = {k: v for k, v in state_dict.items() if not k.startswith(_TOWER_PREFIX)}
        # the tower is loaded; check the rest against a view without it
        head = nn.ModuleDict({"bottleneck": self.bottleneck, "codebook": self.codebook})
        if self.encode_task_layer is not None:
            head["encode_task_layer"] = self.encode_task_layer
        load_exact(head, rest, "ta_tok")

    @classmethod
    def from_dir(
        cls, path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
    ) -> TATokImageTokenizer:
        path = Path(path)
        return cls.from_weights(read_json(path / "config.json"), load_safetensors(path), device, dtype)

    @classmethod
    def from_weights(
        cls,
        raw_config: Mapping[str, Any],
        tensors: Mapping[str, torch.Tensor],
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> TATokImageTokenizer:
        config = TATokConfig.from_hf(raw_config)
        with torch.device(device):
            model = cls(config)
        model.load_hf_state_dict(tensors)
        model.to(dtype)
        model.codebook.float()  # see the module docstring: codes must not depend on dtype
        return model.eval()


# ---------------------------------------------------------------------------------------------
# The published checkpoint's TA-Tok (model.discrete_vision_model.*, prefix stripped): the SigLIP
# tower under "encoder.", encode_task_layer, bottleneck.in_linear, and a SimVQ codebook compared
# as normalize(embedding_proj(embedding)), folded once here. Its SigLIP2 decoder, decode task
# layer, out_linear, scale layer (the 0.5 / 0.5 normalisation, also image_mean/std here) and a
# teacher, if shipped, only serve reconstruction and training: not read.

PUBLISHED_IGNORED = TA_TOK_UNREAD
_CODEBOOK = "bottleneck.regularizer.embedding.weight"
_CODEBOOK_PROJ = "bottleneck.regularizer.embedding_proj."
# The tower the reference builds from google/siglip2-so400m-patch14-384's config (not in the
# checkpoint): used when the shapes are those of so400m; other sizes (tiny checkpoints) take the
# image size from the position table and heads of so400m's width 72.
_SO400M = {"hidden_size": 1152, "intermediate_size": 4304, "num_attention_heads": 16, "image_size": 384}
_SIGLIP_HEAD_DIM = 72


def published_config(root: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, Any]:
    """The TATokConfig dict of the published tokenizer, from its tensors' shapes."""
    try:
        hidden, channels, patch, _ = shapes["encoder.embeddings.patch_embedding.weight"]
        positions = shapes["encoder.embeddings.position_embedding.weight"][0]
        intermediate = shapes["encoder.encoder.layers.0.mlp.fc1.weight"][0]
        bottleneck = shapes["bottleneck.in_linear.weight"][0]
        codebook = shapes[_CODEBOOK][0]
    except KeyError as e:
        raise ValueError(f"the published image tokenizer lacks {e.args[0]}") from None
    layers = len({k.split(".")[3] for k in shapes if k.startswith("encoder.encoder.layers.")})
    grid = math.isqrt(positions)
    if grid * grid != positions or hidden % _SIGLIP_HEAD_DIM:
        raise ValueError(f"image tokenizer: {positions} positions / width {hidden} is not a SigLIP tower we know")
    so400m = hidden == _SO400M["hidden_size"] and intermediate == _SO400M["intermediate_size"] and grid == 27
    vision = {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": _SO400M["num_attention_heads"] if so400m else hidden // _SIGLIP_HEAD_DIM,
        "num_channels": channels,
        "image_size": _SO400M["image_size"] if so400m else grid * patch,
        "patch_size": patch,
        "layer_norm_eps": 1e-6,
        "hidden_act": "gelu_pytorch_tanh",
    }
    return {
        "model_type": "ta_tok",
        "vision_config": vision,
        "bottleneck_dim": bottleneck,
        "codebook_size": codebook,
        "feature_layer": -2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
        "encode_task_layer": True,
    }


def published_rename(name: str) -> str | None:
    if name.startswith(PUBLISHED_IGNORED) or name.startswith("bottleneck.regularizer."):
        return None  # the codebook is folded by published_codebook
    if name.startswith("encoder."):
        return _TOWER_PREFIX + name[len("encoder.") :]
    if name.startswith("bottleneck.in_linear."):
        return "bottleneck." + name[len("bottleneck.in_linear.") :]
    return name


def published_codebook(source: Any) -> dict[str, torch.Tensor]:
    """codebook.weight = embedding_proj(embedding.weight), in float32 (normalised at use)."""
    t = source.read([_CODEBOOK, _CODEBOOK_PROJ + "weight", _CODEBOOK_PROJ + "bias"])
    embedding = t[_CODEBOOK].float()
    with torch.no_grad():
        folded = F.linear(embedding, t[_CODEBOOK_PROJ + "weight"].float(), t[_CODEBOOK_PROJ + "bias"].float())
    return {"codebook.weight": folded}


# ---------------------------------------------------------------------------------------------
# A tiny random checkpoint for tests and the CPU path.

_TINY_VISION: dict[str, Any] = {
    "model_type": "siglip_vision_model",
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 3,
    "num_attention_heads": 2,
    "num_channels": 3,
    "image_size": 112,  # 8 x 8 patches of 14 -> 64 codes
    "patch_size": 14,
    "layer_norm_eps": 1e-6,
    "hidden_act": "gelu_pytorch_tanh",
}
# Larger than real models' 0.02 so that attention and the MLPs move the features and the
# codes depend on the image, not mostly on the position embedding.
_TINY_STD = 0.1


def tiny_tensor_shapes(config: TATokConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of a from_dir checkpoint of this config, including what a real SigLIP
    checkpoint carries but the tokenizer drops (the last layers, post_layernorm)."""
    with torch.device("meta"):
        full_tower = SiglipVisionTower(config.vision, feature_layer=-1)
        model = TATokImageTokenizer(config)
    shapes = {_TOWER_PREFIX + k: tuple(t.shape) for k, t in full_tower.state_dict().items()}
    h = config.vision.hidden_size
    shapes |= {f"{_TOWER_PREFIX}post_layernorm.weight": (h,), f"{_TOWER_PREFIX}post_layernorm.bias": (h,)}
    shapes |= {k: tuple(t.shape) for k, t in model.state_dict().items() if not k.startswith(_TOWER_PREFIX)}
    return shapes


def make_tiny_image_tokenizer(out_dir: Path, *, seed: int = 0, codebook_size: int = 64) -> Path:
    """Write config.json + model.safetensors of a tiny random tokenizer; same args, same bytes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    raw: dict[str, Any] = {
        "model_type": "ta_tok",
        "vision_config": dict(_TINY_VISION),
        "bottleneck_dim": 16,
        "codebook_size": codebook_size,
        "feature_layer": -2,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    config = TATokConfig.from_hf(raw)

    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    for name, shape in sorted(tiny_tensor_shapes(config).items()):
        noise = torch.randn(shape, generator=gen)
        if "layer_norm" in name or "layernorm" in name:
            tensors[name] = (1.0 + 0.1 * noise) if name.endswith(".weight") else 0.1 * noise
        elif name.endswith(".bias"):
            tensors[name] = 0.1 * noise
        elif name == "codebook.weight":
            tensors[name] = noise  # only its directions matter
        else:
            tensors[name] = _TINY_STD * noise
    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(raw, indent=2, sort_keys=True) + "\n")
    return out_dir
