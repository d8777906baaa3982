"""MemoryPlan: what each device will hold once every worker of every model is loaded, from the
checkpoint's files alone (safetensors headers and config.json; no torch, no tensor data), so a
layout that cannot fit is refused before anything starts (omni/cli/preflight.py).

Per device, the sum over every worker placed there (every model, every replica, every rank):

    LLM worker        its weights: parameters x --dtype's bytes (int8: 1 byte; a GGUF file as
                      stored, a lower bound). Its KV cache takes what is left (it is sized
                      last, from the device's free memory: gpu_workers/llm/memory.py), so it
                      is not an item here; its activations are measured by its profile run.
    encoder worker    its components' parameters x the encoder's dtype
    audio decoder     the .mar archives as stored (ours: parameters x the vocoder's dtype)
    image decoder, each of R replicas x G guidance groups (1, or 2 with guidance parallelism)
    x N Ulysses ranks, rank k of a replica (omni/engines/worker_specs.py: DecoderLayout):
      DiT             G = 1: transformer + transformer2 (autoguidance; one DiT for CFG or none)
                      G = 2: its role's DiT alone (k < N: transformer; else transformer2; CFG's
                      two groups both hold the transformer). A Ulysses rank holds the whole DiT.
                      Parameters x the vision decoder's dtype.
      codebook        every rank: num_codes x cond x 4 (kept in float32)
      VAE             rank 0 only: the decoder half's parameters x the VAE's dtype
      activations     the largest batch's widest DiT layer, on every rank:
                        images = min(max_batch_images, max(1, max_batch_tokens // T16))
                        S      = (W / 8p) x (H / 8p)            DiT tokens of one image (patch p)
                        rows   = 2 for CFG's batched passes on one group, else 1
                        DiT    = rows x images x ceil(S / N) x (3h + mlp) x dtype bytes
                      (W x H the size table's largest, T16 its 16-pixel tokens, h the hidden
                      width, mlp the MLP's: linear_in's output, q | k | v | mlp, is the widest);
                      rank 0 also decodes one image with the VAE, after the steps:
                        VAE    = W x H x block_out_channels[0] x VAE dtype bytes
                      and holds max(DiT, VAE).

A device's budget is --gpu-memory-utilization (default 0.9) x its memory; a plan whose sum on
some GPU exceeds it is refused, naming each item. CPU devices are never refused: their plan
is logged.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omni.config import ModelConfig, ServerConfig
from omni.engines.worker_specs import component_dtype, decoder_layout, encoder_device, vision_decoder_devices
from omni.model_layout import ModelLayout, vision_decoder_guidance
from omni.shared.media.image_sizes import PATCH_SCALE, RATIO_SIZES, VAE_SCALE
from omni.shared.safetensors_index import PUBLISHED_PREFIXES, TA_TOK_UNREAD, SafetensorsIndex, read_header

GIB = 1024**3
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9  # gpu_workers/llm/memory.py's, when the flag is not given
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1}
# safetensors' floating dtypes: converted to the component's dtype at load; others kept as stored
_FLOAT_DTYPES = frozenset({"F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2"})

TensorFilter = Callable[[str], bool]


@dataclass(frozen=True, slots=True)
class Item:
    label: str  # what it is and whose: "omni llm weights (worker 0)"
    nbytes: int


@dataclass(slots=True)
class MemoryPlan:
    """device -> what it will hold, in placement order."""

    devices: dict[str, list[Item]] = field(default_factory=dict)

    def add(self, device: str, label: str, nbytes: int) -> None:
        self.devices.setdefault(device, []).append(Item(label, nbytes))

    def total(self, device: str) -> int:
        return sum(item.nbytes for item in self.devices.get(device, ()))

    def table(self, totals: Mapping[str, int] | None = None, utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION) -> str:
        """One line per item and a total per device, in GiB; the budget where the device's
        memory is known."""
        width = max((len(item.label) for items in self.devices.values() for item in items), default=5)
        lines = [f"{'device':<8} {'item':<{width}} {'GiB':>7}"]
        for device, items in self.devices.items():
            lines += [f"{device:<8} {item.label:<{width}} {gib(item.nbytes):>7}" for item in items]
            total = (totals or {}).get(device)
            budget = "" if total is None else f" of {_budget(total, utilization)}"
            lines.append(f"{device:<8} {'total':<{width}} {gib(self.total(device)):>7}{budget}")
        return "\n".join(lines)

    def overfull(self, totals: Mapping[str, int], utilization: float) -> list[str]:
        """A sentence for each GPU whose items exceed utilization x its memory (CPU devices and
        GPUs of unknown memory are never over)."""
        out = []
        for device, items in self.devices.items():
            total = totals.get(device)
            if device == "cpu" or total is None or self.total(device) <= utilization * total:
                continue
            parts = " + ".join(f"{item.label} {gib(item.nbytes)} GiB" for item in items)
            out.append(
                f"{device} cannot hold what is placed on it: {parts} = {gib(self.total(device))} GiB, over "
                f"{_budget(total, utilization)} (--gpu-memory-utilization)"
            )
        return out


def gib(nbytes: int) -> str:
    return f"{nbytes / GIB:.2f}"


def _budget(total: int, utilization: float) -> str:
    return f"{utilization:g} x {gib(total)} = {gib(int(utilization * total))} GiB"


def memory_plan(config: ServerConfig) -> MemoryPlan:
    plan = MemoryPlan()
    for model in config.models:
        add_model(plan, model)
    return plan


def add_model(plan: MemoryPlan, model: ModelConfig) -> None:
    """Every worker of one model, placed as worker_specs places them."""
    llm, worker = model.llm, model.worker
    llm_bytes = llm_weight_bytes(model)
    for i in range(llm.num_workers):
        plan.add(llm.worker_devices[i % len(llm.worker_devices)], f"{model.name} llm weights (worker {i})", llm_bytes)
    if model.encoder_dir is not None:
        device = encoder_device(model)
        nbytes = encoder_weight_bytes(model.encoder_dir, DTYPE_BYTES[component_dtype(worker, "encoder", device)])
        plan.add(device, f"{model.name} encoder weights", nbytes)
    if model.audio_decoder_dir is not None:
        device = model.audio_decoder.device or encoder_device(model)
        itemsize = DTYPE_BYTES[component_dtype(worker, "vocoder", device)]
        plan.add(device, f"{model.name} vocoder weights", vocoder_bytes(model.audio_decoder_dir, itemsize))
    if model.vision_decoder_dir is not None:
        add_image_decoder(plan, model)


def add_image_decoder(plan: MemoryPlan, model: ModelConfig) -> None:
    """R replicas x G guidance groups x N Ulysses ranks, each rank's items (module docstring)."""
    assert model.vision_decoder_dir is not None
    folder = DecoderFiles.read(model.vision_decoder_dir)
    images = model.vision_decoder
    for replica in range(images.replicas):
        devices = vision_decoder_devices(model, replica)
        layout = decoder_layout(len(devices), images.guidance_parallel, folder.guidance)
        n = layout.ulysses_ranks
        # every rank takes rank 0's dtypes (worker_specs.vision_decoder_worker_spec)
        itemsize = DTYPE_BYTES[component_dtype(model.worker, "vision_decoder", devices[0])]
        vae_itemsize = DTYPE_BYTES[component_dtype(model.worker, "vae", devices[0])]
        for rank, device in enumerate(devices):
            who = f"{model.name} image decoder r{replica} rank {rank}"
            for name in folder.dits_of(rank, layout.guidance_groups, n):
                plan.add(device, f"{who}: {name}", folder.dit_params[name] * itemsize)
            plan.add(device, f"{who}: codebook", folder.codebook_params * 4)
            if rank == 0:
                plan.add(device, f"{who}: VAE", folder.vae_params * vae_itemsize)
            rows = 2 if folder.guidance == "cfg" and layout.guidance_groups == 1 else 1
            act = rows * dit_activation_bytes(folder, images.max_batch_images, images.max_batch_tokens, n, itemsize)
            if rank == 0:
                act = max(act, vae_activation_bytes(folder, vae_itemsize))
            plan.add(device, f"{who}: activations", act)


@dataclass(frozen=True, slots=True)
class DecoderFiles:
    """What the image decoder's folder says of its sizes (either layout of
    gpu_workers/vision_decoder/layout.py), read from headers and config.json."""

    guidance: str  # autoguidance | cfg | none
    dit_params: dict[str, int]  # "transformer" / "transformer2" -> its parameters
    codebook_params: int
    vae_params: int
    hidden: int  # the DiT's width, and its MLP's
    mlp: int
    patch: int
    vae_channels: int  # block_out_channels[0]: the full-resolution stage's width

    @classmethod
    def read(cls, path: Path) -> DecoderFiles:
        guidance = vision_decoder_guidance(path)
        published = (path / "model_index.json").is_file()
        dits = {"transformer": folder_params(path / "transformer")}
        if guidance == "autoguidance":
            dits["transformer2"] = folder_params(path / ("transformer2" if published else "weak_transformer"))
        if published:
            codebook = folder_params(path / "token_embedder", lambda n: n == "vocab_embeddings")
        else:
            codebook = folder_params(path, lambda n: n == "codebook", pattern="codebook.safetensors")
        vae = folder_params(path / "vae", lambda n: n.removeprefix("vae.").startswith(("decoder.", "post_quant_conv.")))
        hidden, mlp, patch = dit_widths(_json(path / "transformer" / "config.json"))
        blocks = _json(path / "vae" / "config.json").get("block_out_channels", [128])
        return cls(guidance, dits, codebook, vae, hidden, mlp, patch, int(blocks[0]))

    def dits_of(self, rank: int, guidance_groups: int, ulysses_ranks: int) -> list[str]:
        """The DiTs a rank loads: both without guidance parallelism; with it, its role's (CFG's
        roles both run the transformer)."""
        if guidance_groups == 1 or self.guidance != "autoguidance":
            return list(self.dit_params)
        return ["transformer" if rank < ulysses_ranks else "transformer2"]


def dit_widths(config: Mapping[str, Any]) -> tuple[int, int, int]:
    """(hidden, mlp hidden, patch) from a DiT's config.json in any of the three formats
    gpu_workers/models/flux_dit_formats.py reads (ours, the reference's VisionTransformer,
    diffusers' FluxTransformer2DModel), each format's defaults for keys left out."""
    if config.get("_class_name") == "VisionTransformer":
        hidden, ratio = int(config.get("hidden_size", 1920)), float(config.get("mlp_ratio", 4.0))
        patch = 2 if config.get("use_patchify", False) else 1
    elif "_class_name" in config or "num_single_layers" in config:
        hidden = int(config.get("num_attention_heads", 24)) * int(config.get("attention_head_dim", 128))
        ratio, patch = 4.0, 2
    else:
        hidden, ratio = int(config.get("hidden_size", 1920)), float(config.get("mlp_ratio", 4.0))
        patch = int(config.get("patch", 1))
    return hidden, int(hidden * ratio), patch


def largest_image() -> tuple[int, int]:
    """The size table's largest (width, height), as the worker's profile batch takes it."""
    return max(RATIO_SIZES.values(), key=lambda wh: wh[0] * wh[1])


def dit_activation_bytes(folder: DecoderFiles, max_images: int, max_tokens: int, ranks: int, itemsize: int) -> int:
    """images x ceil(S / N) x (3h + mlp) x dtype bytes, for one pass's rows (module docstring)."""
    width, height = largest_image()
    images = min(max_images, max(1, max_tokens // ((width // PATCH_SCALE) * (height // PATCH_SCALE))))
    side = VAE_SCALE * folder.patch
    tokens = (width // side) * (height // side)
    return images * math.ceil(tokens / ranks) * (3 * folder.hidden + folder.mlp) * itemsize


def vae_activation_bytes(folder: DecoderFiles, itemsize: int) -> int:
    width, height = largest_image()
    return width * height * folder.vae_channels * itemsize


# --- parameters and bytes from the files ----------------------------------------------------


def _entries(headers: Iterable[tuple[str, Mapping[str, Any]]], keep: TensorFilter) -> Iterable[Mapping[str, Any]]:
    return (entry for name, entry in headers if keep(name))


def _params(entry: Mapping[str, Any]) -> int:
    return math.prod(int(d) for d in entry["shape"])


def _as_stored(entry: Mapping[str, Any]) -> int:
    begin, end = entry["data_offsets"]
    return int(end) - int(begin)


def _bytes_at(entries: Iterable[Mapping[str, Any]], itemsize: int) -> int:
    """Floating tensors converted to itemsize bytes an element; the others as stored."""
    return sum(_params(e) * itemsize if e["dtype"] in _FLOAT_DTYPES else _as_stored(e) for e in entries)


def _folder_headers(path: Path, pattern: str = "*.safetensors", recurse: bool = False) -> list[tuple[str, Any]]:
    files = sorted(path.rglob(pattern) if recurse else path.glob(pattern))
    return [item for f in files for item in read_header(f).items()]


def folder_params(path: Path, keep: TensorFilter = lambda name: True, pattern: str = "*.safetensors") -> int:
    """Elements of the folder's tensors that keep() selects."""
    return sum(_params(e) for e in _entries(_folder_headers(path, pattern), keep))


def _index_headers(index: SafetensorsIndex, prefixes: tuple[str, ...]) -> list[tuple[str, Any]]:
    return [(name, index.header(index.weight_map[name])[name]) for name in index.names(prefixes)]


def llm_weight_bytes(model: ModelConfig) -> int:
    """The LLM's parameters at --dtype (1 byte with int8 quantization), or a GGUF file's size."""
    path = model.model_dir
    if path.is_file():
        return path.stat().st_size  # GGUF: as stored (quantized blocks; dequantized it is more)
    itemsize = 1 if model.llm.quantization == "int8" else DTYPE_BYTES[component_dtype(model.worker, "llm", model.llm.device)]
    layout = ModelLayout.from_dir(path)
    if layout.published:
        index = SafetensorsIndex.read(path)
        return _bytes_at(_entries(_index_headers(index, PUBLISHED_PREFIXES["llm"]), lambda n: True), itemsize)
    return _bytes_at(_entries(_folder_headers(path), lambda n: True), itemsize)


def encoder_weight_bytes(root: Path, itemsize: int) -> int:
    """The encoder worker's components (those the checkpoint has) at its dtype."""
    layout = ModelLayout.from_dir(root)
    if layout.published:
        index = SafetensorsIndex.read(root)
        headers = [h for name in layout.components for h in _index_headers(index, PUBLISHED_PREFIXES[name])]
    else:
        headers = [h for path in layout.components.values() for h in _folder_headers(path)]
    return _bytes_at(_entries(headers, _encoder_reads), itemsize)


# the image tokenizer's tensors the encoder worker never loads: not counted
_TA_TOK_UNREAD = tuple(PUBLISHED_PREFIXES["image_tokenizer"][0] + p for p in TA_TOK_UNREAD)


def _encoder_reads(name: str) -> bool:
    return not name.startswith(_TA_TOK_UNREAD)


def vocoder_bytes(path: Path, itemsize: int) -> int:
    """The published .mar archives as stored (their weights are pickled tensors inside a zip);
    ours: every safetensors file under the folder at the vocoder's dtype."""
    archives = sorted(path.glob("*.mar"))
    if archives:
        return sum(a.stat().st_size for a in archives)
    return _bytes_at(_entries(_folder_headers(path, recurse=True), lambda n: True), itemsize)


def _json(path: Path) -> dict[str, Any]:
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return raw if isinstance(raw, dict) else {}
