"""Load a HF-layout checkpoint directory (config.json + safetensors), or a GGUF file, into the
CausalLM that gpu_workers/models/registry.py names for its config.json (model_type, architectures).

Reads model.safetensors or a sharded model.safetensors.index.json; never pickle (.bin). In the
published omni checkpoint the LLM is config.json's text_config and the tensors under
model.language_model. (model.language_model.model.* and .lm_head.*), read from the shards that
hold them only; the other components' tensors are not the LLM's and are never read.
HF names map onto ours by dropping the "model." prefix and stacking q/k/v and gate/up into
the fused MergedLinear rows (the model class's STACKED_PARAMS). Every parameter row range
must be written exactly once; anything missing, unexpected or misshapen is a ValueError.
A GGUF file's tensors arrive under the same HF names, dequantized (gpu_workers/llm/gguf_weights.py).
With quantization "int8" the loaded Linears (but those the model class's INT8_KEEP names) are then
requantized per output channel (gpu_workers/models/int8_linear.py): a GGUF file's Q8_0 or Q4_1
blocks go through the serving dtype on their way to int8.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

from gpu_workers.attention.backend import AttentionBackend
from gpu_workers.llm.gguf_weights import GgufWeights
from gpu_workers.models import gguf_linear
from gpu_workers.models.checkpoint_io import checkpoint_files, read_json
from gpu_workers.models.gguf_linear import GgufLinear
from gpu_workers.models.int8_linear import int8_unavailable, quantize_linears
from gpu_workers.models.registry import CausalLM, CausalLMConfig, MergedLinear, model_class
from gpu_workers.models.registry import read_config as config_from_hf
from omni.shared.gguf_file import is_gguf
from omni.shared.safetensors_index import PUBLISHED_PREFIXES, SafetensorsIndex, is_published

log = logging.getLogger("omni.worker.loader")

QUANTIZATIONS = ("int8", "gguf")
# checkpoint module name -> (the model's fused module, shard index): a CausalLM's STACKED_PARAMS
Stacked = Mapping[str, tuple[str, int]]


def read_config(model_dir: Path) -> CausalLMConfig:
    path = model_dir / "config.json"
    raw = read_json(path)
    published = is_published(model_dir)
    config: Any = raw.get("text_config") if published else raw  # from_hf checks that it is a dict
    try:
        return config_from_hf(config)
    except ValueError as e:
        raise ValueError(f"{path}{' text_config' if published else ''}: {e}") from None


def read_model_config(model_dir: Path) -> CausalLMConfig:
    """The LLM's config alone (the attention backend is chosen from its head shape first)."""
    return GgufWeights(model_dir).config if is_gguf(model_dir) else read_config(model_dir)


def load_model(
    model_dir: Path,
    *,
    device: torch.device,
    dtype: torch.dtype,
    backend: AttentionBackend,
    quantization: str | None = None,
) -> CausalLM:
    """model_dir: a checkpoint directory, or a GGUF file (its weights dequantized to dtype).
    quantization: None, or "int8" for int8 Linear weights with per-channel scales; refused
    (ValueError) before any weight is read where the device has no kernel for it."""
    if quantization is not None:
        problem = (
            f"unknown quantization {quantization!r} (known: {', '.join(QUANTIZATIONS)})"
            if quantization not in QUANTIZATIONS
            else gguf_unavailable(model_dir, device)
            if quantization == "gguf"
            else int8_unavailable(device)
        )
        if problem is not None:
            raise ValueError(problem)
    gguf = GgufWeights(model_dir) if is_gguf(model_dir) else None
    config = gguf.config if gguf is not None else read_config(model_dir)
    # Built on meta, so no memory is spent on a random init that the weights overwrite.
    with torch.device("meta"):
        model = model_class(config)(config, backend)
    model = model.to(dtype).to_empty(device=device)
    if gguf is not None:
        fill_weights(model, gguf.tensors(_hf_names(model)))
    elif is_published(model_dir):
        index = SafetensorsIndex.read(model_dir)
        files = [model_dir / shard for shard in index.shards(PUBLISHED_PREFIXES["llm"])]
        load_weights(model, files, prefix=PUBLISHED_PREFIXES["llm"][0])
    else:
        load_weights(model, checkpoint_files(model_dir))
    if quantization == "int8":
        with torch.no_grad():
            quantize_linears(model, keep=model.INT8_KEEP)
    if quantization == "gguf":
        assert gguf is not None
        keep_gguf_blocks(model, gguf)
    return model.eval()


def gguf_unavailable(model_dir: Path, device: torch.device) -> str | None:
    """Why --quantization gguf cannot serve this model here (a sentence), or None."""
    if not is_gguf(model_dir):
        return f"--quantization gguf keeps a GGUF file's blocks; {model_dir} is not a GGUF file"
    if device.type != "cpu":
        return (
            f"--quantization gguf: no GGUF block kernel on {device.type} here; drop the flag to serve the file "
            "dequantized to --dtype, or add --quantization int8 instead"
        )
    why = gguf_linear.unavailable()
    return None if why is None else f"--quantization gguf: {why}"


def keep_gguf_blocks(model: CausalLM, weights: GgufWeights) -> int:
    """Swap every linear layer whose file tensors are all Q8_0, Q4_0 or Q4_1 blocks of one kind
    (each shard of a fused q|k|v or gate|up) for a GgufLinear on those blocks, and give a tied
    output projection one over the embedding table's blocks (the table itself stays in the
    serving dtype, for the lookup); the rest stay as loaded. Returns how many were swapped."""
    blocks = weights.blocks(_hf_names(model))
    swaps: list[tuple[torch.nn.Module, str, GgufLinear]] = []
    modules = dict(model.named_modules())
    for name, module in modules.items():
        if not isinstance(module, torch.nn.Linear):
            continue
        shards = range(len(module.shard_sizes)) if isinstance(module, MergedLinear) else [None]
        found = [blocks.get(_hf_name(f"{name}.weight", shard, model.STACKED_PARAMS)) for shard in shards]
        if any(f is None for f in found) or len({f[0] for f in found if f is not None}) != 1:
            continue
        raw = torch.cat([f[1] for f in found if f is not None])
        parent, _, child = name.rpartition(".")
        swaps.append((modules[parent], child, GgufLinear(raw, found[0][0], module.in_features, module.bias)))  # type: ignore[index]
    embed = getattr(model, "embed_tokens", None)
    tied = blocks.get("model.embed_tokens.weight")
    if model.config.tie_word_embeddings and getattr(model, "lm_head", 0) is None and tied is not None and embed is not None:
        swaps.append((model, "lm_head", GgufLinear(tied[1], tied[0], embed.embedding_dim)))
    for parent, child, linear in swaps:
        setattr(parent, child, linear)
    kinds = sorted({linear.kind for _, _, linear in swaps})
    log.info("--quantization gguf: %d linear layers kept as GGUF blocks (%s)", len(swaps), ", ".join(kinds) or "none")
    return len(swaps)


def load_weights(model: CausalLM, files: list[Path], *, prefix: str = "") -> None:
    """prefix: only tensors under it are the model's (in the published checkpoint,
    model.language_model.); it is stripped, leaving HF names (model.*, lm_head.weight)."""

    def tensors() -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
        for path in files:
            with safe_open(str(path), framework="pt") as f:
                for stored in f.keys():  # noqa: SIM118 - safe_open is not iterable
                    if stored.startswith(prefix):  # else another component's tensor in a shared shard
                        yield stored[len(prefix) :], partial(f.get_tensor, stored)

    fill_weights(model, tensors(), prefix=prefix)


def fill_weights(
    model: CausalLM, tensors: Iterable[tuple[str, Callable[[], torch.Tensor]]], *, prefix: str = ""
) -> None:
    """Write each (HF name, its tensor's reader) into the model; prefix only names the tensors in
    errors. Every parameter row range must be written once."""
    params = dict(model.named_parameters())
    modules = dict(model.named_modules())
    # (param name, shard index or None) -> not yet written
    pending: set[tuple[str, int | None]] = set()
    for name in params:
        module = modules[name.rsplit(".", 1)[0]]
        if isinstance(module, MergedLinear):
            pending.update((name, i) for i in range(len(module.shard_sizes)))
        else:
            pending.add((name, None))
    unexpected: list[str] = []
    tied = model.config.tie_word_embeddings
    for hf_name, read in tensors:
        if (tied and hf_name == "lm_head.weight") or hf_name.endswith("rotary_emb.inv_freq"):
            continue  # derived, not learned: the tied head is embed_tokens, RoPE is computed
        target = _our_name(hf_name, model.STACKED_PARAMS)
        if target is None or target[0] not in params:
            unexpected.append(hf_name)
            continue
        name, shard = target
        if (name, shard) not in pending:
            raise ValueError(f"{hf_name}: tensor appears twice in the checkpoint")
        _copy(params[name], modules[name.rsplit(".", 1)[0]], shard, read(), prefix + hf_name)
        pending.discard((name, shard))
    if unexpected:
        raise ValueError(f"unexpected tensors in checkpoint: {', '.join(prefix + n for n in sorted(unexpected))}")
    if pending:
        missing = sorted(prefix + _hf_name(name, shard, model.STACKED_PARAMS) for name, shard in pending)
        raise ValueError(f"tensors missing from checkpoint: {', '.join(missing)}")


def _hf_names(model: CausalLM) -> list[str]:
    """The HF name of every tensor the model reads (q/k/v and gate/up apart)."""
    modules = dict(model.named_modules())
    names = []
    for name, _ in model.named_parameters():
        module = modules[name.rsplit(".", 1)[0]]
        shards = range(len(module.shard_sizes)) if isinstance(module, MergedLinear) else [None]
        names += [_hf_name(name, shard, model.STACKED_PARAMS) for shard in shards]
    return names


def _our_name(hf_name: str, stacked: Stacked) -> tuple[str, int | None] | None:
    if hf_name == "lm_head.weight":
        return (hf_name, None)
    if not hf_name.startswith("model."):
        return None
    parts = hf_name[len("model.") :].split(".")
    # layers.N.self_attn.q_proj.weight -> layers.N.self_attn.qkv_proj.weight, shard 0
    if len(parts) >= 2 and parts[-2] in stacked:
        fused, shard = stacked[parts[-2]]
        return (".".join([*parts[:-2], fused, parts[-1]]), shard)
    return (".".join(parts), None)


def _hf_name(name: str, shard: int | None, stacked: Stacked) -> str:
    if name == "lm_head.weight":
        return name
    if shard is not None:
        module, suffix = name.rsplit(".", 1)
        parent, fused = module.rsplit(".", 1)
        hf = next(k for k, v in stacked.items() if v == (fused, shard))
        name = f"{parent}.{hf}.{suffix}"
    return f"model.{name}"


def _copy(
    param: torch.nn.Parameter, module: torch.nn.Module, shard: int | None, tensor: torch.Tensor, hf_name: str
) -> None:
    dest = param.data
    if shard is not None:
        assert isinstance(module, MergedLinear)
        sizes = module.shard_sizes
        start = sum(sizes[:shard])
        dest = dest[start : start + sizes[shard]]  # rows of this shard (weight and bias alike)
    if tensor.shape != dest.shape:
        raise ValueError(f"{hf_name}: shape {tuple(tensor.shape)} does not match expected {tuple(dest.shape)}")
    with torch.no_grad():
        dest.copy_(tensor)
