#!/usr/bin/env python3
"""Vision tower micro-benchmark: batched patch embedding, and packing several requests' images.

Two claims about gpu_workers/models/qwen2_5_vl_vision.py, each measured against the way the
reference deployment did it, on the same seeded random weights:

1. Patch embedding. Ours (`PatchEmbed`) is one Linear over every patch of every image. The
   reference deployment, before its fix, looped over the patches and called its Conv3d
   (kernel == stride == (temporal_patch, patch, patch)) once per patch: 784 calls for a
   392x392 image (28x28 patches). Measured (a) the embedding alone, with transformers' one
   Conv3d call over all patches as a third, informative row, and (b) the whole vision forward
   with each embedding. The Conv3d holds the Linear's weight reshaped, and the outputs must
   agree within --tol, so both sides do the same work.
2. Packing. Four images of different sizes, standing for four concurrent requests: ONE packed
   forward (attention kept inside each image and window) against FOUR separate forwards. The
   packed output must equal the separate ones within --tol.

The tower has the reference widths (hidden 1280, 16 heads, MLP 3456, merger 5120, patch 14,
temporal patch 2, merge 2, window 112; /work/shared/REFERENCE_MODEL.md) at a depth set by
--depth (the reference has 32). Full-attention blocks are those with index % 8 == 7, as in the
reference (7/15/23/31), or just the last block when the depth is below 8: the default depth 2
has one window block and one full-attention block. Weights are seeded random, scaled like
tests/gpu_workers/models/test_qwen2_5_vl_vision.py does (norm gains 1 + 0.2 N(0,1); there every other
weight is 0.15 N(0,1) at width 64, here a matrix gets 1.2 N(0,1)/sqrt(fan_in), the same at
width 64, so that activations stay of order 1 at width 1280 as well).

Timing: inference_mode, --warmup unmeasured rounds, then --repeats measured rounds; the
variants being compared alternate within each round, so background load hits them alike.
Reported: median (and min) seconds, patches per second, speedups from medians. Prints a
markdown table and writes bench/results/vision_encoder_<UTC time>.json. On a shared 2-core
machine the figures are only indicative: the 1-minute load average before and after is recorded.

    .venv/bin/python bench/vision_encoder_bench.py                     # defaults: depth 2, 5 repeats, CPU fp32
    .venv/bin/python bench/vision_encoder_bench.py --depth 32 --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without an install
    sys.path.insert(0, str(ROOT))

from gpu_workers.models.qwen2_5_vl_vision import (  # noqa: E402
    PatchEmbed,
    Qwen2_5_VisionEncoder,
    VisionEncoderConfig,
)
from gpu_workers.preprocess.image import ImageProcessingConfig, ImageProcessor  # noqa: E402

SCHEMA = "vision-encoder-bench/1"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# equality bounds on the max abs difference, per dtype (outputs are of order 1, see make_encoder)
DEFAULT_TOL = {"float32": 1e-4, "bfloat16": 1e-1, "float16": 2e-2}
EMBED_IMAGE = "392x392"  # 28x28 = 784 patches
PACKED_IMAGES = "392x392,448x336,280x504,336x336"  # width x height; 784 + 768 + 720 + 576 patches


def reference_config(depth: int) -> VisionEncoderConfig:
    """The reference vision tower's widths at the given depth (no projector)."""
    if depth < 1:
        raise ValueError(f"depth must be positive, got {depth}")
    full = tuple(i for i in range(depth) if i % 8 == 7) or (depth - 1,)
    return VisionEncoderConfig(
        depth=depth,
        hidden_size=1280,
        num_heads=16,
        intermediate_size=3456,
        out_hidden_size=5120,
        fullatt_block_indexes=full,
        patch_size=14,
        temporal_patch_size=2,
        spatial_merge_size=2,
        window_size=112,
    )


def make_encoder(
    config: VisionEncoderConfig, seed: int, device: torch.device, dtype: torch.dtype
) -> Qwen2_5_VisionEncoder:
    """Seeded random weights scaled as the tests scale them (module docstring)."""
    torch.manual_seed(seed)
    model = Qwen2_5_VisionEncoder(config).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if name.endswith(("norm1.weight", "norm2.weight", "ln_q.weight")):
                p.copy_(1.0 + 0.2 * noise)
            elif p.dim() == 2:
                p.copy_(noise * (1.2 / p.shape[1] ** 0.5))
            else:
                p.copy_(0.15 * noise)
    return model.to(device=device, dtype=dtype)


class Conv3dPatchEmbed(nn.Module):
    """A Conv3d patch embedding holding the same weight as a PatchEmbed's Linear.

    per_patch=True is the reference deployment's pre-fix embedding: one Conv3d call per patch
    (N calls). per_patch=False is transformers' Qwen2.5-VL: one Conv3d call over all N patches.
    Either way (N, C*T*P*P) -> (N, hidden), the same map as PatchEmbed.
    """

    def __init__(self, embed: PatchEmbed, config: VisionEncoderConfig, per_patch: bool) -> None:
        super().__init__()
        weight = embed.proj.weight  # (hidden, C*T*P*P)
        t, p = config.temporal_patch_size, config.patch_size
        self.volume = (config.in_channels, t, p, p)
        self.per_patch = per_patch
        self.proj = nn.Conv3d(
            config.in_channels, config.hidden_size, kernel_size=(t, p, p), stride=(t, p, p), bias=False,
            device=weight.device, dtype=weight.dtype,
        )  # fmt: skip
        with torch.no_grad():
            self.proj.weight.copy_(weight.view(config.hidden_size, *self.volume))

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        x = pixel_values.to(self.proj.weight.dtype)
        if self.per_patch:
            return torch.cat([self.proj(patch.view(1, *self.volume)).view(1, -1) for patch in x])
        return self.proj(x.view(-1, *self.volume)).view(x.shape[0], -1)


@contextlib.contextmanager
def swapped_patch_embed(model: Qwen2_5_VisionEncoder, embed: nn.Module) -> Iterator[None]:
    """Run the model with another patch embedding in place of its PatchEmbed."""
    original = model.patch_embed
    model.patch_embed = embed  # type: ignore[assignment]  # any (N, C*T*P*P) -> (N, hidden) module
    try:
        yield
    finally:
        model.patch_embed = original


def parse_sizes(spec: str) -> list[tuple[int, int]]:
    """"392x392,448x336" -> [(392, 392), (448, 336)] as (width, height)."""
    sizes = []
    for item in spec.split(","):
        w, h = item.lower().split("x")
        sizes.append((int(w), int(h)))
    return sizes


def make_inputs(
    sizes: Sequence[tuple[int, int]], seed: int, processor: ImageProcessor, device: torch.device
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Seeded random RGB images of the given (width, height) through ImageProcessor.preprocess:
    one (pixel_values, grid_thw) pair per image, on the device, pixel_values float32."""
    rng = np.random.default_rng(seed)
    out = []
    for w, h in sizes:
        image = Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8), mode="RGB")
        pixels, grid = processor.preprocess([image])
        out.append((pixels.to(device), grid))
    return out


def pack(inputs: Sequence[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([p for p, _ in inputs]), torch.cat([g for _, g in inputs])


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


def synchronizer(device: torch.device) -> Callable[[], None]:
    return torch.cuda.synchronize if device.type == "cuda" else (lambda: None)


def measure(
    fns: dict[str, Callable[[], Any]], warmup: int, repeats: int, sync: Callable[[], None]
) -> dict[str, list[float]]:
    """Seconds per call of each fn; the fns alternate within each round."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for round_ in range(warmup + repeats):
        for name, fn in fns.items():
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if round_ >= warmup:
                times[name].append(time.perf_counter() - t0)
    return times


def summarize(times: list[float], patches: int) -> dict[str, Any]:
    median = statistics.median(times)
    return {
        "median_s": median,
        "min_s": min(times),
        "times_s": times,
        "patches": patches,
        "patches_per_s": patches / median,
    }


def bench_patch_embed(
    model: Qwen2_5_VisionEncoder,
    pixels: torch.Tensor,
    grid_thw: torch.Tensor,
    *,
    warmup: int,
    repeats: int,
    tol: float,
    sync: Callable[[], None],
) -> dict[str, Any]:
    """Claim 1: PatchEmbed's one Linear against the per-patch Conv3d loop, alone and in the
    whole forward, after checking that both give the same outputs."""
    config = model.config
    per_patch = Conv3dPatchEmbed(model.patch_embed, config, per_patch=True)
    one_conv = Conv3dPatchEmbed(model.patch_embed, config, per_patch=False)
    n = pixels.shape[0]
    with torch.inference_mode():
        linear_out = model.patch_embed(pixels)
        embed_diff = check_equal("patch embedding: per-patch Conv3d vs Linear", per_patch(pixels), linear_out, tol)
        one_conv_diff = check_equal("patch embedding: one Conv3d call vs Linear", one_conv(pixels), linear_out, tol)
        forward_out = model(pixels, grid_thw)
        with swapped_patch_embed(model, per_patch):
            forward_loop_out = model(pixels, grid_thw)
        forward_diff = check_equal(
            "vision forward: per-patch Conv3d vs Linear embedding", forward_loop_out, forward_out, tol
        )

        embed_times = measure(
            {"linear": lambda: model.patch_embed(pixels), "conv3d_per_patch": lambda: per_patch(pixels),
             "conv3d_one_call": lambda: one_conv(pixels)},
            warmup, repeats, sync,
        )  # fmt: skip

        def forward_loop() -> torch.Tensor:
            with swapped_patch_embed(model, per_patch):
                return model(pixels, grid_thw)

        forward_times = measure(
            {"linear": lambda: model(pixels, grid_thw), "conv3d_per_patch": forward_loop}, warmup, repeats, sync
        )
    embed = {name: summarize(t, n) for name, t in embed_times.items()}
    forward = {name: summarize(t, n) for name, t in forward_times.items()}
    return {
        "grid_thw": grid_thw.tolist(),
        "patches": n,
        "conv3d_calls_per_patch_loop": n,
        "max_abs_diff": {
            "embed_per_patch_vs_linear": embed_diff,
            "embed_one_call_vs_linear": one_conv_diff,
            "forward_per_patch_vs_linear": forward_diff,
        },
        "output_abs_max": {"embed": linear_out.abs().max().item(), "forward": forward_out.abs().max().item()},
        "embed": embed,
        "forward": forward,
        "speedup_embed": embed["conv3d_per_patch"]["median_s"] / embed["linear"]["median_s"],
        "speedup_embed_vs_one_conv": embed["conv3d_one_call"]["median_s"] / embed["linear"]["median_s"],
        "speedup_forward": forward["conv3d_per_patch"]["median_s"] / forward["linear"]["median_s"],
    }


def bench_packing(
    model: Qwen2_5_VisionEncoder,
    inputs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    *,
    warmup: int,
    repeats: int,
    tol: float,
    sync: Callable[[], None],
) -> dict[str, Any]:
    """Claim 2: the images in one packed forward against one forward per image."""
    pixels, grid_thw = pack(inputs)
    n = pixels.shape[0]

    def separate() -> torch.Tensor:
        return torch.cat([model(p, g) for p, g in inputs])

    with torch.inference_mode():
        packed_out = model(pixels, grid_thw)
        diff = check_equal("packed forward vs separate forwards", packed_out, separate(), tol)
        times = measure({"packed": lambda: model(pixels, grid_thw), "separate": separate}, warmup, repeats, sync)
    result = {name: summarize(t, n) for name, t in times.items()}
    return {
        "grid_thw": grid_thw.tolist(),
        "patches": n,
        "output_tokens": packed_out.shape[0],
        "max_abs_diff_packed_vs_separate": diff,
        "output_abs_max": packed_out.abs().max().item(),
        **result,
        "speedup": result["separate"]["median_s"] / result["packed"]["median_s"],
    }


def table(embed: dict[str, Any], packing: dict[str, Any], embed_label: str, packing_label: str) -> str:
    rows = [
        "| benchmark | variant | median (ms) | min (ms) | patches/s | speedup (median) |",
        "|---|---|---:|---:|---:|---:|",
    ]

    def row(bench: str, variant: str, r: dict[str, Any], speedup: str) -> None:
        rows.append(
            f"| {bench} | {variant} | {r['median_s'] * 1e3:.2f} | {r['min_s'] * 1e3:.2f} | "
            f"{r['patches_per_s']:,.0f} | {speedup} |"
        )

    n = embed["patches"]
    b = f"patch embed only, {embed_label} ({n} patches)"
    row(b, f"per-patch Conv3d loop ({n} calls)", embed["embed"]["conv3d_per_patch"], "1.00x")
    row(b, "one Conv3d call (transformers)", embed["embed"]["conv3d_one_call"],
        f"{embed['embed']['conv3d_per_patch']['median_s'] / embed['embed']['conv3d_one_call']['median_s']:.2f}x")
    row(b, "**one Linear (ours)**", embed["embed"]["linear"], f"**{embed['speedup_embed']:.2f}x**")
    b = f"whole vision forward, {embed_label}"
    row(b, "per-patch Conv3d loop embedding", embed["forward"]["conv3d_per_patch"], "1.00x")
    row(b, "**one Linear (ours)**", embed["forward"]["linear"], f"**{embed['speedup_forward']:.2f}x**")
    b = f"{len(packing['grid_thw'])} requests, {packing_label} ({packing['patches']} patches)"
    row(b, f"{len(packing['grid_thw'])} separate forwards", packing["separate"], "1.00x")
    row(b, "**one packed forward (ours)**", packing["packed"], f"**{packing['speedup']:.2f}x**")
    return "\n".join(rows)


def _relative(path: str) -> str:
    p = Path(path)
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else path


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depth", type=int, default=2, help="vision blocks (the reference has 32)")
    ap.add_argument("--repeats", type=int, default=5, help="measured rounds; the median is reported")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (or cuda:N)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="float32")
    ap.add_argument("--tol", type=float, default=None,
                    help="max abs difference allowed by the equality checks (default: 1e-4 for float32, 1e-1 "
                         "bfloat16, 2e-2 float16)")  # fmt: skip
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--embed-image", default=EMBED_IMAGE, help="WxH of the image of benchmark 1")
    ap.add_argument("--images", default=PACKED_IMAGES, help="WxH,... of the images packed in benchmark 2")
    ap.add_argument("--out", type=Path, default=None,
                    help="JSON report (default: bench/results/vision_encoder_<UTC time>.json)")  # fmt: skip
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.repeats < 1 or args.warmup < 0:
        raise SystemExit("--repeats must be >= 1 and --warmup >= 0")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    dtype = DTYPES[args.dtype]
    tol = args.tol if args.tol is not None else DEFAULT_TOL[args.dtype]
    sync = synchronizer(device)
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = args.out or ROOT / "bench" / "results" / f"vision_encoder_{stamp}.json"

    load_before = os.getloadavg()
    config = reference_config(args.depth)
    t0 = time.perf_counter()
    model = make_encoder(config, args.seed, device, dtype)
    build_s = time.perf_counter() - t0
    processor = ImageProcessor(ImageProcessingConfig())
    embed_label, packing_label = args.embed_image, args.images.replace(",", ", ")
    [(embed_pixels, embed_grid)] = make_inputs(parse_sizes(args.embed_image), args.seed + 1, processor, device)
    packed_inputs = make_inputs(parse_sizes(args.images), args.seed + 2, processor, device)
    num_params = sum(p.numel() for p in model.parameters())
    print(
        f"[vision-bench] depth {config.depth} (full attention at {list(config.fullatt_block_indexes)}), "
        f"{num_params / 1e6:.1f}M params, {args.device} {args.dtype}, {torch.get_num_threads()} threads, "
        f"warmup {args.warmup}, repeats {args.repeats}, tol {tol:g}",
        flush=True,
    )

    t0 = time.perf_counter()
    embed = bench_patch_embed(
        model, embed_pixels, embed_grid, warmup=args.warmup, repeats=args.repeats, tol=tol, sync=sync
    )
    print(f"[vision-bench] patch embedding done in {time.perf_counter() - t0:.1f} s; outputs equal "
          f"(max abs diff: embed {embed['max_abs_diff']['embed_per_patch_vs_linear']:.2e}, forward "
          f"{embed['max_abs_diff']['forward_per_patch_vs_linear']:.2e})", flush=True)  # fmt: skip
    t0 = time.perf_counter()
    packing = bench_packing(model, packed_inputs, warmup=args.warmup, repeats=args.repeats, tol=tol, sync=sync)
    print(f"[vision-bench] packing done in {time.perf_counter() - t0:.1f} s; outputs equal "
          f"(max abs diff {packing['max_abs_diff_packed_vs_separate']:.2e})", flush=True)  # fmt: skip
    load_after = os.getloadavg()

    print()
    print(table(embed, packing, embed_label, packing_label))
    print(f"\nload average (1 min) before {load_before[0]:.2f}, after {load_after[0]:.2f}")

    report = {
        "schema": SCHEMA,
        "created": stamp,
        "command": " ".join([_relative(sys.executable), *sys.argv]) if argv is None else None,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "tol": tol,
        "config": dataclasses.asdict(config),
        "num_params": num_params,
        "model_build_s": build_s,
        "host": {
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "machine": platform.machine(),
            "processor": platform.processor(),
            "python": platform.python_version(),
            "cuda_device": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        },
        "versions": {"torch": torch.__version__, "numpy": np.__version__},
        "loadavg_before_after": [load_before, load_after],
        "patch_embed": embed,
        "packing": packing,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
