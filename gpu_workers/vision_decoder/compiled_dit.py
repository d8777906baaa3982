"""A compiled DiT: the single-stream blocks' halves through torch.compile (inductor).

Each SingleStreamBlock runs in two halves around its attention (gpu_workers/models/flux_dit.py):
modulation, LayerNorm, the q|k|v|mlp projection, the q/k RMSNorms and RoPE before it; the
output projection of [attention | GELU(mlp)], the gate and the residual after it. inductor fuses
each half's elementwise work into the matmuls' neighbours. The attention stays eager between
them: SDPA on one rank, or the Ulysses all-to-alls and SDPA on a group (a collective dynamo
would break the graph at), so one compiled code serves one rank and every Ulysses layout, and
the step cache (step_cache.py), which calls whole blocks, runs them compiled unchanged.

Each half is compiled once for every block of every DiT in the process (the main transformer and
its autoguidance twin): the block is an argument, its weights are inputs (torch inlines nn
modules' parameters), and the shapes are dynamic (dynamic=True: batch, tokens), so a batch of
one image and a batch of several are the only two graphs (dynamo specialises a size of 1).
`warm_up` compiles them before the worker reports ready, drawing a batch of one image and one
of two through the decoder's own path; inductor's FX graph and AOT caches keep the code on disk across restarts
(~/.cache/omni-serve/inductor, as the LLM's compiled decode step: gpu_workers/llm/decode_graph.py).

The default: on where it pays (a CUDA device); off on the CPU, where the blocks are matmul-bound
and compiling gains a few percent for tens of seconds of start (docs/BENCHMARKS.md);
--compile-dit / --no-compile-dit choose, --enforce-eager turns it off.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any, cast

import torch
from torch.fx.experimental import _config as fx_config

from gpu_workers.llm.decode_graph import use_disk_cache
from gpu_workers.models.flux_dit import FluxDiT, HalfAfter, HalfBefore, SingleStreamBlock
from omni.shared import protocol

log = logging.getLogger("omni.vision_decoder.compiled_dit")

_compiled: tuple[HalfBefore, HalfAfter] | None = None  # the two halves, compiled once per process


def compiled_halves() -> tuple[HalfBefore, HalfAfter]:
    global _compiled
    if _compiled is not None:
        return _compiled
    use_disk_cache()
    # every block of every DiT of the process shares the two graphs (two shapes each)
    torch._dynamo.config.recompile_limit = max(32, torch._dynamo.config.recompile_limit)
    before = torch.compile(SingleStreamBlock.before_attention, dynamic=True)
    after = torch.compile(SingleStreamBlock.after_attention, dynamic=True)

    # Without duck sizing: a token count equal to the head size (Ulysses' shards make any
    # count possible) would otherwise tie the two, and each other count compile again.
    def compiled_before(*args: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
            return before(*args)  # type: ignore[no-any-return]

    def compiled_after(*args: Any) -> torch.Tensor:
        with fx_config.patch(use_duck_shape=False):  # type: ignore[attr-defined]
            return after(*args)  # type: ignore[no-any-return]

    halves = (compiled_before, compiled_after)
    _compiled = halves
    return halves


def compile_blocks(models: Iterable[FluxDiT]) -> int:
    """Run every block of `models` through the compiled halves; the number of blocks."""
    halves = compiled_halves()
    count = 0
    for model in models:
        for block in model.blocks:
            cast(SingleStreamBlock, block).halves = halves
            count += 1
    return count


def is_compiled(model: FluxDiT) -> bool:
    return all(block.halves is _compiled for block in model.blocks) and _compiled is not None


def warm_up(decoder: Any) -> float:
    """Compile now, before the worker reports ready, on the decoder's own path: it draws a
    batch of one image and one of two (the smallest size, 2 steps; every rank of a Ulysses
    group at once, as each rank loads). The seconds it took."""
    side = 4 * decoder.size_multiple  # 16 tokens: every rank of a group has at least 2
    codes = [0] * decoder.config.num_codes_per_image
    started = time.perf_counter()
    for count in (1, 2):
        jobs = [protocol.ImageJob(i, codes, side, side, 2, i) for i in range(count)]
        decoder.decode(jobs)
    seconds = time.perf_counter() - started
    log.info("compiled DiT blocks ready in %.1f s (cache %s)", seconds, use_disk_cache())
    return seconds
