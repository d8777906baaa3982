"""The memory check at start: a GPU the plan overfills exits with status 2 naming each item,
the total and the budget; a plan that fits starts, its table logged once; CPU devices are
never refused, and their plan is logged. (check_devices_present: tests/omni/cli/test_options.py.)"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from omni.cli.options import parse_args, server_config
from omni.cli.preflight import check_memory
from omni.config import ServerConfig
from tests.omni.engines.reference_checkpoint import reference_checkpoint

GIB = 1024**3


def _reference(tmp_path: Path, *flags: str) -> ServerConfig:
    root = reference_checkpoint(tmp_path / "ref")
    return server_config(parse_args([str(root), "--device", "cuda:0", "--dtype", "bfloat16", "--no-audio-output", *flags]))


def test_a_gpu_the_plan_overfills_is_refused_naming_each_item_and_the_total(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # everything on one 24 GiB GPU: LLM 11.18 + encoder 3.45 + two DiTs 7.22 + codebook 0.38 +
    # VAE 0.16 + activations 1.85 = 24.22 GiB, over 0.9 x 24 = 21.60
    config = _reference(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        check_memory(config, lambda: {"cuda:0": 24 * GIB})
    assert exit_.value.code == 2
    message = capsys.readouterr().err
    assert message.startswith("omni-serve: cuda:0 cannot hold what is placed on it: ref llm weights (worker 0) 11.18 GiB + ")
    for part in ("ref encoder weights 3.45 GiB", "r0 rank 0: transformer 3.61 GiB", "r0 rank 0: transformer2 3.61 GiB",
                 "codebook 0.38 GiB", "VAE 0.16 GiB", "activations 1.85 GiB", "= 24.22 GiB, over 0.9 x 24.00 = 21.60 GiB"):
        assert part in message


def test_the_utilization_flag_sets_the_budget_and_a_plan_that_fits_starts(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="omni.cli.main"):
        check_memory(_reference(tmp_path), lambda: {"cuda:0": 80 * GIB})
    [table] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("memory plan")]
    assert "cuda:0   total" in table and "24.22 of 0.9 x 80.00 = 72.00 GiB" in table
    with pytest.raises(SystemExit):
        check_memory(_reference(tmp_path, "--gpu-memory-utilization", "0.25"), lambda: {"cuda:0": 80 * GIB})


def test_spreading_the_decoder_over_replicas_and_guidance_groups_fits_where_one_gpu_did_not(tmp_path: Path) -> None:
    devices = "cuda:1,cuda:2,cuda:3,cuda:4"
    config = _reference(tmp_path, "--vision-decoder-devices", devices, "--vision-decoder-replicas", "2")
    check_memory(config, lambda: {f"cuda:{i}": 24 * GIB for i in range(5)})


def test_cpu_devices_are_logged_never_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = reference_checkpoint(tmp_path / "ref")
    config = server_config(parse_args([str(root), "--device", "cpu", "--no-audio-output"]))

    def no_driver() -> dict[str, int]:
        raise AssertionError("no GPU in the plan: the driver is not asked")

    with caplog.at_level(logging.INFO, logger="omni.cli.main"):
        check_memory(config, no_driver)  # 40 GiB of float32 weights on the CPU: logged, not refused
    assert any("cpu      total" in r.getMessage() for r in caplog.records)


def test_a_gpu_of_unknown_memory_is_not_refused(tmp_path: Path) -> None:
    check_memory(_reference(tmp_path), dict)  # nvidia-smi missing: nothing known, nothing refused


def test_main_refuses_an_overfull_gpu_before_any_worker_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from omni.cli import main as cli_main

    root = reference_checkpoint(tmp_path / "ref")
    monkeypatch.setattr("omni.cli.devices.visible_gpus", lambda: 1)
    monkeypatch.setattr("omni.cli.devices.gpu_memory", lambda: {"cuda:0": 24 * GIB})

    def serve(*args: object) -> int:
        raise AssertionError("no worker may start")

    monkeypatch.setattr(cli_main, "serve", serve)
    monkeypatch.setenv("OMNI_LOG_LEVEL", "INFO")
    monkeypatch.setenv("OMNI_LOG_FORMAT", "text")
    with pytest.raises(SystemExit) as exit_:
        cli_main.main([str(root), "--device", "cuda:0", "--dtype", "bfloat16", "--no-audio-output"])
    assert exit_.value.code == 2
    assert "cuda:0 cannot hold what is placed on it" in capsys.readouterr().err
