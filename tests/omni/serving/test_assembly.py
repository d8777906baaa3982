"""The composition root without workers: a ModelConfig becomes its ServedModel (a text-only
checkpoint: no media, no output kind), each model goes into the registry under its aliases,
its workers start in one background task that leaving cancels, and every worker is stopped."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from omni.config import ModelConfig
from omni.metrics import Metrics
from omni.serving import assembly
from omni.serving.model import ModelRegistry
from omni.shared.store.local import LocalStore


async def test_a_text_checkpoint_is_served_with_its_pool_and_no_outputs(tiny_tokenizer_dir: Path, tmp_path: Path) -> None:
    config = ModelConfig(name="m", model_dir=tiny_tokenizer_dir)
    served = await assembly.served_model(config, LocalStore(tmp_path, "http://x", b"s"), Metrics())
    assert served.name == "m" and served.pool.config is config
    assert served.media is None and served.outputs == ()
    assert list(served.workers()) == served.pool.engines


async def test_models_fill_the_registry_start_in_the_background_and_stop_on_leaving(
    tiny_tokenizer_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: list[object] = []
    entered = asyncio.Event()
    hold = asyncio.Event()  # never set: the start is still under way when the block is left

    async def start_in_order(workers: Sequence[object], *also: object) -> None:
        started.extend(workers)
        entered.set()
        await hold.wait()

    monkeypatch.setattr(assembly, "start_in_order", start_in_order)
    configs = [ModelConfig(name="a", model_dir=tiny_tokenizer_dir, aliases=("alias",)),
               ModelConfig(name="b", model_dir=tiny_tokenizer_dir)]  # fmt: skip
    registry = ModelRegistry()
    async with assembly.models(configs, registry, LocalStore(tmp_path, "http://x", b"s"), Metrics()) as startup:
        assert [m.name for m in registry] == ["a", "b"] and registry.get("alias") is registry.get("a")
        await entered.wait()  # the task has begun: it has the workers
        assert started == [w for m in registry for w in m.workers()] and not startup.done()
    assert startup.cancelled()
