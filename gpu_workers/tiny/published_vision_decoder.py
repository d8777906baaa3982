"""A tiny random image decoder in the published layout: decoder/vision/ of HyperCLOVAX-SEED-Omni-8B.

The folder the reference loads with VisionTokenToImagePipeline.from_pretrained, file for file:

    model_index.json                     the pipeline class and its five components
    transformer/config.json              VisionTransformer (the reference's __init__ keys)
    transformer/diffusion_pytorch_model.safetensors    the reference's weight names
    transformer2/...                     the weak autoguidance twin: one block instead of two
    token_embedder/config.json           VisionTokenEmbedder {vocab_size, embedding_dim, token_length}
    token_embedder/diffusion_pytorch_model.safetensors  vocab_embeddings (the codebook),
                                         uncond_embedding (random: the reference never reads it)
    vae/config.json + diffusion_pytorch_model.safetensors   a whole AutoencoderKL, encoder too
    scheduler/scheduler_config.json      FlowMatchEulerDiscreteScheduler, static shift

The weight names and shapes are written out here from the reference's modules (section 4 of
the published-checkpoint notes), not derived from our FluxDiT, so that loading this folder
tests our renames. Sizes are small enough for a CPU: hidden 32, 2 heads, 2 blocks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from gpu_workers.tiny.checkpoints import TINY_VAE, _fan_in_tensors

DIFFUSERS_VERSION = "0.32.2"  # the reference's pin (decoder/vision/track_b/requirements.txt)
WEIGHTS_FILE = "diffusion_pytorch_model.safetensors"
LATENT_CHANNELS = 16  # the reference hard-codes the VAE's 16
# The reference's VisionTransformer keys, at CPU sizes; context_in_dim and vec_in_dim come
# from the codebook, in_channels from use_patchify. The weak twin has one block.
TINY_VISION_TRANSFORMER: dict[str, Any] = {
    "hidden_size": 32,
    "num_heads": 2,
    "mlp_ratio": 2.0,
    "depth": 0,
    "depth_single_blocks": 2,
    "axes_dim": [4, 6, 6],
    "theta": 10000,
    "qkv_bias": True,
    "guidance_embed": False,
}
# Static shift: the reference calls set_timesteps(steps) without mu, which diffusers refuses
# with dynamic shifting on, so the published config has it off. 3.0 is Flux's shift (the real
# value is not known).
TINY_PUBLISHED_SCHEDULER: dict[str, Any] = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": DIFFUSERS_VERSION,
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "use_dynamic_shifting": False,
}


def vision_transformer_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """The reference VisionTransformer's state dict: name -> shape (pipeline.py's modules)."""
    d, in_dim = config["hidden_size"], config["in_channels"]
    mlp = int(d * config["mlp_ratio"])
    head_dim = d // config["num_heads"]
    shapes: dict[str, tuple[int, ...]] = {
        "img_in.weight": (d, in_dim + config["context_in_dim"]),
        "img_in.bias": (d,),
        "time_in.in_layer.weight": (d, 256),
        "time_in.in_layer.bias": (d,),
        "time_in.out_layer.weight": (d, d),
        "time_in.out_layer.bias": (d,),
        "vector_in.in_layer.weight": (d, config["vec_in_dim"]),
        "vector_in.in_layer.bias": (d,),
        "vector_in.out_layer.weight": (d, d),
        "vector_in.out_layer.bias": (d,),
        "final_layer.adaLN_modulation.1.weight": (2 * d, d),
        "final_layer.adaLN_modulation.1.bias": (2 * d,),
        "final_layer.linear.weight": (in_dim, d),  # out_channels = in_channels
        "final_layer.linear.bias": (in_dim,),
    }
    for i in range(config["depth_single_blocks"]):
        b = f"single_blocks.{i}."
        shapes |= {
            b + "modulation.lin.weight": (3 * d, d),
            b + "modulation.lin.bias": (3 * d,),
            b + "linear1.weight": (3 * d + mlp, d),
            b + "linear1.bias": (3 * d + mlp,),
            b + "linear2.weight": (d, d + mlp),
            b + "linear2.bias": (d,),
            b + "norm.query_norm.scale": (head_dim,),
            b + "norm.key_norm.scale": (head_dim,),
        }
    return shapes


def autoencoder_kl_shapes(config: dict[str, Any]) -> dict[str, tuple[int, ...]]:
    """diffusers AutoencoderKL's state dict, encoder and decoder, for the configs of Flux's
    family (UpDecoderBlock2D / DownEncoderBlock2D, no quant convs when the config says so)."""
    blocks, layers = list(config["block_out_channels"]), config["layers_per_block"]
    latent, image = config["latent_channels"], config["in_channels"]
    shapes: dict[str, tuple[int, ...]] = {}

    def conv(name: str, out: int, inp: int, k: int = 3) -> None:
        shapes[name + ".weight"], shapes[name + ".bias"] = (out, inp, k, k), (out,)

    def norm(name: str, channels: int) -> None:
        shapes[name + ".weight"], shapes[name + ".bias"] = (channels,), (channels,)

    def resnet(name: str, inp: int, out: int) -> None:
        norm(name + ".norm1", inp)
        conv(name + ".conv1", out, inp)
        norm(name + ".norm2", out)
        conv(name + ".conv2", out, out)
        if inp != out:
            conv(name + ".conv_shortcut", out, inp, 1)

    def mid(prefix: str, channels: int) -> None:
        resnet(prefix + ".mid_block.resnets.0", channels, channels)
        resnet(prefix + ".mid_block.resnets.1", channels, channels)
        if config.get("mid_block_add_attention", True):
            norm(prefix + ".mid_block.attentions.0.group_norm", channels)
            for part in ("to_q", "to_k", "to_v", "to_out.0"):
                shapes[f"{prefix}.mid_block.attentions.0.{part}.weight"] = (channels, channels)
                shapes[f"{prefix}.mid_block.attentions.0.{part}.bias"] = (channels,)

    # encoder: image -> 2 * latent (mean and log-variance)
    conv("encoder.conv_in", blocks[0], image)
    previous = blocks[0]
    for i, channels in enumerate(blocks):
        for j in range(layers):
            resnet(f"encoder.down_blocks.{i}.resnets.{j}", previous if j == 0 else channels, channels)
        if i < len(blocks) - 1:
            conv(f"encoder.down_blocks.{i}.downsamplers.0.conv", channels, channels)
        previous = channels
    mid("encoder", blocks[-1])
    norm("encoder.conv_norm_out", blocks[-1])
    conv("encoder.conv_out", 2 * latent, blocks[-1])
    # decoder: latent -> image, the blocks reversed, one more resnet per block
    conv("decoder.conv_in", blocks[-1], latent)
    mid("decoder", blocks[-1])
    reversed_blocks = blocks[::-1]
    previous = reversed_blocks[0]
    for i, channels in enumerate(reversed_blocks):
        for j in range(layers + 1):
            resnet(f"decoder.up_blocks.{i}.resnets.{j}", previous if j == 0 else channels, channels)
        if i < len(blocks) - 1:
            conv(f"decoder.up_blocks.{i}.upsamplers.0.conv", channels, channels)
        previous = channels
    norm("decoder.conv_norm_out", blocks[0])
    conv("decoder.conv_out", config["out_channels"], blocks[0])
    if config.get("use_quant_conv", True):
        conv("quant_conv", 2 * latent, 2 * latent, 1)
    if config.get("use_post_quant_conv", True):
        conv("post_quant_conv", latent, latent, 1)
    return shapes


def _transformer_tensors(shapes: dict[str, tuple[int, ...]], seed: int) -> dict[str, torch.Tensor]:
    """As _fan_in_tensors, with the reference's RMSNorm `scale`s near 1 (that helper knows
    norm scales by the name `weight`)."""
    tensors = _fan_in_tensors(shapes, seed)
    gen = torch.Generator().manual_seed(seed + 1000)
    for name in sorted(n for n in shapes if n.endswith(".scale")):
        tensors[name] = 1.0 + 0.1 * torch.randn(shapes[name], generator=gen)
    return tensors


def _write_component(folder: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor] | None) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    if tensors is not None:
        save_file(tensors, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})


def make_tiny_published_vision_decoder(
    out_dir: Path,
    *,
    seed: int,
    codebook: torch.Tensor,
    code_grid: tuple[int, int],
    use_patchify: bool = True,
) -> Path:
    """The folder of the module docstring on `codebook` (num_codes, width): the image
    tokenizer's codes index it, as the LLM's <|visionN|> tokens index the published one.

    use_patchify defaults to True, unlike the reference's class: 4x fewer tokens (16x less
    attention) keeps a CPU's 768 x 768 image fast; False is the reference's one token per
    latent pixel. The same seed and arguments give the same bytes."""
    if code_grid[0] != code_grid[1] or code_grid[0] <= 0:
        raise ValueError(f"code_grid {code_grid}: the reference's grid is sqrt(token_length) square")
    if codebook.dim() != 2:
        raise ValueError(f"codebook {tuple(codebook.shape)}: want (num_codes, width)")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    num_codes, width = (int(n) for n in codebook.shape)
    index = {
        "_class_name": "VisionTokenToImagePipeline",
        "_diffusers_version": DIFFUSERS_VERSION,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "token_embedder": ["pipeline", "VisionTokenEmbedder"],
        "transformer": ["pipeline", "VisionTransformer"],
        "transformer2": ["pipeline", "VisionTransformer"],
        "vae": ["diffusers", "AutoencoderKL"],
    }
    (out_dir / "model_index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")

    transformer = {
        "_class_name": "VisionTransformer",
        "_diffusers_version": DIFFUSERS_VERSION,
        **TINY_VISION_TRANSFORMER,
        # with use_patchify the reference's in_channels counts the packed 2 x 2 latent
        "in_channels": 4 * LATENT_CHANNELS if use_patchify else LATENT_CHANNELS,
        "context_in_dim": width,
        "vec_in_dim": width,
        "use_patchify": use_patchify,
    }
    weak = {**transformer, "depth_single_blocks": 1}
    for offset, (name, config) in enumerate((("transformer", transformer), ("transformer2", weak))):
        tensors = _transformer_tensors(vision_transformer_shapes(config), seed + offset)
        _write_component(out_dir / name, config, tensors)

    embedder = {
        "_class_name": "VisionTokenEmbedder",
        "_diffusers_version": DIFFUSERS_VERSION,
        "vocab_size": num_codes,
        "embedding_dim": width,
        "token_length": math.prod(code_grid),
    }
    uncond = torch.randn(1, width, generator=torch.Generator().manual_seed(seed + 2))
    tensors = {"vocab_embeddings": codebook.float().contiguous(), "uncond_embedding": uncond}
    _write_component(out_dir / "token_embedder", embedder, tensors)

    vae = {**TINY_VAE, "_diffusers_version": DIFFUSERS_VERSION}
    # a gentler last convolution, so the image spreads over [-1, 1] without saturating
    tensors = _fan_in_tensors(autoencoder_kl_shapes(vae), seed + 3, {"decoder.conv_out.weight": 0.5})
    _write_component(out_dir / "vae", vae, tensors)

    scheduler_dir = out_dir / "scheduler"
    scheduler_dir.mkdir(parents=True, exist_ok=True)
    text = json.dumps(TINY_PUBLISHED_SCHEDULER, indent=2, sort_keys=True) + "\n"
    (scheduler_dir / "scheduler_config.json").write_text(text)
    return out_dir
