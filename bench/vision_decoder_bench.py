#!/usr/bin/env python3
"""The image decoder's DiT on CPU: against diffusers, over Ulysses ranks, and batched.

Four claims about gpu_workers/models/flux_dit.py and gpu_workers/attention/ulysses.py (issue 10,
acceptance point 3), each one transformer pass of one denoising step, float32, at the reference
width (hidden 1920, 24 heads of 80, RoPE axes 8 | 36 | 36, MLP 7680) at a reduced depth
(--depth single-stream blocks, default 1; the reference has 35; 2 doubles the run time), on a
--grid x --grid token grid (default 64 x 64 = 4,096 tokens; with --patch 1, the reference's
default, one token per latent pixel). --benchmarks picks a subset:

  a. dit       ours against diffusers' FluxTransformer2DModel (num_layers=0 double-stream blocks,
               num_single_layers=depth, zero text tokens) holding the same weights: diffusers'
               model is built and seeded, ours loads its state dict through the existing name
               mapping. The outputs must agree within --tol before anything is timed (this
               check runs whenever a, c or d does).
  b. ulysses   --ranks gloo ranks (spawned processes) with UlyssesAttention against 1 rank, the
               same forward on the same weights and input. Two pairings: (i) 1 rank with one
               rank's share of the cores (cores / ranks threads) against N ranks with that share
               each: the analogue of 1 GPU against N; (ii) 1 rank with every core against N
               ranks sharing them: the same cores. The gathered N-rank output must match 1 rank
               within --tol. The latent stays sharded across the steps, so a step's time is the
               sharded forward; the gather at the end is not timed.
  c. cfg       the two passes of a guidance step (conditional, and unconditional: the condition
               zeroed) as one batch of 2 against two batch-1 forwards one after the other.
  d. jobs      4 concurrent jobs of one size (own noise, codes and timestep each) as one batch-4
               forward against four batch-1 forwards, one at a time.
  e. guidance  guidance parallelism (gpu_workers/vision_decoder/guidance_parallel.py): a guided
               step's velocity, autoguidance's two passes (the transformer and a twin of its size,
               as CFG's two passes are), on 2 gloo ranks of 1 thread each (rank 0 the transformer,
               rank 1 the twin, one all_gather) against 1 rank of 1 thread running both passes,
               the decoder's own AutoGuidance and parallel_velocity code. The two velocities must be
               equal bit for bit. Turn 0 warms up.

Inputs go through the real path: random codes on a 27 x 27 grid (as TA-Tok emits them), a
seeded random codebook, `condition_from_codes` to the latent grid, concatenated after seeded
noise, `patchify`. Weights are seeded random, scaled so that activations stay of order one at
this width (a matrix N(0, 1) / sqrt(fan_in), QK-norm gains 1 + 0.1 N(0, 1), the rest 0.02 N(0, 1)).

Timing: torch.inference_mode. Every batch shape is run once unmeasured first; then --repeats
rounds, the variants alternating within each round so that background load hits them alike; the
median (and min) is reported. In each round of a, c and d the batch-1 forwards run back to back,
one per job: job 0 conditional, job 0 unconditional, jobs 1, 2, 3. c's sequential time is the sum
of the first two; d's the sum of job 0's and jobs 1 to 3's; a's "ours" is job 0's, run right
after diffusers' on the same input. After timing, each batched output is checked against those
batch-1 outputs (within --tol). In b, rank 0 runs the 1-rank variants alone while the other ranks
wait at a barrier (they use no CPU there: the summed CPU seconds are recorded), then all ranks
run the sharded forward; turn 0 warms up.

    .venv/bin/python bench/vision_decoder_bench.py                       # defaults: 5 to 6 min on 2 idle cores
    .venv/bin/python bench/vision_decoder_bench.py --grid 16 --repeats 1  # smoke run (under a minute)
    .venv/bin/python bench/vision_decoder_bench.py --benchmarks dit --threads 1 --repeats 5
    .venv/bin/python bench/vision_decoder_bench.py --out bench/results/vision_decoder_<UTC time>.json

On a shared 2-core machine the figures are only indicative: the 1-minute load average before and
after each part is recorded.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without an install
    sys.path.insert(0, str(ROOT))

from gpu_workers.attention.ulysses import UlyssesAttention, gather_sequence, shard_sequence  # noqa: E402
from gpu_workers.distributed import GroupMember, destroy_group, init_group  # noqa: E402
from gpu_workers.models.flux_dit import (  # noqa: E402
    FluxDiT,
    FluxDiTConfig,
    condition_from_codes,
    patchify,
    position_ids,
)
from gpu_workers.vision_decoder.guidance import AutoGuidance, StepInputs, TokenShard, parallel_velocity  # noqa: E402
from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups  # noqa: E402

SCHEMA = "vision-decoder-bench/1"
BENCHMARKS = ("dit", "ulysses", "cfg", "jobs", "guidance")
CODE_GRID = 27  # TA-Tok's 27 x 27 codes per image
NUM_CODES = 1024  # a random codebook's rows; only its width (cond_channels) costs anything
TEXT_DIM = 64  # diffusers' context_embedder width: it embeds zero text tokens
NUM_JOBS = 4
SIGMAS = (0.75, 0.5, 0.875, 0.25)  # job i's noise level; the model sees sigma * 1000
# diffusers' models, typed Any: mypy cannot see through their lazy-import and mixin layers
DiffusersFlux = Any


# ---------------------------------------------------------------------------------------------
# Models and inputs.


def reference_config(depth: int, patch: int) -> FluxDiTConfig:
    """The reference decoder's widths (FluxDiTConfig's defaults) at the given depth."""
    return FluxDiTConfig(num_layers=depth, patch=patch)


def randomize(model: DiffusersFlux, seed: int) -> None:
    """Seeded weights of diffusers' model, of the scales in the module docstring, in name order."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            noise = torch.randn(p.shape, generator=g)
            if name.endswith(("attn.norm_q.weight", "attn.norm_k.weight")):  # the QK RMSNorm gains
                p.copy_(1.0 + 0.1 * noise)
            elif p.dim() == 2:
                p.copy_(noise / p.shape[1] ** 0.5)
            else:
                p.copy_(0.02 * noise)


def make_models(config: FluxDiTConfig, seed: int) -> tuple[DiffusersFlux, FluxDiT]:
    """diffusers' FluxTransformer2DModel, seeded, and ours holding its weights."""
    from diffusers import FluxTransformer2DModel  # noqa: PLC0415 - (a) only; the ranks never need it

    theirs: DiffusersFlux = FluxTransformer2DModel(
        in_channels=config.token_in_dim,
        out_channels=config.token_out_dim,
        num_layers=0,
        num_single_layers=config.num_layers,
        attention_head_dim=config.head_dim,
        num_attention_heads=config.num_heads,
        joint_attention_dim=TEXT_DIM,
        pooled_projection_dim=config.vec_in_dim,
        axes_dims_rope=config.axes_dims_rope,
    )
    randomize(theirs, seed)
    with torch.device("meta"):  # no time spent on an init the weights overwrite
        ours = FluxDiT(config)
    ours = ours.to_empty(device="cpu")
    ours.load_weights(theirs.state_dict())
    return theirs.eval(), ours.eval()


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """One transformer pass's inputs: x (1, S, token_in_dim), timestep (1,) on 0..1000, vec (1, cond)."""

    x: torch.Tensor
    timestep: torch.Tensor
    vec: torch.Tensor


def make_jobs(config: FluxDiTConfig, grid: int, seed: int) -> tuple[list[Job], torch.Tensor]:
    """Jobs 0..3, then job 0's unconditional pass (its noise, the condition zeroed); and the
    tokens' positions (S, 3)."""
    g = torch.Generator().manual_seed(seed)
    side = grid * config.patch  # latent pixels each way
    codebook = torch.randn(NUM_CODES, config.cond_channels, generator=g)
    jobs = []
    for sigma in SIGMAS:
        codes = torch.randint(0, NUM_CODES, (1, CODE_GRID * CODE_GRID), generator=g)
        cond_map, vec = condition_from_codes(codes, codebook, (side, side))  # (1, cond, side, side)
        noise = torch.randn(1, config.in_channels, side, side, generator=g)
        x = patchify(torch.cat((noise, cond_map), dim=1), config.patch)  # (1, grid*grid, token_in_dim)
        jobs.append(Job(x, torch.tensor([sigma * 1000.0]), vec))
    j0 = jobs[0]
    uncond_x = j0.x.clone()
    # inside a token the features run channel-major: the first p*p*in_channels are the latent's
    uncond_x[..., config.token_out_dim :] = 0.0
    jobs.append(Job(uncond_x, j0.timestep, torch.zeros_like(j0.vec)))
    return jobs, position_ids(grid, grid)


def batch(jobs: Sequence[Job]) -> Job:
    return Job(
        torch.cat([j.x for j in jobs]), torch.cat([j.timestep for j in jobs]), torch.cat([j.vec for j in jobs])
    )


def max_abs_diff(got: torch.Tensor, want: torch.Tensor) -> float:
    return (got.float() - want.float()).abs().max().item()


def check_equal(what: str, got: torch.Tensor, want: torch.Tensor, tol: float) -> float:
    """Raise AssertionError (also under python -O) unless shapes match and max |got - want| <= tol."""
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shapes differ, {tuple(got.shape)} vs {tuple(want.shape)}")
    diff = max_abs_diff(got, want)
    if not diff <= tol:  # also catches NaN
        raise AssertionError(f"{what}: max abs difference {diff:.3g} exceeds {tol:g}")
    return diff


def summarize(times: list[float]) -> dict[str, Any]:
    return {"median_s": statistics.median(times), "min_s": min(times), "times_s": times}


# ---------------------------------------------------------------------------------------------
# a, c, d: one process.


def bench_in_process(
    theirs: DiffusersFlux,
    ours: FluxDiT,
    jobs: list[Job],
    positions: torch.Tensor,
    *,
    chosen: set[str],
    repeats: int,
    tol: float,
) -> dict[str, Any]:
    """The chosen ones of a (ours against diffusers), c (guidance batched) and d (4 jobs
    batched); see the module docstring for what each round runs. Ours is checked against
    diffusers first whatever is chosen."""
    j0, uncond = jobs[0], jobs[NUM_JOBS]
    text = torch.zeros(1, 0, TEXT_DIM)
    txt_ids = torch.zeros(0, 3)
    img_ids = positions.float()

    def run_theirs(job: Job) -> torch.Tensor:
        # diffusers takes sigma and scales it by 1000 inside; ours takes the scaled value
        (out,) = theirs(
            hidden_states=job.x, encoder_hidden_states=text, pooled_projections=job.vec,
            timestep=job.timestep / 1000, img_ids=img_ids, txt_ids=txt_ids, return_dict=False,
        )  # fmt: skip
        return out

    def run_ours(job: Job) -> torch.Tensor:
        return ours(job.x, positions, job.timestep, job.vec)

    # the batch-1 forwards of a round, back to back: job 0, job 0 unconditional, jobs 1..3
    order = [0] + [NUM_JOBS] * ("cfg" in chosen) + list(range(1, NUM_JOBS)) * ("jobs" in chosen)
    batched = {"cfg": batch([j0, uncond]), "jobs": batch(jobs[:NUM_JOBS])}
    batched = {name: b for name, b in batched.items() if name in chosen}
    times: dict[str, list[float]] = {"diffusers": []} if "dit" in chosen else {}
    times.update((f"ours_job{i}", []) for i in order)
    times.update((f"{name}_batched", []) for name in batched)

    def timed(name: str, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        t0 = time.perf_counter()
        out = fn()
        times[name].append(time.perf_counter() - t0)
        return out

    with torch.inference_mode():
        # one unmeasured run of every batch shape; their outputs are what the checks compare
        t0 = time.perf_counter()
        want = run_theirs(j0)
        theirs_first_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        got = run_ours(j0)
        ours_first_s = time.perf_counter() - t0
        if not want.abs().max().item() > 0.1:
            raise AssertionError("diffusers' output is near zero: a check against it would prove nothing")
        dit_diff = check_equal("ours vs diffusers", got, want, tol)
        print(f"[decoder-bench] ours = diffusers within {dit_diff:.2e} (output max {want.abs().max():.2f}); "
              f"first calls {ours_first_s:.1f} s ours, {theirs_first_s:.1f} s diffusers", flush=True)  # fmt: skip
        batched_out = {name: run_ours(b) for name, b in batched.items()}

        singles: dict[int, torch.Tensor] = {}
        for round_ in range(repeats):
            if "dit" in chosen:
                timed("diffusers", lambda: run_theirs(j0))
            for i in order:
                singles[i] = timed(f"ours_job{i}", lambda: run_ours(jobs[i]))  # noqa: B023 - called at once
            for name, b in batched.items():
                timed(f"{name}_batched", lambda: run_ours(b))  # noqa: B023 - called at once
            print(f"[decoder-bench] round {round_ + 1}/{repeats}: "
                  + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)  # fmt: skip

    results: dict[str, Any] = {"per_job_s": {str(i): summarize(times[f"ours_job{i}"]) for i in order}}
    if "dit" in chosen:
        dit = {"diffusers": summarize(times["diffusers"]), "ours": summarize(times["ours_job0"])}
        results["dit"] = {
            **dit,
            "max_abs_diff": dit_diff,
            "output_abs_max": want.abs().max().item(),
            "first_call_s": {"ours": ours_first_s, "diffusers": theirs_first_s},
            "speedup": dit["diffusers"]["median_s"] / dit["ours"]["median_s"],
        }
    members = {"cfg": [0, NUM_JOBS], "jobs": list(range(NUM_JOBS))}  # the sequential forwards of each
    for name in batched:
        diff = check_equal(
            f"{name}: batch vs sequential", batched_out[name], torch.cat([singles[i] for i in members[name]]), tol
        )
        sequential = [sum(ts) for ts in zip(*(times[f"ours_job{i}"] for i in members[name]), strict=True)]
        r = {"sequential": summarize(sequential), "batched": summarize(times[f"{name}_batched"])}
        results[name] = {**r, "max_abs_diff": diff, "speedup": r["sequential"]["median_s"] / r["batched"]["median_s"]}
    return results


# ---------------------------------------------------------------------------------------------
# b: Ulysses, in spawned gloo ranks.


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds between barriers, and CPU seconds summed over the ranks (a rank waiting
    at the barrier should add next to nothing; a large figure means it spun)."""
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    fn()
    cpu = torch.tensor([time.process_time() - cpu_start], dtype=torch.float64)
    dist.barrier()
    wall = time.perf_counter() - start
    dist.all_reduce(cpu)
    return wall, float(cpu.item())


def _ulysses_rank(rank: int, world_size: int, init_method: str, work: str, cores: int, repeats: int) -> None:
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=1800.0)
    try:
        model = FluxDiT.from_dir(work)
        tensors = load_file(str(Path(work) / "inputs.safetensors"))
        x, positions, timestep, vec = (tensors[k] for k in ("x", "positions", "timestep", "vec"))
        total = x.shape[1]
        share = max(1, cores // world_size)
        local_x, _ = shard_sequence(x, rank, world_size, dim=1)  # (1, L, token_in_dim)
        local_positions, _ = shard_sequence(positions, rank, world_size, dim=0)  # (L, 3)
        attention = UlyssesAttention(dist.group.WORLD, world_size, rank, total, model.config.num_heads)
        outputs: dict[str, torch.Tensor] = {}

        def alone(threads: int) -> Callable[[], None]:
            def fn() -> None:  # rank 0; the others wait at the barrier
                if rank == 0:
                    torch.set_num_threads(threads)
                    outputs["one"] = model(x, positions, timestep, vec)

            return fn

        def sharded() -> None:
            torch.set_num_threads(share)
            outputs["local"] = model(local_x, local_positions, timestep, vec, attention=attention)

        phases = {"one_rank_share": alone(share), "one_rank_all": alone(cores), "sharded": sharded}
        walls: dict[str, list[float]] = {name: [] for name in phases}
        cpus: dict[str, list[float]] = {name: [] for name in phases}
        with torch.inference_mode():
            for turn in range(repeats + 1):  # turn 0 warms up: allocator, gloo buffers, kernels
                turn_walls = {}
                for name, fn in phases.items():
                    turn_walls[name], cpu = _timed(fn)
                    if turn:
                        walls[name].append(turn_walls[name])
                        cpus[name].append(cpu)
                if rank == 0:
                    print(f"[decoder-bench] ulysses turn {turn}/{repeats}" + (" (warm-up)" if not turn else "") + ": "
                          + ", ".join(f"{k} {v:.2f} s" for k, v in turn_walls.items()), flush=True)  # fmt: skip
            gathered = gather_sequence(outputs["local"], dist.group.WORLD, total, dim=1)
        if rank == 0:
            diff = max_abs_diff(gathered, outputs["one"])
            result = {"walls_s": walls, "cpu_s": cpus, "max_abs_diff": diff,
                      "output_abs_max": outputs["one"].abs().max().item(), "threads_per_rank": share}  # fmt: skip
            (Path(work) / "result.json").write_text(json.dumps(result))
    finally:
        destroy_group(member)


def bench_ulysses(
    ours: FluxDiT, job: Job, positions: torch.Tensor, *, ranks: int, cores: int, repeats: int, tol: float
) -> dict[str, Any]:
    """Save the model and the input where the ranks load them, spawn the group, read rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="decoder-bench-") as work:
        (Path(work) / "config.json").write_text(json.dumps(ours.config.to_dict()))
        save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(Path(work) / "model.safetensors"))
        inputs = {"x": job.x, "positions": positions, "timestep": job.timestep, "vec": job.vec}
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(Path(work) / "inputs.safetensors"))
        spawn_args = (ranks, f"file://{work}/rendezvous", work, cores, repeats)
        mp.start_processes(_ulysses_rank, args=spawn_args, nprocs=ranks, start_method="spawn")
        raw = json.loads((Path(work) / "result.json").read_text())
    if not raw["max_abs_diff"] <= tol:
        raise AssertionError(f"ulysses: {ranks} ranks differ from 1 by {raw['max_abs_diff']:.3g} (> {tol:g})")
    walls = {name: summarize(ts) for name, ts in raw["walls_s"].items()}
    for name, ts in raw["cpu_s"].items():
        walls[name]["cpu_s_median"] = statistics.median(ts)
    sharded_s = walls["sharded"]["median_s"]
    return {
        **walls,
        "ranks": ranks,
        "cores": cores,
        "threads_per_rank": raw["threads_per_rank"],
        "max_abs_diff": raw["max_abs_diff"],
        "output_abs_max": raw["output_abs_max"],
        "speedup_same_threads_per_rank": walls["one_rank_share"]["median_s"] / sharded_s,
        "speedup_same_total_cores": walls["one_rank_all"]["median_s"] / sharded_s,
    }


# ---------------------------------------------------------------------------------------------
# e: guidance in parallel, in 2 spawned gloo ranks.


def _guidance_rank(rank: int, world_size: int, init_method: str, work: str, repeats: int) -> None:
    member = GroupMember(rank, world_size, init_method)
    init_group(member, "cpu", timeout_s=1800.0)
    try:
        torch.set_num_threads(1)
        model = FluxDiT.from_dir(work)  # rank 0's transformer, rank 1's twin (the same weights: only time counts)
        tensors = load_file(str(Path(work) / "inputs.safetensors"))
        x, positions, timestep, vec = (tensors[k] for k in ("x", "positions", "timestep", "vec"))
        groups = GuidanceGroups.split(rank, world_size)
        shard = TokenShard(groups.ulysses, positions)  # a group of 1: this rank holds every token
        latent = model.config.token_out_dim  # a token's features: the latent's, then the condition's
        step = StepInputs(x[..., :latent], x[..., latent:], vec, timestep, torch.tensor([0.75]), guided=True)
        sequential = AutoGuidance(model)  # both passes on rank 0
        parallel = AutoGuidance(None)  # this rank's pass, its pair's exchanged
        outputs: dict[str, torch.Tensor] = {}

        def one_rank() -> None:  # rank 0; rank 1 waits at the barrier
            if rank == 0:
                outputs["one"] = sequential.velocity(shard, model, step)

        def two_ranks() -> None:
            outputs["two"] = parallel_velocity(parallel, groups, shard, model, step)

        phases = {"one_rank": one_rank, "two_ranks": two_ranks}
        walls: dict[str, list[float]] = {name: [] for name in phases}
        cpus: dict[str, list[float]] = {name: [] for name in phases}
        with torch.inference_mode():
            for turn in range(repeats + 1):  # turn 0 warms up
                turn_walls = {}
                for name, fn in phases.items():
                    turn_walls[name], cpu = _timed(fn)
                    if turn:
                        walls[name].append(turn_walls[name])
                        cpus[name].append(cpu)
                if rank == 0:
                    print(f"[decoder-bench] guidance turn {turn}/{repeats}" + (" (warm-up)" if not turn else "") + ": "
                          + ", ".join(f"{k} {v:.2f} s" for k, v in turn_walls.items()), flush=True)  # fmt: skip
        if rank == 0:
            result = {"walls_s": walls, "cpu_s": cpus, "equal": bool(torch.equal(outputs["one"], outputs["two"])),
                      "max_abs_diff": max_abs_diff(outputs["two"], outputs["one"])}  # fmt: skip
            (Path(work) / "result.json").write_text(json.dumps(result))
    finally:
        destroy_group(member)


def bench_guidance(ours: FluxDiT, job: Job, positions: torch.Tensor, *, repeats: int) -> dict[str, Any]:
    """Save the model and the input where the 2 ranks load them, spawn them, read rank 0's result."""
    with tempfile.TemporaryDirectory(prefix="decoder-bench-") as work:
        (Path(work) / "config.json").write_text(json.dumps(ours.config.to_dict()))
        save_file({k: v.contiguous() for k, v in ours.state_dict().items()}, str(Path(work) / "model.safetensors"))
        inputs = {"x": job.x, "positions": positions, "timestep": job.timestep, "vec": job.vec}
        save_file({k: v.contiguous() for k, v in inputs.items()}, str(Path(work) / "inputs.safetensors"))
        spawn_args = (2, f"file://{work}/rendezvous", work, repeats)
        mp.start_processes(_guidance_rank, args=spawn_args, nprocs=2, start_method="spawn")
        raw = json.loads((Path(work) / "result.json").read_text())
    if not raw["equal"]:
        raise AssertionError(f"guidance: 2 ranks differ from 1 by {raw['max_abs_diff']:.3g} (they must be equal)")
    walls = {name: summarize(ts) for name, ts in raw["walls_s"].items()}
    for name, ts in raw["cpu_s"].items():
        walls[name]["cpu_s_median"] = statistics.median(ts)
    return {
        **walls,
        "equal": True,
        "speedup": walls["one_rank"]["median_s"] / walls["two_ranks"]["median_s"],
        "speedup_best": walls["one_rank"]["min_s"] / walls["two_ranks"]["min_s"],
    }


# ---------------------------------------------------------------------------------------------
# Report.


def table(results: dict[str, Any], cores: int) -> str:
    rows = ["| benchmark | variant | median (s) | min (s) | speedup | target |", "|---|---|---:|---:|---:|---|"]

    def row(bench: str, variant: str, r: dict[str, Any], speedup: str, target: str = "") -> None:
        rows.append(f"| {bench} | {variant} | {r['median_s']:.2f} | {r['min_s']:.2f} | {speedup} | {target} |")

    if "dit" in results:
        r = results["dit"]
        row("a. one DiT forward, batch 1", "diffusers FluxTransformer2DModel", r["diffusers"], "1.00x")
        row("", "**ours (FluxDiT)**", r["ours"], f"**{r['speedup']:.2f}x**", ">= 1.00x")
    if "ulysses" in results:
        r = results["ulysses"]
        n, t = r["ranks"], r["threads_per_rank"]
        row(f"b. Ulysses, {n} gloo ranks (i)", f"1 rank, {t} thread(s)", r["one_rank_share"], "1.00x")
        row("", f"**{n} ranks, {t} thread(s) each**", r["sharded"], f"**{r['speedup_same_threads_per_rank']:.2f}x**",
            ">= 1.60x")  # fmt: skip
        row(f"b. Ulysses, {n} gloo ranks (ii)", f"1 rank, {cores} threads", r["one_rank_all"], "1.00x")
        row("", f"**{n} ranks, {t} thread(s) each**", r["sharded"], f"**{r['speedup_same_total_cores']:.2f}x**")
    if "cfg" in results:
        r = results["cfg"]
        row("c. guidance step (2 passes)", "2 batch-1 forwards, sequential", r["sequential"], "1.00x")
        row("", "**one batch-2 forward**", r["batched"], f"**{r['speedup']:.2f}x**")
    if "jobs" in results:
        r = results["jobs"]
        row(f"d. {NUM_JOBS} concurrent jobs, per step", f"{NUM_JOBS} batch-1 forwards, sequential", r["sequential"],
            "1.00x")  # fmt: skip
        row("", f"**one batch-{NUM_JOBS} forward**", r["batched"], f"**{r['speedup']:.2f}x**")
    if "guidance" in results:
        r = results["guidance"]
        row("e. guided step, 2 passes", "1 rank, 1 thread, passes in turn", r["one_rank"], "1.00x")
        row("", "**2 ranks, 1 thread each, passes at once**", r["two_ranks"],
            f"**{r['speedup']:.2f}x** (min/min {r['speedup_best']:.2f}x)", ">= 1.70x")  # fmt: skip
    return "\n".join(rows)


def _relative(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=1, help="single-stream blocks (the reference has 35)")
    ap.add_argument("--grid", type=int, default=64, help="token grid side: grid^2 tokens (64: 4,096)")
    ap.add_argument("--patch", type=int, choices=(1, 2), default=1,
                    help="latent pixels per token each way: 1 (the reference's default) or 2 (diffusers' packing)")
    ap.add_argument("--repeats", type=int, default=3, help="measured rounds; the median is reported")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads for a, c and d, and the cores b splits (default: os.cpu_count())")
    ap.add_argument("--ranks", type=int, default=2, help="gloo ranks for b")
    ap.add_argument("--benchmarks", default=",".join(BENCHMARKS), help=f"a subset of {','.join(BENCHMARKS)}")
    ap.add_argument("--tol", type=float, default=1e-4, help="max abs difference the equality checks allow")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write a JSON report here")
    return ap  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    chosen = [b for b in args.benchmarks.split(",") if b]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown or not chosen:
        raise SystemExit(f"--benchmarks: unknown {unknown}; choose from {','.join(BENCHMARKS)}")
    if args.repeats < 1 or args.depth < 1 or args.grid < 1 or args.ranks < 2:
        raise SystemExit("--repeats, --depth and --grid must be >= 1, --ranks >= 2")
    cores = args.threads or os.cpu_count() or 1
    torch.set_num_threads(cores)
    config = reference_config(args.depth, args.patch)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    load: dict[str, list[float]] = {"start": list(os.getloadavg())}

    t0 = time.perf_counter()
    theirs, ours = make_models(config, args.seed)
    jobs, positions = make_jobs(config, args.grid, args.seed + 1)
    build_s = time.perf_counter() - t0
    num_params = sum(p.numel() for p in ours.parameters())
    print(
        f"[decoder-bench] depth {config.num_layers}, hidden {config.hidden_size} ({config.num_heads} heads x "
        f"{config.head_dim}), patch {config.patch}, {positions.shape[0]:,} tokens ({args.grid}x{args.grid}), "
        f"{num_params / 1e6:.1f}M params, fp32, {cores} threads, {args.repeats} repeats, tol {args.tol:g}; "
        f"built in {build_s:.1f} s; load average {load['start'][0]:.2f}",
        flush=True,
    )

    results: dict[str, Any] = {}
    if {"dit", "cfg", "jobs"} & set(chosen):
        t0 = time.perf_counter()
        results.update(
            bench_in_process(theirs, ours, jobs, positions, chosen=set(chosen), repeats=args.repeats, tol=args.tol)
        )
        load["after_in_process"] = list(os.getloadavg())
        diffs = ", ".join(f"{name} {results[name]['max_abs_diff']:.2e}" for name in ("cfg", "jobs") if name in results)
        print(f"[decoder-bench] in-process part done in {time.perf_counter() - t0:.0f} s"
              + (f"; batched = sequential within {diffs}" if diffs else ""), flush=True)  # fmt: skip
    del theirs
    if "ulysses" in chosen:
        t0 = time.perf_counter()
        results["ulysses"] = bench_ulysses(
            ours, jobs[0], positions, ranks=args.ranks, cores=cores, repeats=args.repeats, tol=args.tol
        )
        load["after_ulysses"] = list(os.getloadavg())
        print(f"[decoder-bench] ulysses done in {time.perf_counter() - t0:.0f} s; {args.ranks} ranks = 1 rank "
              f"within {results['ulysses']['max_abs_diff']:.2e}", flush=True)  # fmt: skip

    if "guidance" in chosen:
        t0 = time.perf_counter()
        results["guidance"] = bench_guidance(ours, jobs[0], positions, repeats=args.repeats)
        load["after_guidance"] = list(os.getloadavg())
        print(f"[decoder-bench] guidance done in {time.perf_counter() - t0:.0f} s; 2 ranks = 1 rank bit for bit",
              flush=True)  # fmt: skip

    print()
    print(table(results, cores))
    print("\nload average (1 min): " + ", ".join(f"{k} {v[0]:.2f}" for k, v in load.items()))

    if args.out is not None:
        report = {
            "schema": SCHEMA,
            "created": stamp,
            "command": " ".join([_relative(sys.executable), *sys.argv]) if argv is None else None,
            "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
            "config": dataclasses.asdict(config),
            "num_tokens": positions.shape[0],
            "num_params": num_params,
            "model_build_s": build_s,
            "host": {
                "cpus": os.cpu_count(),
                "torch_threads": cores,
                "machine": platform.machine(),
                "processor": platform.processor(),
                "python": platform.python_version(),
            },
            "versions": {"torch": torch.__version__, "diffusers": _diffusers_version()},
            "loadavg": load,
            **results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1))
        print(f"wrote {args.out}")
    return 0


def _diffusers_version() -> str:
    import diffusers  # noqa: PLC0415

    return str(diffusers.__version__)


if __name__ == "__main__":
    sys.exit(main())
