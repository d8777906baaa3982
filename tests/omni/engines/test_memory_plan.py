"""The memory plan's arithmetic per layout (replicas, guidance parallelism on and off, Ulysses
ranks), on the tiny checkpoint's real files and on headers of the reference's sizes
(tests/omni/engines/reference_checkpoint.py): what each rank of each replica holds, where."""

from __future__ import annotations

import json
import math
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from omni.cli.options import parse_args, server_config
from omni.config import LLMConfig, ModelConfig, VisionDecoderConfig, WorkerConfig
from omni.engines.memory_plan import MemoryPlan, add_model, memory_plan
from omni.shared.safetensors_index import PUBLISHED_PREFIXES, SafetensorsIndex
from tests.omni.engines.reference_checkpoint import (
    CODEBOOK,
    DIT_PARAMS,
    DIT_SHAPES,
    ENCODER_PARAMS,
    HIDDEN,
    LLM_PARAMS,
    MLP,
    VAE_DECODER_PARAMS,
    reference_checkpoint,
    write_header,
)


def _data_bytes(path: Path) -> int:
    """A safetensors file's data: its size less the 8-byte length and the header."""
    with path.open("rb") as f:
        (length,) = struct.unpack("<Q", f.read(8))
    return path.stat().st_size - 8 - length


def _items(plan: MemoryPlan, device: str) -> dict[str, int]:
    """The image decoder's items on the device, by what they are."""
    return {item.label.split(": ")[-1]: item.nbytes for item in plan.devices[device] if ": " in item.label}


@pytest.fixture(scope="module")
def tiny() -> Path:
    from omni.cli.options import default_model_dir

    return default_model_dir()


def _tiny_plan(tiny: Path, *flags: str) -> MemoryPlan:
    return memory_plan(server_config(parse_args([str(tiny), "--device", "cpu", *flags])))


def test_the_tiny_checkpoints_decoder_on_one_device_holds_both_dits_its_codebook_and_vae(tiny: Path) -> None:
    vision = tiny / "decoder" / "vision"
    # the tiny files are float32 and a --dtype float32 decoder keeps them so: bytes as stored
    plan = _tiny_plan(tiny, "--vision-decoder-devices", "cuda:0", "--dtype", "float32")
    items = _items(plan, "cuda:0")
    assert items["transformer"] == _data_bytes(vision / "transformer" / "diffusion_pytorch_model.safetensors")
    assert items["transformer2"] == _data_bytes(vision / "transformer2" / "diffusion_pytorch_model.safetensors")
    assert items["codebook"] == 64 * 16 * 4  # vocab_size x embedding_dim, float32
    vae = vision / "vae" / "diffusion_pytorch_model.safetensors"
    assert 0 < items["VAE"] < _data_bytes(vae)  # the decoder half alone
    # 8 images of 768 x 768 (32768 // 2304 = 14 > 8), patch 2: 48 x 48 tokens, hidden 32, MLP 64
    assert items["activations"] == 8 * 48 * 48 * (3 * 32 + 64) * 4
    # the LLM, encoder and vocoder stay on the CPU
    assert {item.label.split(" ", 1)[1] for item in plan.devices["cpu"]} == {
        "llm weights (worker 0)", "encoder weights", "vocoder weights"}


def test_bfloat16_halves_the_dits_and_the_codebook_stays_float32(tiny: Path) -> None:
    full = _items(_tiny_plan(tiny, "--vision-decoder-devices", "cuda:0", "--dtype", "float32"), "cuda:0")
    half = _items(_tiny_plan(tiny, "--vision-decoder-devices", "cuda:0", "--dtype", "bfloat16"), "cuda:0")
    assert half["transformer"] * 2 == full["transformer"]
    assert half["activations"] * 2 == full["activations"]
    assert half["codebook"] == full["codebook"]
    named = _items(_tiny_plan(tiny, "--vision-decoder-devices", "cuda:0", "--component-dtype", "vision_decoder=float16"), "cuda:0")
    assert named["transformer"] == half["transformer"]


@pytest.mark.parametrize(
    ("flags", "expect"),
    [
        # 2 replicas x guidance 2 x 1: each replica's rank 0 the transformer and the VAE, rank 1 the twin
        (("--vision-decoder-replicas", "2"),
         {0: {"transformer", "codebook", "VAE", "activations"}, 1: {"transformer2", "codebook", "activations"},
          2: {"transformer", "codebook", "VAE", "activations"}, 3: {"transformer2", "codebook", "activations"}}),
        # 1 replica, guidance 2 x 2 Ulysses: ranks 0, 1 the transformer, ranks 2, 3 the twin
        ((), {0: {"transformer", "codebook", "VAE", "activations"}, 1: {"transformer", "codebook", "activations"},
              2: {"transformer2", "codebook", "activations"}, 3: {"transformer2", "codebook", "activations"}}),
        # guidance parallelism off: 4 Ulysses ranks, each holding both DiTs
        (("--image-guidance-parallel", "off"),
         {0: {"transformer", "transformer2", "codebook", "VAE", "activations"},
          **{k: {"transformer", "transformer2", "codebook", "activations"} for k in (1, 2, 3)}}),
    ],
)
def test_each_rank_holds_its_roles_dit_the_codebook_and_rank_0_the_vae(
    tiny: Path, flags: tuple[str, ...], expect: dict[int, set[str]]
) -> None:
    plan = _tiny_plan(tiny, "--vision-decoder-devices", "cuda:0,cuda:1,cuda:2,cuda:3", *flags)
    assert {k: set(_items(plan, f"cuda:{k}")) for k in range(4)} == expect


def test_ulysses_ranks_split_the_activations_and_replicas_on_one_device_add_up(tiny: Path) -> None:
    one = _items(_tiny_plan(tiny, "--vision-decoder-devices", "cuda:0"), "cuda:0")["activations"]
    off = _tiny_plan(tiny, "--vision-decoder-devices", "cuda:0,cuda:1", "--image-guidance-parallel", "off")
    assert _items(off, "cuda:1")["activations"] == math.ceil(48 * 48 / 2) * 8 * (3 * 32 + 64) * 2
    assert _items(off, "cuda:1")["activations"] * 2 == one
    # no --vision-decoder-devices: every replica is one process on the encoder's device
    shared = memory_plan(server_config(parse_args([str(tiny), "--device", "cpu", "--vision-decoder-replicas", "3"])))
    labels = [item.label for item in shared.devices["cpu"] if item.label.endswith(": transformer")]
    assert len(labels) == 3


def _reference_model(root: Path, devices: int, replicas: int, **images: object) -> ModelConfig:
    return ModelConfig(
        "omni",
        root,
        encoder_dir=root,
        vision_decoder_dir=root / "decoder" / "vision",
        worker=WorkerConfig(dtype="bfloat16"),
        llm=LLMConfig(device="cuda:0"),
        vision_decoder=VisionDecoderConfig(devices=tuple(f"cuda:{i}" for i in range(devices)), replicas=replicas, **images),  # type: ignore[arg-type]
    )


REF_ACT = 8 * 96 * 96 * (3 * HIDDEN + MLP) * 2  # 8 images of 768^2 at patch 1: 9,216 tokens each, bf16


@pytest.mark.parametrize(("devices", "replicas", "ulysses"), [(4, 2, 1), (8, 2, 2), (2, 1, 1)])
def test_the_reference_sizes_per_rank(tmp_path: Path, devices: int, replicas: int, ulysses: int) -> None:
    root = reference_checkpoint(tmp_path)
    plan = MemoryPlan()
    add_model(plan, _reference_model(root, devices, replicas))
    per_replica = devices // replicas
    for d in range(devices):
        rank = d % per_replica
        items = _items(plan, f"cuda:{d}")
        role = "transformer" if rank < ulysses else "transformer2"
        assert items[role] == DIT_PARAMS * 2  # one DiT a rank, at bf16: 3.88 GB
        assert ("transformer2" if role == "transformer" else "transformer") not in items
        assert items["codebook"] == CODEBOOK[0] * CODEBOOK[1] * 4
        assert ("VAE" in items) == (rank == 0)
        assert items["activations"] == REF_ACT // ulysses
    if "VAE" in _items(plan, "cuda:0"):
        assert _items(plan, "cuda:0")["VAE"] == VAE_DECODER_PARAMS * 2
    first = {item.label: item.nbytes for item in plan.devices["cuda:0"]}
    assert first["omni llm weights (worker 0)"] == LLM_PARAMS * 2
    assert first["omni encoder weights"] == sum(ENCODER_PARAMS.values()) * 2


def test_without_guidance_parallelism_a_rank_holds_both_dits(tmp_path: Path) -> None:
    root = reference_checkpoint(tmp_path)
    plan = MemoryPlan()
    add_model(plan, _reference_model(root, 2, 1, guidance_parallel="off"))
    items = _items(plan, "cuda:1")
    assert (items["transformer"], items["transformer2"]) == (DIT_PARAMS * 2, DIT_PARAMS * 2)
    assert items["activations"] == REF_ACT // 2
    # one rank, no twin (no guidance): one DiT, one pass's rows
    bare = reference_checkpoint(tmp_path / "bare", twin=False)
    plan = MemoryPlan()
    add_model(plan, _reference_model(bare, 1, 1))
    assert set(_items(plan, "cuda:0")) == {"transformer", "codebook", "VAE", "activations"}
    assert _items(plan, "cuda:0")["activations"] == REF_ACT


def _cfg_folder(root: Path) -> Path:
    """Our layout with CFG: one DiT of the reference's sizes, its codebook and uncond embedding."""
    write_header(root / "transformer" / "model.safetensors", DIT_SHAPES)
    (root / "transformer" / "config.json").write_text(json.dumps({"hidden_size": HIDDEN, "patch": 1}))
    (root / "config.json").write_text(json.dumps({"model_type": "omni_vision_decoder", "code_grid": [27, 27], "guidance": "cfg"}))
    write_header(root / "codebook.safetensors", {"codebook": CODEBOOK})
    write_header(root / "uncond.safetensors", {"embedding": (CODEBOOK[1],)})
    write_header(root / "vae" / "diffusion_pytorch_model.safetensors", {"decoder.weight": (VAE_DECODER_PARAMS,)})
    (root / "vae" / "config.json").write_text(json.dumps({"block_out_channels": [128, 256, 512, 512]}))
    return root


def test_cfg_batches_both_passes_on_one_group_and_each_group_holds_the_one_dit(tmp_path: Path) -> None:
    root = reference_checkpoint(tmp_path / "ref")
    folder = _cfg_folder(tmp_path / "cfg")
    for parallel, act in (("off", 2 * REF_ACT // 2), ("on", REF_ACT)):
        plan = MemoryPlan()
        add_model(plan, replace(_reference_model(root, 2, 1, guidance_parallel=parallel), vision_decoder_dir=folder))
        for device in ("cuda:0", "cuda:1"):
            items = _items(plan, device)
            assert items["transformer"] == DIT_PARAMS * 2
            assert "transformer2" not in items
            assert items["activations"] == act  # off: 2 rows a job over 2 Ulysses ranks; on: 1 row, 1 rank
        assert _items(plan, "cuda:0")["codebook"] == CODEBOOK[0] * CODEBOOK[1] * 4


def test_the_tiny_checkpoints_llm_encoder_and_vocoder_are_their_tensors_as_the_workers_load_them(tiny: Path) -> None:
    index = SafetensorsIndex.read(tiny)
    plan = _tiny_plan(tiny, "--dtype", "float32")
    held = {item.label.split(" ", 1)[1]: item.nbytes for item in plan.devices["cpu"] if ": " not in item.label}
    assert held["llm weights (worker 0)"] == index.nbytes(PUBLISHED_PREFIXES["llm"])  # stored float32
    encoder = sum(index.nbytes(PUBLISHED_PREFIXES[name]) for name in
                  ("vision_encoder", "audio_encoder", "image_tokenizer", "audio_tokenizer"))
    unread = index.nbytes(tuple("model.discrete_vision_model." + p for p in ("decoder.", "decode_task_layer.", "scale_layer.")))
    assert unread > 0
    assert held["encoder weights"] == encoder - unread - index.nbytes(("model.discrete_vision_model.bottleneck.out_linear.",))
    assert held["vocoder weights"] == sum(f.stat().st_size for f in (tiny / "decoder" / "audio").glob("*.mar"))
    # --llm-workers 2 on the CPU: each worker holds its own copy
    two = _tiny_plan(tiny, "--dtype", "float32", "--llm-workers", "2")
    assert sum("llm weights" in item.label for item in two.devices["cpu"]) == 2
