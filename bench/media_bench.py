#!/usr/bin/env python3
"""Image chat requests end to end: encoder batching across requests, and the encoder cache.

Builds (once, under bench/.cache/) a "bench-size" omni checkpoint: the tiny hyperclovax LLM and
the tiny audio encoder / image tokenizer / audio tokenizer of gpu_workers.tiny.checkpoints, but a
Qwen2.5-VL vision tower wide enough that encoding costs real time on a CPU (default: hidden 640,
10 heads, MLP 1728, depth 4 with full attention at the last block, window 112, merger out 2560,
a projector to the LLM width; preprocessor min_pixels 3136, max_pixels 448*448). Then starts
`bin/omni-serve --model NAME=DIR --store local:<fresh tmp dir> --port <free>` (default flags
otherwise, log to a file), waits for /health, sends one unmeasured warm-up request (its own
image) and runs three phases with the official `openai` AsyncOpenAI client, streaming with
`stream_options.include_usage`, temperature 0:

  cold        --requests chat requests, each with a DIFFERENT random PNG (data: URL) and a
              short text, at --concurrency: concurrent requests share encoder forwards
  warm        the same requests again (same images, same texts): every image must be an
              encoder-cache hit (checked: misses must not grow) and the prompt a prefix-cache hit
  seq-cold    --sequential new distinct images, one request at a time: the encoder's cost
              per item without cross-request batching, to compare with `cold`

Per phase, from the client: requests/s, TTFT p50/p90/mean (first non-empty content delta),
E2E p50/p90, mean usage.prompt_tokens_details.cached_tokens; from /metrics diffs around the
phase: encoder cache hits/misses, encoder batches (omni_encoder_batch_seconds count), items per
vision_encoder forward (omni_encoder_batch_size sum/count), mean vision_encoder forward seconds
(omni_encoder_forward_seconds) and forward seconds per item. Every image is also encoded by the
tiny image_tokenizer (the chat template asks for both representations); its figures are in the
JSON. Prints a markdown table; writes bench/results/media_<UTC time>.json.

    .venv/bin/python bench/media_bench.py                          # defaults: ~2-3 min on 2 CPU cores
    .venv/bin/python bench/media_bench.py --requests 8 --concurrency 4 --sequential 2 --vision-depth 2
    .venv/bin/python bench/media_bench.py --vision-depth 8 --vision-hidden 1280 --num-threads 2

The server always stops (SIGTERM to its process group, SIGKILL after --stop-timeout), also on
errors and Ctrl-C. Its log is deleted after a clean run unless --keep-server-log (then, and on
any failure, it is kept under bench/results/logs/). On a shared 2-core machine the figures are
only indicative: the 1-minute load average before and after is recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import io
import json
import os
import platform
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere, without an install
    sys.path.insert(0, str(ROOT))

SCHEMA = "media-bench/1"
CHECKPOINT_VERSION = 1  # bump when the builder's bytes change
MODEL = "omni-bench"
CACHE = ROOT / "bench" / ".cache"
RESULTS = ROOT / "bench" / "results"


# ---- the bench-size omni checkpoint ---------------------------------------------------------
def checkpoint_spec(args: argparse.Namespace) -> dict[str, Any]:
    depth, hidden = args.vision_depth, args.vision_hidden
    heads = args.vision_heads or max(1, hidden // 64)
    vision = {
        "model_type": "qwen2_5_vl_vision",
        "depth": depth,
        "hidden_size": hidden,
        "num_heads": heads,
        # the reference's ratios: MLP 3456 / 1280 = 2.7, merger out 5120 / 1280 = 4
        "intermediate_size": args.vision_mlp or int(round(hidden * 2.7)),
        "out_hidden_size": args.vision_out or 4 * hidden,
        # the reference's full-attention blocks are 7, 15, 23, 31; below depth 8 the last one
        "fullatt_block_indexes": [i for i in range(depth) if i % 8 == 7] or [depth - 1],
        "window_size": 112,
        "patch_size": 14,
        "temporal_patch_size": 2,
        "spatial_merge_size": 2,
        "in_channels": 3,
        "hidden_act": "silu",
        "projector_hidden_size": args.llm_hidden,
    }
    preprocessor = {
        "min_pixels": 3_136,
        "max_pixels": 448 * 448,
        "video_max_pixels": 56 * 56,
        "video_min_frames": 4,
        "video_frames_per_chunk": 32,
    }
    llm = {}
    if args.llm_hidden != 64 or args.llm_layers != 2:
        heads_llm = max(1, args.llm_hidden // 16)
        llm = {
            "hidden_size": args.llm_hidden,
            "num_hidden_layers": args.llm_layers,
            "num_attention_heads": heads_llm,
            "num_key_value_heads": max(1, heads_llm // 2),
            "head_dim": 16,
            "intermediate_size": 2 * args.llm_hidden,
        }
    return {"version": CHECKPOINT_VERSION, "seed": args.seed, "vision": vision,
            "preprocessor": preprocessor, "llm_overrides": llm}  # fmt: skip


def _vision_tensors(config: dict[str, Any], seed: int) -> dict[str, Any]:
    """Seeded random weights in transformers' names (5-D Conv3d patch weight), scaled so that
    activations stay of order one at any width: matrices N(0,1)/sqrt(fan_in), norm gains
    1 + 0.1 N(0,1), biases 0.02 N(0,1). (The tiny checkpoints' flat 0.15 grows the activations
    by ~4x per matrix at width 640; the LLM would then see huge embeddings.)"""
    import torch

    from gpu_workers.models.qwen2_5_vl_vision import Qwen2_5_VisionEncoder, VisionEncoderConfig

    vc = VisionEncoderConfig.from_hf(config)
    with torch.device("meta"):
        shapes = {n: tuple(t.shape) for n, t in Qwen2_5_VisionEncoder(vc).state_dict().items()}
    shapes["patch_embed.proj.weight"] = (
        vc.hidden_size, vc.in_channels, vc.temporal_patch_size, vc.patch_size, vc.patch_size
    )  # fmt: skip
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in sorted(shapes.items()):
        noise = torch.randn(shape, generator=gen)
        if "norm" in name or "ln_q" in name:
            tensors[name] = 1.0 + 0.1 * noise
        elif name.endswith(".bias"):
            tensors[name] = 0.02 * noise
        else:
            fan_in = 1
            for d in shape[1:]:
                fan_in *= d
            tensors[name] = noise / fan_in**0.5
    return tensors


def write_checkpoint(out: Path, spec: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    from gpu_workers.models.fsq_audio_tokenizer import make_tiny_audio_tokenizer
    from gpu_workers.models.ta_tok import make_tiny_image_tokenizer
    from gpu_workers.tiny.checkpoints import (
        TINY_AUDIO_LEVELS,
        TINY_IMAGE_CODEBOOK,
        make_tiny_audio_encoder,
        make_tiny_checkpoint,
    )

    seed = spec["seed"]
    num_units = 1
    for level in TINY_AUDIO_LEVELS:
        num_units *= level
    make_tiny_checkpoint(
        out / "llm", "hyperclovax", seed=seed, num_audio_codes=num_units, **spec["llm_overrides"]
    )
    vision_dir = out / "vision_encoder"
    vision_dir.mkdir(parents=True)
    tensors = _vision_tensors(spec["vision"], seed + 1)
    save_file(tensors, str(vision_dir / "model.safetensors"), metadata={"format": "pt"})
    (vision_dir / "config.json").write_text(json.dumps(spec["vision"], indent=2, sort_keys=True) + "\n")
    preprocessor = json.dumps(spec["preprocessor"], indent=2, sort_keys=True) + "\n"
    (vision_dir / "preprocessor_config.json").write_text(preprocessor)
    llm_width = spec["vision"]["projector_hidden_size"]
    make_tiny_audio_encoder(out / "audio_encoder", seed=seed + 2, projector_hidden_size=llm_width)
    make_tiny_image_tokenizer(out / "image_tokenizer", seed=seed + 3, codebook_size=TINY_IMAGE_CODEBOOK)
    make_tiny_audio_tokenizer(out / "audio_tokenizer", seed=seed + 4, levels=TINY_AUDIO_LEVELS)


def build_checkpoint(spec: dict[str, Any], cache: Path = CACHE) -> tuple[Path, bool]:
    """(directory, built now): bench/.cache/omni-media-<hash of spec>, built once (in a temp
    directory beside it, then renamed, so an interrupted build is never reused)."""
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    final = cache / f"omni-media-{digest}"
    marker = final / ".bench_ckpt.json"
    if marker.is_file() and json.loads(marker.read_text()) == spec:
        return final, False
    cache.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=cache))
    try:
        write_checkpoint(tmp, spec)
        (tmp / ".bench_ckpt.json").write_text(json.dumps(spec, sort_keys=True))
        if final.exists():
            shutil.rmtree(final)
        os.rename(tmp, final)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return final, True


# ---- server ---------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def http_get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


class Server:
    """bin/omni-serve in its own process group; stop() = SIGTERM, then SIGKILL."""

    def __init__(self, cmd: list[str], log_path: Path, stop_timeout: float) -> None:
        self.cmd = cmd
        self.log_path = log_path
        self.stop_timeout = stop_timeout
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: Any = None

    def start(self) -> None:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT,
                                     start_new_session=True, cwd=ROOT)  # fmt: skip

    def wait_healthy(self, base: str, timeout: float) -> float:
        started = time.monotonic()
        while True:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"omni-serve exited with {self.proc.returncode}; see {self.log_path}")
            try:
                status, _ = http_get(f"{base}/health", timeout=2)
                if status == 200:
                    return time.monotonic() - started
            except OSError:
                pass
            if time.monotonic() - started > timeout:
                raise TimeoutError(f"omni-serve not healthy after {timeout:.0f}s; see {self.log_path}")
            time.sleep(0.5)

    def stop(self) -> str:
        how = "not started"
        if self.proc is not None and self.proc.poll() is None:
            how = "SIGTERM"
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(self.stop_timeout)
            except subprocess.TimeoutExpired:
                how = "SIGKILL"
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
            except ProcessLookupError:
                pass
        elif self.proc is not None:
            how = f"had exited ({self.proc.returncode})"
        if self._log is not None:
            self._log.close()
            self._log = None
        return how


# ---- /metrics -------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    out: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m and not m.group(1).endswith("_created"):
            labels = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
            out[(m.group(1), labels)] = float(m.group(3))
    return out


def metric(snap: dict, name: str, **labels: str) -> float:
    """Sum of a metric's samples whose labels include the given ones."""
    want = set(labels.items())
    return sum(v for (n, ls), v in snap.items() if n == name and want <= ls)


def metrics_diff(before: dict, after: dict) -> dict[str, Any]:
    def d(name: str, **labels: str) -> float:
        return metric(after, name, model_name=MODEL, **labels) - metric(before, name, model_name=MODEL, **labels)

    out: dict[str, Any] = {"components": {}}
    for comp in ("vision_encoder", "image_tokenizer"):
        forwards = d("omni_encoder_batch_size_count", component=comp)
        items = d("omni_encoder_batch_size_sum", component=comp)
        fwd_s = d("omni_encoder_forward_seconds_sum", component=comp)
        out["components"][comp] = {
            "cache_hits": d("omni_encoder_cache_hits_total", component=comp),
            "cache_misses": d("omni_encoder_cache_misses_total", component=comp),
            "forwards": forwards,
            "items": items,
            "forward_seconds_total": fwd_s,
            "items_per_forward": items / forwards if forwards else None,
            "forward_s_mean": fwd_s / forwards if forwards else None,
            "forward_s_per_item": fwd_s / items if items else None,
        }
    batches = d("omni_encoder_batch_seconds_count")
    out["encoder_batches"] = batches
    out["encoder_batch_s_mean"] = d("omni_encoder_batch_seconds_sum") / batches if batches else None
    queried, hits = d("vllm:prefix_cache_queries_total"), d("vllm:prefix_cache_hits_total")
    out["prefix_cache"] = {
        "queried_tokens": queried, "hit_tokens": hits, "hit_rate": hits / queried if queried else None
    }  # fmt: skip
    return out


# ---- requests -------------------------------------------------------------------------------
def png_data_url(size: int, seed: int) -> str:
    import numpy as np
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (size, size, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels, mode="RGB").save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def make_request(i: int, image_seed: int, size: int, prefix: str) -> dict[str, Any]:
    return {
        "id": f"{prefix}{i}",
        "image_seed": image_seed,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": f"Picture {prefix}{i}: what does it show, in a few words?"},
            {"type": "image_url", "image_url": {"url": png_data_url(size, image_seed)}},
        ]}],
    }  # fmt: skip


async def one_request(client: Any, req: dict[str, Any], max_tokens: int, t0: float) -> dict[str, Any]:
    rec: dict[str, Any] = {"id": req["id"], "image_seed": req["image_seed"], "start_s": time.perf_counter() - t0}
    start = time.perf_counter()
    text: list[str] = []
    try:
        stream = await client.chat.completions.create(
            model=MODEL, messages=req["messages"], max_tokens=max_tokens, temperature=0,
            stream=True, stream_options={"include_usage": True},
        )  # fmt: skip
        async for chunk in stream:
            now = time.perf_counter() - start
            if chunk.choices:
                choice = chunk.choices[0]
                rec.setdefault("first_chunk_s", now)
                if choice.delta.content:
                    rec.setdefault("ttft_s", now)
                    text.append(choice.delta.content)
                if choice.finish_reason:
                    rec["finish_reason"] = choice.finish_reason
            if chunk.usage is not None:
                u = chunk.usage
                rec["prompt_tokens"] = u.prompt_tokens
                rec["completion_tokens"] = u.completion_tokens
                details = u.prompt_tokens_details
                rec["cached_tokens"] = (details.cached_tokens or 0) if details is not None else 0
        rec["e2e_s"] = time.perf_counter() - start
        rec.setdefault("ttft_s", rec.get("first_chunk_s", rec["e2e_s"]))  # no content at all: first chunk
        rec["text"] = "".join(text)
    except Exception as e:  # noqa: BLE001 (recorded; the phase goes on)
        rec["error"] = f"{type(e).__name__}: {e}"
        rec["e2e_s"] = time.perf_counter() - start
    return rec


async def run_phase(base: str, reqs: list[dict[str, Any]], concurrency: int, max_tokens: int,
                    timeout: float) -> tuple[list[dict[str, Any]], float]:  # fmt: skip
    from openai import AsyncOpenAI

    # the client's default pool (1000 connections) is far above any --concurrency
    async with AsyncOpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=timeout) as client:
        sem = asyncio.Semaphore(concurrency)
        t0 = time.perf_counter()

        async def bounded(req: dict[str, Any]) -> dict[str, Any]:
            async with sem:
                return await one_request(client, req, max_tokens, t0)

        records = await asyncio.gather(*(bounded(r) for r in reqs))
        return list(records), time.perf_counter() - t0


def pct(values: list[float], q: float) -> float | None:
    """Linear-interpolated percentile (numpy's default)."""
    if not values:
        return None
    xs = sorted(values)
    k = (len(xs) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(records: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    ok = [r for r in records if "error" not in r]
    ttft = [r["ttft_s"] for r in ok]
    e2e = [r["e2e_s"] for r in ok]
    cached = [r.get("cached_tokens", 0) for r in ok]
    prompt = [r.get("prompt_tokens", 0) for r in ok]
    return {
        "num_requests": len(records),
        "num_ok": len(ok),
        "num_failed": len(records) - len(ok),
        "wall_s": wall_s,
        "requests_per_s": len(ok) / wall_s if wall_s > 0 else None,
        "ttft_s": {"p50": pct(ttft, 50), "p90": pct(ttft, 90), "mean": statistics.fmean(ttft) if ttft else None},
        "e2e_s": {"p50": pct(e2e, 50), "p90": pct(e2e, 90), "mean": statistics.fmean(e2e) if e2e else None},
        "prompt_tokens_mean": statistics.fmean(prompt) if prompt else None,
        "cached_tokens_mean": statistics.fmean(cached) if cached else None,
        "completion_tokens_total": sum(r.get("completion_tokens", 0) for r in ok),
    }


# ---- report ---------------------------------------------------------------------------------
def fmt(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def table(phases: list[dict[str, Any]]) -> str:
    lines = [
        "| phase | requests | conc. | req/s | TTFT p50 (s) | TTFT p90 (s) | TTFT mean (s) | E2E p50 (s) | "
        "E2E p90 (s) | cached tok mean / prompt | enc. hits / misses | enc. batches | "
        "items / vision fwd | vision fwd (s) | vision s / item |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in phases:
        s, m = p["summary"], p["metrics"]
        v = m["components"]["vision_encoder"]
        lines.append(
            f"| {p['name']} | {s['num_ok']}/{s['num_requests']} | {p['concurrency']} | {fmt(s['requests_per_s'])} | "
            f"{fmt(s['ttft_s']['p50'])} | {fmt(s['ttft_s']['p90'])} | {fmt(s['ttft_s']['mean'])} | "
            f"{fmt(s['e2e_s']['p50'])} | {fmt(s['e2e_s']['p90'])} | "
            f"{fmt(s['cached_tokens_mean'], '.1f')} / {fmt(s['prompt_tokens_mean'], '.1f')} | "
            f"{int(v['cache_hits'])} / {int(v['cache_misses'])} | {int(m['encoder_batches'])} | "
            f"{fmt(v['items_per_forward'])} | {fmt(v['forward_s_mean'], '.3f')} | "
            f"{fmt(v['forward_s_per_item'], '.3f')} |"
        )
    return "\n".join(lines)


def loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform(), "cpus": str(os.cpu_count())}
    for mod in ("torch", "openai", "numpy", "PIL"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = "?"
    try:
        out["git"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                                    text=True, check=False).stdout.strip()  # fmt: skip
    except OSError:
        pass
    return out


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=24, help="cold (and warm) requests, one distinct image each")
    p.add_argument("--concurrency", type=int, default=8, help="of the cold and warm phases")
    p.add_argument("--sequential", type=int, default=8, help="requests of the sequential-cold phase (0: skip)")
    p.add_argument("--image-size", type=int, default=336, help="side of the square random PNGs, pixels")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--vision-depth", type=int, default=4)
    p.add_argument("--vision-hidden", type=int, default=640)
    p.add_argument("--vision-heads", type=int, help="default: hidden / 64")
    p.add_argument("--vision-mlp", type=int, help="default: 2.7 x hidden (the reference's ratio)")
    p.add_argument("--vision-out", type=int, help="merger output width; default: 4 x hidden")
    p.add_argument("--llm-hidden", type=int, default=64, help="LLM width (64, 2 layers: the tiny hyperclovax)")
    p.add_argument("--llm-layers", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="weights seed")
    p.add_argument("--num-threads", type=int, help="passed to omni-serve (torch threads per CPU worker)")
    p.add_argument("--server-arg", action="append", default=[],
                   help="extra omni-serve argument, e.g. --server-arg=--max-num-seqs=4 (repeatable)")  # fmt: skip
    p.add_argument("--keep-server-log", action="store_true", help="keep the server log under bench/results/logs/")
    p.add_argument("--out", type=Path, help="JSON path (default bench/results/media_<UTC time>.json)")
    p.add_argument("--timeout", type=float, default=300.0, help="per request, seconds")
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--stop-timeout", type=float, default=30.0, help="seconds after SIGTERM before SIGKILL")
    args = p.parse_args(argv)
    for name in ("requests", "concurrency", "image_size", "max_tokens", "vision_depth", "vision_hidden"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if args.sequential < 0:
        p.error("--sequential must be >= 0")
    return args


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)  # so the finally below stops the server
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out_path = args.out or RESULTS / f"media_{stamp}.json"
    load_before = loadavg()
    t_start = time.perf_counter()

    spec = checkpoint_spec(args)
    from gpu_workers.models.qwen2_5_vl_vision import VisionEncoderConfig

    VisionEncoderConfig.from_hf(spec["vision"])  # a bad --vision-* combination fails here, not in the server
    t = time.perf_counter()
    ckpt, built = build_checkpoint(spec)
    print(f"[media-bench] checkpoint {ckpt} ({'built' if built else 'cached'}, {time.perf_counter() - t:.1f}s)",
          flush=True)  # fmt: skip

    # Requests first (PNG encoding is client work, not to be timed inside a phase).
    n = args.requests
    warmup = [make_request(0, 999_999, args.image_size, "warmup-")]
    cold = [make_request(i, 1_000 + i, args.image_size, "r") for i in range(n)]
    seq = [make_request(i, 100_000 + i, args.image_size, "s") for i in range(args.sequential)]
    image_bytes = [len(r["messages"][0]["content"][1]["image_url"]["url"]) for r in cold]

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    store_dir = Path(tempfile.mkdtemp(prefix="media-bench-store-"))
    log_dir = RESULTS / "logs"
    log_path = Path(tempfile.mkstemp(prefix="media-bench-", suffix=".server.log")[1])
    cmd = [str(ROOT / "bin" / "omni-serve"), "--model", f"{MODEL}={ckpt}", "--store", f"local:{store_dir}",
           "--port", str(port)]  # fmt: skip
    if args.num_threads:
        cmd += ["--num-threads", str(args.num_threads)]
    cmd += args.server_arg
    server = Server(cmd, log_path, args.stop_timeout)
    phases: list[dict[str, Any]] = []
    result: dict[str, Any] = {}
    ok = False
    stopped = "not started"
    try:
        print(f"[media-bench] {' '.join(cmd)}", flush=True)
        server.start()
        ready_s = server.wait_healthy(base, args.start_timeout)
        print(f"[media-bench] healthy after {ready_s:.1f}s", flush=True)

        def snapshot() -> dict:
            status, text = http_get(f"{base}/metrics")
            if status != 200:
                raise RuntimeError(f"/metrics answered {status}")
            return parse_metrics(text)

        def phase(name: str, reqs: list[dict[str, Any]], concurrency: int) -> dict[str, Any]:
            before = snapshot()
            records, wall = asyncio.run(run_phase(base, reqs, concurrency, args.max_tokens, args.timeout))
            after = snapshot()
            out: dict[str, Any] = {"name": name, "concurrency": concurrency, "summary": summarize(records, wall),
                   "metrics": metrics_diff(before, after), "records": records}  # fmt: skip
            s = out["summary"]
            print(f"[media-bench] {name}: {s['num_ok']}/{s['num_requests']} ok in {wall:.1f}s", flush=True)
            for r in records:
                if "error" in r:
                    print(f"[media-bench]   {r['id']}: {r['error']}", file=sys.stderr)
            return out

        warm_up = phase("warm-up", warmup, 1)
        if warm_up["summary"]["num_failed"]:
            raise RuntimeError(f"warm-up request failed: {warm_up['records'][0]['error']}")
        phases.append(phase("cold", cold, args.concurrency))
        phases.append(phase("warm", cold, args.concurrency))
        if seq:
            phases.append(phase("seq-cold", seq, 1))

        by_name = {p["name"]: p for p in phases}
        cold_text = {r["id"]: r.get("text") for r in by_name["cold"]["records"]}
        warm_m = by_name["warm"]["metrics"]["components"]
        checks = {
            "no_failed_requests": all(p["summary"]["num_failed"] == 0 for p in phases),
            "warm_no_encoder_misses": all(c["cache_misses"] == 0 for c in warm_m.values()),
            "warm_all_encoder_hits": warm_m["vision_encoder"]["cache_hits"] == n,
            "warm_no_encoder_forwards": by_name["warm"]["metrics"]["encoder_batches"] == 0,
            "cold_all_encoder_misses": by_name["cold"]["metrics"]["components"]["vision_encoder"]["cache_misses"] == n,
            "warm_prefix_cache_hits": (by_name["warm"]["summary"]["cached_tokens_mean"] or 0) > 0,
            # informative (random fp32 weights, other batch shapes may flip a near-tie): not required
            "warm_same_text_as_cold": sum(r.get("text") == cold_text.get(r["id"]) for r in by_name["warm"]["records"]),
        }
        required = [k for k in checks if k != "warm_same_text_as_cold"]
        ok = all(checks[k] for k in required)
        result = {"checks": checks, "server_ready_s": ready_s, "warm_up": warm_up}
    except KeyboardInterrupt as e:
        print(f"[media-bench] interrupted ({e})", file=sys.stderr)
        result = {"error": f"interrupted: {e}"}
    except Exception as e:  # noqa: BLE001 (recorded, the server still stops)
        print(f"[media-bench] error: {type(e).__name__}: {e}", file=sys.stderr)
        result = {"error": f"{type(e).__name__}: {e}"}
    finally:
        stopped = server.stop()
        shutil.rmtree(store_dir, ignore_errors=True)
        kept_log = None
        if args.keep_server_log or not ok:
            log_dir.mkdir(parents=True, exist_ok=True)
            kept_log = log_dir / f"media-{stamp}.server.log"
            shutil.move(str(log_path), kept_log)
            print(f"[media-bench] server log: {kept_log}", file=sys.stderr)
        else:
            log_path.unlink(missing_ok=True)

    load_after = loadavg()
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "time_utc": stamp,
        "ok": ok,
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "server_cmd": cmd,
        "server_stopped_by": stopped,
        "server_log": str(kept_log) if kept_log else None,
        "checkpoint": {"dir": str(ckpt), "built_now": built, "spec": spec},
        "image_data_url_chars_mean": statistics.fmean(image_bytes),
        "loadavg_1m_before_after": [load_before, load_after],
        "total_s": time.perf_counter() - t_start,
        "versions": versions(),
        "phases": phases,
        **result,
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(report, indent=1) + "\n")
    if phases:
        print()
        print(table(phases))
        print()
    cold_p = next((p for p in phases if p["name"] == "cold"), None)
    seq_p = next((p for p in phases if p["name"] == "seq-cold"), None)
    if cold_p and seq_p:
        a = cold_p["metrics"]["components"]["vision_encoder"]["forward_s_per_item"]
        b = seq_p["metrics"]["components"]["vision_encoder"]["forward_s_per_item"]
        if a and b:
            print(f"vision_encoder forward seconds per item: batched (cold) {a:.3f}, one at a time (seq-cold) "
                  f"{b:.3f}: {b / a:.2f}x")  # fmt: skip
    if "checks" in result:
        print("checks: " + ", ".join(f"{k}={v}" for k, v in result["checks"].items()))
    print(f"load average (1 min) before/after: {fmt(load_before)} / {fmt(load_after)}; total {report['total_s']:.0f}s")
    print(f"wrote {out_path}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
