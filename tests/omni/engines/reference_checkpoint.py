"""A published-layout checkpoint of the reference's sizes, made of safetensors headers alone
(no tensor data: the memory plan reads only headers and config.json), for
tests/omni/engines/test_memory_plan.py and tests/omni/cli/test_preflight.py.

    DiT (transformer/, transformer2/)   35 blocks of 1920, MLP 7680, patch 1: DIT_PARAMS each
    token_embedder                      65,536 x 1,536 codebook (+ an unread uncond_embedding)
    vae                                 VAE_DECODER_PARAMS in decoder.* (the encoder.* half unread)
    LLM, encoders                       LLM_PARAMS, ENCODER_PARAMS under their prefixes
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

HIDDEN, MLP, BLOCKS, COND = 1920, 7680, 35, 1536
_BLOCK = {
    "linear1.weight": (3 * HIDDEN + MLP, HIDDEN),
    "linear2.weight": (HIDDEN, HIDDEN + MLP),
    "modulation.lin.weight": (3 * HIDDEN, HIDDEN),
}
DIT_SHAPES = {f"single_blocks.{i}.{name}": shape for i in range(BLOCKS) for name, shape in _BLOCK.items()}
DIT_SHAPES["img_in.weight"] = (HIDDEN, 16 + COND)
DIT_PARAMS = sum(math.prod(s) for s in DIT_SHAPES.values())  # 1,938,339,840: 3.88 GB at bf16
CODEBOOK = (65536, COND)
VAE_DECODER_PARAMS = 84_000_000  # 0.17 GB at bf16
LLM_PARAMS = 6_000_000_000
ENCODER_PARAMS = {"model.vision_model.": 689_000_000, "model.audio_model.": 637_000_000,
                  "model.discrete_vision_model.": 400_000_000, "model.discrete_audio_model.": 124_000_000}


def write_header(path: Path, shapes: dict[str, tuple[int, ...]], dtype: str = "BF16") -> None:
    """A safetensors file's 8-byte length and JSON header; the data it names is not written."""
    size = {"BF16": 2, "F32": 4}[dtype]
    header, offset = {}, 0
    for name, shape in shapes.items():
        end = offset + math.prod(shape) * size
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, end]}
        offset = end
    raw = json.dumps(header).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(raw)) + raw)


def _write_json(path: Path, value: dict[str, object]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value))


def reference_checkpoint(root: Path, *, twin: bool = True) -> Path:
    """The folder, under root; twin=False leaves transformer2 out (no guidance)."""
    _write_json(root / "config.json", {"text_config": {"hidden_size": 4096}})
    shapes = {"model.language_model.model.embed_tokens.weight": (LLM_PARAMS,)}
    shapes |= {prefix + "weight": (n,) for prefix, n in ENCODER_PARAMS.items()}
    write_header(root / "model.safetensors", shapes)
    vision = root / "decoder" / "vision"
    index = {"_class_name": "VisionTokenToImagePipeline", "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "token_embedder": ["pipeline", "VisionTokenEmbedder"], "transformer": ["pipeline", "VisionTransformer"],
             "transformer2": ["pipeline", "VisionTransformer"] if twin else [None, None], "vae": ["diffusers", "AutoencoderKL"]}
    _write_json(vision / "model_index.json", index)
    for name in ("transformer", "transformer2") if twin else ("transformer",):
        _write_json(vision / name / "config.json", {"_class_name": "VisionTransformer", "use_patchify": False})
        write_header(vision / name / "diffusion_pytorch_model.safetensors", DIT_SHAPES)
    _write_json(vision / "token_embedder" / "config.json", {"vocab_size": CODEBOOK[0], "embedding_dim": CODEBOOK[1]})
    write_header(vision / "token_embedder" / "diffusion_pytorch_model.safetensors",
                 {"vocab_embeddings": CODEBOOK, "uncond_embedding": (COND,)})
    _write_json(vision / "vae" / "config.json", {"_class_name": "AutoencoderKL", "block_out_channels": [128, 256, 512, 512]})
    write_header(vision / "vae" / "diffusion_pytorch_model.safetensors",
                 {"decoder.weight": (VAE_DECODER_PARAMS,), "encoder.weight": (34_000_000,)})
    return root
