"""The device flags read back: normalised, checked, and `auto` resolved, without torch.

    --device                    auto | cpu | cuda | cuda:N   (auto: cuda:0 when a GPU is visible)
    --devices                   a list, all cpu or distinct cuda:N
    --vision-decoder-devices    a list, all cpu (cpu,cpu is a CPU Ulysses group) or distinct cuda:N
    --encoder-device, --audio-decoder-device    cpu | cuda | cuda:N

`cuda` means `cuda:0` (review A2: torch.cuda.set_device refuses a device without an index).
A list mixing cpu with cuda is refused (one rank's CPU in an NCCL group, review A9), and so is
a GPU named twice (NCCL refuses two ranks on one GPU; two LLM workers on one GPU cannot size
their KV caches, review A4: --llm-workers places several on the listed devices instead).

Which GPUs exist is a question for the start (`check_present`), not for reading the flags:
a config is also built, and tested, on machines without the GPUs it names. The server never
imports torch, so the GPUs are counted from the driver: CUDA_VISIBLE_DEVICES narrows what
/proc/driver/nvidia/gpus (or `nvidia-smi -L`) lists.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

_DEVICE = re.compile(r"(cpu|cuda)(?::(\d+))?")
_PROC_GPUS = Path("/proc/driver/nvidia/gpus")


class DeviceError(ValueError):
    """A device flag names something omni-serve cannot run on; the message names the flag."""


def normalise(text: str, flag: str) -> str:
    """"cuda" -> "cuda:0", "cuda:01" -> "cuda:1", "cpu" -> "cpu"; anything else is refused."""
    match = _DEVICE.fullmatch(text.strip().lower())
    if match is None or (match[1] == "cpu" and match[2] is not None):
        raise DeviceError(f"{flag} {text!r}: a device is cpu, cuda or cuda:N")
    return "cpu" if match[1] == "cpu" else f"cuda:{int(match[2] or 0)}"


def normalise_list(devices: Iterable[str], flag: str) -> tuple[str, ...]:
    """Each normalised; all cpu, or distinct GPUs."""
    out = tuple(normalise(d, flag) for d in devices)
    gpus = [d for d in out if d != "cpu"]
    if gpus and len(gpus) != len(out):
        raise DeviceError(f"{flag} {','.join(out)}: cpu and cuda devices cannot be mixed in one list")
    twice = sorted({d for d in gpus if gpus.count(d) > 1})
    if twice:
        raise DeviceError(f"{flag} {','.join(out)}: {', '.join(twice)} is named more than once")
    return out


def resolve(text: str, flag: str, gpus: int) -> str:
    """`auto` (the --device default) is cuda:0 when a GPU is visible, else cpu."""
    if text.strip().lower() == "auto":
        return "cuda:0" if gpus > 0 else "cpu"
    return normalise(text, flag)


def check_present(devices: Iterable[tuple[str, str]], gpus: int) -> None:
    """Each (flag, device) on a GPU this machine shows; raise DeviceError naming the first not."""
    for flag, device in devices:
        if device == "cpu":
            continue
        index = int(device.split(":", 1)[1])
        if index >= gpus:
            seen = f"{gpus} GPU{'' if gpus == 1 else 's'} (cuda:0..cuda:{gpus - 1})" if gpus else "no GPU"
            raise DeviceError(f"{flag} {device}: this machine shows {seen}{_visible_note()}")


def _visible_note() -> str:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    return "" if value is None else f" (CUDA_VISIBLE_DEVICES={value!r})"


def visible_gpus() -> int:
    """How many CUDA devices a worker would see: the driver's GPUs, narrowed by
    CUDA_VISIBLE_DEVICES as CUDA reads it (up to its first entry that is not a device)."""
    installed = _installed_gpus()
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return installed
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break  # "" or "-1": CUDA stops here (an index or a GPU-/MIG- uuid otherwise)
        count += 1
    return min(count, installed)


def _installed_gpus() -> int:
    try:
        return sum(1 for entry in _PROC_GPUS.iterdir() if entry.is_dir())
    except OSError:
        pass  # no NVIDIA driver here, or a /proc without it: ask nvidia-smi if there is one
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def gpu_memory() -> dict[str, int]:
    """Each visible GPU's memory in bytes, as "cuda:N" -> bytes, from `nvidia-smi
    --query-gpu=index,uuid,memory.total` (MiB), N counted as CUDA_VISIBLE_DEVICES renumbers them
    (an entry is an index or a GPU- uuid prefix; a MIG- entry, whose share nvidia-smi does not
    list here, is left out, as is everything when nvidia-smi is missing: unknown memory is not
    checked). nvidia-smi orders GPUs by PCI bus, as CUDA does under CUDA_DEVICE_ORDER=PCI_BUS_ID;
    CUDA's default order differs only between GPUs of different speeds."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {}
    query = [smi, "--query-gpu=index,uuid,memory.total", "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(query, capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return visible_memory(out.stdout, os.environ.get("CUDA_VISIBLE_DEVICES"))


def visible_memory(smi_csv: str, visible: str | None) -> dict[str, int]:
    """gpu_memory's reading of nvidia-smi's lines ("0, GPU-8f2c..., 81559") under a
    CUDA_VISIBLE_DEVICES value (None: every GPU, in nvidia-smi's order)."""
    gpus: list[tuple[str, str, int]] = []
    for line in smi_csv.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 3 and fields[0].isdigit() and fields[2].isdigit():
            gpus.append((fields[0], fields[1], int(fields[2]) << 20))
    if visible is None:
        return {f"cuda:{i}": size for i, (_, _, size) in enumerate(gpus)}
    out: dict[str, int] = {}
    for n, entry in enumerate(e.strip() for e in visible.split(",")):
        if not entry or entry.startswith("-"):
            break  # where CUDA stops reading (visible_gpus)
        match = [size for index, uuid, size in gpus if entry == index or (entry.startswith("GPU-") and uuid.startswith(entry))]
        if match:
            out[f"cuda:{n}"] = match[0]
    return out
