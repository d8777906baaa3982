"""Where one LLM step goes: attention, linear layers, logits, sampling, the pipe, the rest.

Runs the LLM runner in-process (no server, no HTTP) on a checkpoint, fills a decode batch
(--seqs sequences of --context prompt tokens, prefilled first), then times --steps decode
steps after --warmup, and a prefill chunk: a whole new prompt of --chunk tokens, then the next
--chunk tokens of that prompt as a continuing chunk (the paged path). Per step it reports the
wall time and each part's share:

- attention: inside the attention backend's forward (KV write, attention);
- linear: inside every Linear of the decoder layers (nn.Linear or the oneDNN-packed ones);
- logits: the output projection over the sampled rows (compute_logits);
- sampling: the sampler;
- pipe: encoding the Step and decoding the StepResult with the worker pipe's codec, both
  ways (what the server and worker processes each pay per step, minus the pipe's copy);
- other: the rest of the step (norms, RoPE, embeddings, residuals, the runner's bookkeeping).

The parts are timed with perf_counter hooks around the calls (a few microseconds each).

    python bench/make_checkpoint.py --out bench/.cache/qwen2-100m
    python bench/step_profile.py --model bench/.cache/qwen2-100m --dtype bfloat16 --threads 2
    python bench/step_profile.py --model bench/.cache/qwen2-100m --attention-backend torch_sdpa

--json FILE also writes the figures as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch
from torch import nn

from gpu_workers.runners.llm import LLMRunner
from omni.shared import protocol

PARTS = ("attention", "linear", "logits", "sampling", "pipe")


class Timers:
    def __init__(self) -> None:
        self.spent: dict[str, float] = defaultdict(float)
        self._depth = 0  # nested timed calls count once, in the outermost part

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        if self._depth:
            yield
            return
        self._depth += 1
        t = time.perf_counter()
        try:
            yield
        finally:
            self.spent[name] += time.perf_counter() - t
            self._depth -= 1

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                return fn(*args, **kwargs)

        return timed

    def hook_modules(self, name: str, modules: list[nn.Module]) -> None:
        starts: list[float] = []

        def pre(_m: nn.Module, _a: Any) -> None:
            starts.append(time.perf_counter())

        def post(_m: nn.Module, _a: Any, _o: Any) -> None:
            self.spent[name] += time.perf_counter() - starts.pop()

        for m in modules:
            m.register_forward_pre_hook(pre)
            m.register_forward_hook(post)


def instrument(runner: LLMRunner) -> Timers:
    timers = Timers()
    backend = runner.attention_backend
    backend.forward = timers.wrap("attention", backend.forward)  # type: ignore[method-assign]
    model = runner.model
    model.compute_logits = timers.wrap("logits", model.compute_logits)  # type: ignore[method-assign]
    runner.sampler.sample = timers.wrap("sampling", runner.sampler.sample)  # type: ignore[method-assign]
    linears = [
        m
        for name, m in model.named_modules()
        if "layers." in name and not list(m.children()) and "Linear" in type(m).__name__
    ]
    if not linears:
        raise SystemExit("found no Linear modules in the decoder layers")
    timers.hook_modules("linear", linears)
    return timers


def timed_step(runner: LLMRunner, timers: Timers, step: protocol.Step) -> tuple[float, dict[str, float]]:
    timers.spent.clear()
    t = time.perf_counter()
    with timers.part("pipe"):
        message = protocol.decode(protocol.encode(step))
    result = runner.execute(message)
    with timers.part("pipe"):
        protocol.decode(protocol.encode(result))
    if result.failed:
        raise SystemExit(f"step failed: {result.failed}")
    return time.perf_counter() - t, dict(timers.spent)


def summarize(label: str, runs: list[tuple[float, dict[str, float]]]) -> dict[str, Any]:
    wall = sum(w for w, _ in runs) / len(runs)
    parts = {p: sum(s.get(p, 0.0) for _, s in runs) / len(runs) for p in PARTS}
    parts["other"] = max(0.0, wall - sum(parts.values()))
    print(f"\n{label}: {wall * 1e3:.1f} ms per step (mean of {len(runs)})")
    for p, v in parts.items():
        print(f"  {p:<10} {v * 1e3:8.2f} ms  {100 * v / wall:5.1f}%")
    return {"label": label, "step_ms": wall * 1e3, "ms": {p: v * 1e3 for p, v in parts.items()},
            "share": {p: v / wall for p, v in parts.items()}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="checkpoint directory (bench/make_checkpoint.py)")
    ap.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    ap.add_argument("--attention-backend", default="auto")
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    ap.add_argument("--seqs", type=int, default=32)
    ap.add_argument("--context", type=int, default=200, help="prompt tokens of each decode sequence")
    ap.add_argument("--chunk", type=int, default=256, help="prefill chunk tokens")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    bs = args.block_size
    tokens_needed = args.seqs * (args.context + args.warmup + args.steps + 2) + 2 * args.chunk
    num_blocks = 2 * (-(-tokens_needed // bs)) + 4 * args.seqs
    runner = LLMRunner(args.model, dtype=getattr(torch, args.dtype), block_size=bs, num_kv_blocks=num_blocks,
                       attention_backend=args.attention_backend)  # fmt: skip
    mc = runner.model_config
    runner.attention_backend.warm_up(runner.kv_caches[0], mc.num_heads, mc.attention_scale)  # as a worker does
    vocab = mc.vocab_size
    rng = random.Random(0)
    free = list(range(num_blocks))
    rng.shuffle(free)  # scattered block tables, as a server's are after a while
    greedy = protocol.SamplingOptions(temperature=0.0)
    max_len = args.context + args.warmup + args.steps + 2

    def blocks(n: int) -> list[int]:
        return [free.pop() for _ in range(-(-n // bs))]

    # the decode batch: prefill every sequence in one step (not timed), then decode
    ids = [f"d{i}" for i in range(args.seqs)]
    tables = {r: blocks(max_len) for r in ids}
    news = [
        protocol.NewRequest(r, [rng.randrange(vocab) for _ in range(args.context)], greedy, tables[r], 0, args.context)
        for r in ids
    ]
    runner.execute(protocol.Step(0, news, [], []))
    timers = instrument(runner)
    computed = dict.fromkeys(ids, args.context)
    runs = []
    for s in range(args.warmup + args.steps):
        cached = [protocol.CachedRequest(r, [], computed[r], 1) for r in ids]
        out = timed_step(runner, timers, protocol.Step(1 + s, [], cached, []))
        for r in ids:
            computed[r] += 1
        if s >= args.warmup:
            runs.append(out)
    print(f"{args.model} {args.dtype}, attention {type(runner.attention_backend).__name__}, "
          f"{torch.get_num_threads()} threads")  # fmt: skip
    results = [summarize(f"decode: {args.seqs} sequences, context {args.context}-{max_len}", runs)]
    runner.execute(protocol.Step(1000, [], [], ids))  # drop them

    # prefill: a whole new prompt of --chunk tokens, then its next --chunk tokens (continuing)
    fresh, cont = [], []
    prompt_len = 2 * args.chunk
    for i in range(args.warmup + args.steps):
        r = f"p{i}"
        table = blocks(prompt_len)
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        first = protocol.Step(2000 + 2 * i, [protocol.NewRequest(r, prompt, greedy, table, 0, args.chunk)], [], [])
        out_first = timed_step(runner, timers, first)
        second = protocol.Step(2001 + 2 * i, [], [protocol.CachedRequest(r, [], args.chunk, args.chunk)], [])
        out_second = timed_step(runner, timers, second)
        runner.execute(protocol.Step(2002 + 2 * i, [], [], [r]))
        free.extend(table)
        if i >= args.warmup:
            fresh.append(out_first)
            cont.append(out_second)
    results.append(summarize(f"prefill: a new prompt's first {args.chunk} tokens", fresh))
    results.append(summarize(f"prefill: the next {args.chunk} tokens of it (continuing chunk)", cont))
    if args.json:
        meta = {"model": str(args.model), "dtype": args.dtype, "threads": torch.get_num_threads(),
                "attention_backend": type(runner.attention_backend).__name__, "results": results}  # fmt: skip
        args.json.write_text(json.dumps(meta, indent=2))


if __name__ == "__main__":
    main()
