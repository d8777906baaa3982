"""Which int8 Linear kernel to serve `--quantization int8` with on CPU: a decode step's linear layers.

The decoder's linear layers of the ~100M qwen2 benchmark checkpoint (bench/make_checkpoint.py:
hidden 768, 12 layers, q|k|v 768->1280, o 768->768, gate|up 768->5888, down 2944->768) run as a
chain over a decode batch of --rows rows (32), with each layer's own weights (so the weights
stream from memory, as in a real step). Every candidate runs the same chain; the candidates are
interleaved, in a fresh random order each round, so a busy machine slows all of them alike: read
the ratios to bf16 (oneDNN-packed, what `--dtype bfloat16` serves today) side by side.

Candidates (those whose package or op is missing are skipped, and say so):
  fp32 / bf16          torch's F.linear (MKL)
  fp32-packed / bf16-packed   oneDNN with the weight reordered once (gpu_workers/models/packed_linear.py)
  woq-bf16 / woq-fp32  torch._weight_int8pack_mm: int8 weight, per-channel scale, float activations
  split-bf16 / split-fp32  what `--quantization int8` serves on a VNNI CPU (models/int8_linear.py):
                       oneDNN's u8 x s8 GEMM, each activation row split in a high and a low int8
                       part (2x the rows); split-bf16-compiled: the chain through inductor, as
                       the compiled decode step runs it (the split fused, the GEMM opaque)
  onednn-da8-fp32/-bf16  torch.ops.onednn.qlinear_pointwise (what inductor lowers x86 int8 linears
                       to): activations quantized per call to uint8, one scale for the batch
  intmm-fp32/-bf16     torch._int_mm, activations quantized per row (symmetric int8)
  dyn-x86 / dyn-onednn torch.ao.nn.quantized.dynamic.Linear: int8 activations quantized per call
                       (per tensor), fbgemm (x86) or oneDNN; fp32 in and out
  ao-woq / ao-da8w8    torchao's Int8WeightOnlyConfig / Int8DynamicActivationInt8WeightConfig,
                       compiled by inductor (--torchao; needs torchao importable)

    python bench/int8_linear_bench.py --threads 2 --rounds 15
    python bench/int8_linear_bench.py --threads 1 --rounds 15 --only bf16-packed woq-bf16 split-bf16 split-bf16-compiled
    PYTHONPATH=/path/to/torchao python bench/int8_linear_bench.py --torchao   # adds torchao's two
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.int8_linear import Int8Linear
from gpu_workers.models.packed_linear import PackedLinear

HIDDEN, LAYERS, QKV, MLP = 768, 12, 1280, 2944


class Layer(nn.Module):
    """The linear layers of one decoder layer, chained as a step runs them (no attention)."""

    def __init__(self, qkv: nn.Module, o: nn.Module, gate_up: nn.Module, down: nn.Module) -> None:
        super().__init__()
        self.qkv, self.o, self.gate_up, self.down = qkv, o, gate_up, down

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        # the norms stand in for RMSNorm: they keep the chain's values in range over 12 layers
        a = self.o(self.qkv(F.normalize(h, dim=-1))[:, :HIDDEN])  # (T, H): q stands in for attention
        h = h + a
        gate, up = self.gate_up(F.normalize(h, dim=-1)).chunk(2, dim=-1)  # (T, I) each
        return h + self.down(F.silu(gate) * up)  # (T, H)


def float_weights(seed: int = 0) -> list[list[nn.Linear]]:
    g = torch.Generator().manual_seed(seed)
    shapes = ((HIDDEN, QKV), (HIDDEN, HIDDEN), (HIDDEN, 2 * MLP), (MLP, HIDDEN))
    layers = []
    for _ in range(LAYERS):
        linears = []
        for fan_in, fan_out in shapes:
            lin = nn.Linear(fan_in, fan_out, bias=False)
            lin.weight.data = torch.randn(fan_out, fan_in, generator=g) * fan_in**-0.5
            linears.append(lin)
        layers.append(linears)
    return layers


class WeightOnlyInt8(nn.Module):
    def __init__(self, lin: nn.Linear, dtype: torch.dtype) -> None:
        super().__init__()
        w = lin.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.qweight = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.scale = scale.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch._weight_int8pack_mm(x, self.qweight, self.scale)


class OneDnnDynamicInt8(nn.Module):
    """oneDNN's int8 linear (the op inductor lowers x86 int8 linears to): activations quantized
    per call to uint8 with one scale and zero point for the whole batch."""

    def __init__(self, lin: nn.Linear, rows: int) -> None:
        super().__init__()
        w = lin.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        q = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.packed = torch.ops.onednn.qlinear_prepack(q, [rows, lin.in_features])
        self.scale, self.zeros = scale, torch.zeros(len(scale), dtype=torch.int32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        lo, hi = x.min().clamp(max=0), x.max().clamp(min=0)
        step = ((hi - lo) / 255).clamp(min=1e-8)
        zero = torch.round(-lo / step)
        qx = torch.clamp(torch.round(x / step) + zero, 0, 255).to(torch.uint8)
        return torch.ops.onednn.qlinear_pointwise.tensor(
            qx, step.float(), zero.to(torch.int32), self.packed, self.scale, self.zeros, None, 1.0, 0, x.dtype,
            "none", [], "",
        )  # fmt: skip


class IntMmPerRow(nn.Module):
    """torch._int_mm (int8 x int8 -> int32): activations quantized per row, symmetric."""

    def __init__(self, lin: nn.Linear) -> None:
        super().__init__()
        w = lin.weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=1e-12) / 127
        self.qweight_t = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).t()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        step = xf.abs().amax(dim=1, keepdim=True).clamp(min=1e-8) / 127  # (T, 1)
        qx = torch.round(xf / step).to(torch.int8)
        return (torch._int_mm(qx, self.qweight_t).float() * step * self.scale).to(x.dtype)


def dynamic_quantized(lin: nn.Linear, engine: str) -> nn.Module:
    import torch.ao.nn.quantized.dynamic as nnqd

    torch.backends.quantized.engine = engine
    qconfig = torch.ao.quantization.per_channel_dynamic_qconfig
    holder = nn.Sequential(lin)
    holder[0].qconfig = qconfig  # type: ignore[assignment]
    return nnqd.Linear.from_float(holder[0])


class EngineSwitch(nn.Module):
    """Runs the chain with torch's quantized engine set as its weights were packed for."""

    def __init__(self, inner: nn.Module, engine: str) -> None:
        super().__init__()
        self.inner, self.engine = inner, engine

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.backends.quantized.engine = self.engine
        return self.inner(x)


def build(name: str, weights: list[list[nn.Linear]], rows: int) -> tuple[nn.Module, torch.dtype]:
    def chain(make: Callable[[nn.Linear], nn.Module]) -> nn.Module:
        return nn.Sequential(*(Layer(*(make(lin) for lin in layer)) for layer in weights))

    def cast(lin: nn.Linear, dtype: torch.dtype) -> nn.Linear:
        out = nn.Linear(lin.in_features, lin.out_features, bias=False)
        out.weight.data = lin.weight.data.to(dtype)
        return out

    if name in ("fp32", "bf16"):
        dtype = torch.float32 if name == "fp32" else torch.bfloat16
        return chain(lambda lin: cast(lin, dtype)), dtype
    if name in ("fp32-packed", "bf16-packed"):
        dtype = torch.float32 if name.startswith("fp32") else torch.bfloat16
        return chain(lambda lin: PackedLinear(cast(lin, dtype))), dtype
    if name in ("woq-bf16", "woq-fp32"):
        dtype = torch.bfloat16 if name == "woq-bf16" else torch.float32
        return chain(lambda lin: WeightOnlyInt8(lin, dtype)), dtype
    if name in ("split-bf16", "split-fp32", "split-bf16-compiled"):
        dtype = torch.float32 if name == "split-fp32" else torch.bfloat16
        model = chain(lambda lin: Int8Linear(cast(lin, dtype), kernel="onednn"))
        return (torch.compile(model, dynamic=True) if name.endswith("compiled") else model), dtype
    if name in ("onednn-da8-fp32", "onednn-da8-bf16"):
        dtype = torch.float32 if name.endswith("fp32") else torch.bfloat16
        return chain(lambda lin: OneDnnDynamicInt8(lin, rows)), dtype
    if name in ("intmm-fp32", "intmm-bf16"):
        dtype = torch.float32 if name.endswith("fp32") else torch.bfloat16
        return chain(IntMmPerRow), dtype
    if name in ("dyn-x86", "dyn-onednn"):
        engine = name.split("-")[1]
        if engine not in torch.backends.quantized.supported_engines:
            raise RuntimeError(f"quantized engine {engine} is not in this torch build")
        return EngineSwitch(chain(lambda lin: dynamic_quantized(lin, engine)), engine), torch.float32
    if name in ("ao-woq", "ao-da8w8"):
        from torchao.quantization import Int8DynamicActivationInt8WeightConfig, Int8WeightOnlyConfig, quantize_

        model = chain(lambda lin: cast(lin, torch.bfloat16))
        config = Int8WeightOnlyConfig() if name == "ao-woq" else Int8DynamicActivationInt8WeightConfig()
        quantize_(model, config)
        return torch.compile(model), torch.bfloat16
    raise ValueError(name)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=32, help="decode batch rows")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--iters", type=int, default=5, help="chain passes per candidate per round")
    p.add_argument("--torchao", action="store_true", help="add torchao's two configs (compiled)")
    p.add_argument("--only", nargs="*", help="candidate names to run")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["fp32", "fp32-packed", "bf16", "bf16-packed", "woq-bf16", "woq-fp32", "split-bf16", "split-fp32",
             "split-bf16-compiled", "dyn-x86", "dyn-onednn",
             "onednn-da8-fp32", "onednn-da8-bf16", "intmm-fp32", "intmm-bf16"]  # fmt: skip
    if args.torchao:
        names += ["ao-woq", "ao-da8w8"]
    if args.only:
        names = [n for n in names if n in args.only]
    weights = float_weights()
    x32 = torch.randn(args.rows, HIDDEN, generator=torch.Generator().manual_seed(1))
    models: dict[str, tuple[nn.Module, torch.Tensor]] = {}
    reference = None
    with torch.no_grad():
        for name in names:
            try:
                model, dtype = build(name, weights, args.rows)
                x = x32.to(dtype)
                out = model(x).float()  # warm-up (and, compiled, the compile)
            except Exception as exc:  # noqa: BLE001 - a bench reports what it could not run
                print(f"{name:12s} skipped: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                continue
            reference = out if reference is None else reference
            err = ((out - reference).norm() / reference.norm()).item()
            print(f"{name:12s} ready; output vs fp32: relative error {err:.2e}", flush=True)
            models[name] = (model, x)
    times: dict[str, list[float]] = {n: [] for n in models}
    with torch.no_grad():
        for round_ in range(1, args.rounds + 1):
            order = list(models)
            random.shuffle(order)
            for name in order:
                model, x = models[name]
                start = time.perf_counter()
                for _ in range(args.iters):
                    model(x)
                times[name].append((time.perf_counter() - start) / args.iters)
            report(times, args.rows, round_)  # each round: a run cut short still says something


def report(times: dict[str, list[float]], rows: int, rounds: int) -> None:
    base = statistics.median(times["bf16-packed"]) if "bf16-packed" in times else None
    print(f"\n{rows} rows, {LAYERS} layers' linears, {torch.get_num_threads()} threads, {rounds} rounds")
    print(f"{'candidate':12s} {'median ms':>10s} {'min ms':>8s} {'vs bf16-packed':>15s}")
    for name, ts in times.items():
        med = statistics.median(ts)
        ratio = f"{base / med:.2f}x" if base else "-"
        print(f"{name:12s} {med * 1e3:10.2f} {min(ts) * 1e3:8.2f} {ratio:>15s}", flush=True)


if __name__ == "__main__":
    main()
