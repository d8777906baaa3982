"""The checks made at start, before any worker: what needs this machine's GPUs, not only the
flags (a config is also built, and tested, on machines without the GPUs it names).

    check_devices_present   every GPU a device flag names is one this machine shows
    check_memory            what each device will hold (omni/engines/memory_plan.py: every
                            model's LLM weights, encoder, vocoder and every image decoder
                            replica's every rank) fits --gpu-memory-utilization x its memory;
                            the plan's table is logged once, and a GPU it overfills exits
                            with status 2 naming each item, the total and the budget
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Mapping

from omni.cli import devices as device_flags
from omni.config import ServerConfig
from omni.engines.memory_plan import DEFAULT_GPU_MEMORY_UTILIZATION, memory_plan

log = logging.getLogger("omni.cli.main")


def check_devices_present(config: ServerConfig, gpus: int | None = None) -> None:
    """Every GPU a device flag names is one this machine shows (gpus: how many; counted from
    the driver when None)."""
    named: list[tuple[str, str]] = []
    for model in config.models:
        if model.llm.devices:
            named += [("--devices", d) for d in model.llm.devices]
        else:
            named.append(("--device", model.llm.device))
        if model.encoder.device is not None:
            named.append(("--encoder-device", model.encoder.device))
        named += [("--vision-decoder-devices", d) for d in model.vision_decoder.devices]
        if model.audio_decoder.device is not None:
            named.append(("--audio-decoder-device", model.audio_decoder.device))
    if all(device == "cpu" for _, device in named):
        return
    try:
        device_flags.check_present(named, device_flags.visible_gpus() if gpus is None else gpus)
    except device_flags.DeviceError as exc:
        raise SystemExit(f"omni-serve: {exc}") from None


def check_memory(config: ServerConfig, gpu_memory: Callable[[], Mapping[str, int]] | None = None) -> None:
    """Log the memory plan; exit with status 2 when a GPU's items exceed its budget.
    gpu_memory: "cuda:N" -> bytes (None: the driver's, device_flags.gpu_memory; tests give their own). CPU devices are only
    logged. A checkpoint file the plan cannot read is left to the worker that loads it."""
    if not config.models:
        return
    try:
        plan = memory_plan(config)
    except (OSError, ValueError, LookupError, TypeError) as exc:
        log.warning("memory plan: not made (%s); the workers find out at load", exc)
        return
    on_gpu = any(device != "cpu" for device in plan.devices)
    totals = (gpu_memory or device_flags.gpu_memory)() if on_gpu else {}
    given = config.models[0].llm.gpu_memory_utilization
    utilization = DEFAULT_GPU_MEMORY_UTILIZATION if given is None else given
    log.info("memory plan (weights and the largest batch's activations; the KV cache takes the rest):\n%s",
             plan.table(totals, utilization))
    problems = plan.overfull(totals, utilization)
    if problems:
        print(f"omni-serve: {'; '.join(problems)}. Spread the parts over more devices (--vision-decoder-devices, "
              "--vision-decoder-replicas, --encoder-device, --audio-decoder-device, --devices), or lower "
              "--max-batch-images / --max-batch-tokens (docs/CHECKPOINT.md)", file=sys.stderr)
        raise SystemExit(2)
