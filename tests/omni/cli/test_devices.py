"""The device flags read back (review A2, A9, C11): cuda is cuda:0, bad lists are refused
naming the flag, auto follows the GPUs the driver shows, and the GPUs are counted without
torch, from a fake /proc/driver/nvidia/gpus and CUDA_VISIBLE_DEVICES."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omni.cli import devices
from omni.cli.devices import (
    DeviceError,
    check_present,
    normalise,
    normalise_list,
    resolve,
    visible_gpus,
    visible_memory,
)


@pytest.mark.parametrize(
    ("text", "device"), [("cuda", "cuda:0"), ("cuda:3", "cuda:3"), ("CUDA:01", "cuda:1"), (" cpu ", "cpu")]
)
def test_a_device_is_normalised(text: str, device: str) -> None:
    assert normalise(text, "--device") == device


@pytest.mark.parametrize("text", ["gpu", "cuda:x", "cuda:-1", "cpu:0", "mps", "", "cuda:0,cuda:1", "auto"])
def test_a_malformed_device_is_refused_naming_the_flag(text: str) -> None:
    with pytest.raises(DeviceError, match=re.escape(f"--encoder-device {text!r}: a device is cpu, cuda or cuda:N")):
        normalise(text, "--encoder-device")


def test_a_list_is_all_cpu_or_distinct_gpus() -> None:
    assert normalise_list(["cpu", "cpu"], "--vision-decoder-devices") == ("cpu", "cpu")  # a CPU Ulysses group
    assert normalise_list(["cuda", "cuda:1"], "--devices") == ("cuda:0", "cuda:1")
    assert normalise_list([], "--devices") == ()
    with pytest.raises(DeviceError, match="--vision-decoder-devices cuda:0,cpu: cpu and cuda devices cannot be mixed"):
        normalise_list(["cuda:0", "cpu"], "--vision-decoder-devices")
    with pytest.raises(DeviceError, match="--devices cuda:0,cuda:1,cuda:0: cuda:0 is named more than once"):
        normalise_list(["cuda", "cuda:1", "cuda:0"], "--devices")  # cuda is cuda:0


def test_auto_is_the_first_gpu_when_there_is_one() -> None:
    assert resolve("auto", "--device", gpus=0) == "cpu"
    assert resolve("auto", "--device", gpus=2) == "cuda:0"
    assert resolve("cuda", "--device", gpus=0) == "cuda:0"  # absence is checked at start, not here


def test_a_gpu_the_machine_lacks_is_refused_naming_the_flag() -> None:
    check_present([("--device", "cuda:0"), ("--encoder-device", "cpu")], gpus=1)
    with pytest.raises(DeviceError, match=re.escape("--vision-decoder-devices cuda:7: this machine shows 1 GPU (cuda:0..cuda:0)")):
        check_present([("--device", "cuda:0"), ("--vision-decoder-devices", "cuda:7")], gpus=1)
    with pytest.raises(DeviceError, match="--device cuda:0: this machine shows no GPU"):
        check_present([("--device", "cuda:0")], gpus=0)


@pytest.fixture
def two_gpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    proc = tmp_path / "gpus"
    for bus in ("0000:01:00.0", "0000:02:00.0"):
        (proc / bus).mkdir(parents=True)
    monkeypatch.setattr(devices, "_PROC_GPUS", proc)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


@pytest.mark.usefixtures("two_gpus")
@pytest.mark.parametrize(
    ("visible", "count"), [(None, 2), ("1", 1), ("0,1,2", 2), ("", 0), ("-1", 0), ("1,-1,0", 1), ("GPU-8f2a", 1)]
)
def test_gpus_are_counted_from_the_driver_as_cuda_visible_devices_narrows_them(
    visible: str | None, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert visible_gpus() == count


def test_without_the_driver_nvidia_smi_counts_or_there_is_no_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(devices, "_PROC_GPUS", tmp_path / "absent")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices.shutil, "which", lambda name: None)
    assert visible_gpus() == 0
    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\necho 'GPU 0: NVIDIA H200 (UUID: GPU-1)'\necho 'GPU 1: NVIDIA H200 (UUID: GPU-2)'\n")
    smi.chmod(0o755)
    monkeypatch.setattr(devices.shutil, "which", lambda name: str(smi))
    assert visible_gpus() == 2


SMI = "0, GPU-aaaa-1111, 81559\n1, GPU-bbbb-2222, 24564\n2, GPU-cccc-3333, 143771\n"


@pytest.mark.parametrize(
    ("visible", "expect"),
    [
        (None, {"cuda:0": 81559 << 20, "cuda:1": 24564 << 20, "cuda:2": 143771 << 20}),
        ("2,0", {"cuda:0": 143771 << 20, "cuda:1": 81559 << 20}),  # renumbered as CUDA does
        ("GPU-bbbb,-1,0", {"cuda:0": 24564 << 20}),  # a uuid prefix; CUDA stops at -1
        ("MIG-xyz", {}),  # a MIG slice's share is not listed: unknown, not checked
    ],
)
def test_gpu_memory_reads_nvidia_smi_through_cuda_visible_devices(visible: str | None, expect: dict[str, int]) -> None:
    assert visible_memory(SMI, visible) == expect
