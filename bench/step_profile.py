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

--around times what a decode step costs outside the model's forward (issue 33, item 3): the
decode batch's steps (--seqs 1 for one user) split into the forward (the decoder, then the
LM head: compute_logits) and, outside it, the runner's step preparation (the Step's deltas,
staging of ids and positions, the attention metadata and block tables: from the call until
the forward starts), sampling (the sampler, greedy), the rest of the runner (indexing the
sampled rows, the StepResult's tokens) and the pipe codec both ways. Then the sampler alone
on one row of the model's vocabulary for the options a request may carry (greedy,
temperature, top-p, top-k, penalties, logprobs), best of --steps calls each. The server's side
of a step is bench/server_step_cost.py's.

    python bench/step_profile.py --model ~/.cache/omni-serve/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        --dtype bfloat16 --threads 2 --seqs 1 --context 64 --steps 50 --around

--compare runs decode steps of several variants of the runner, interleaved step by step in one
process (each its own runner and cache, the same batch), and prints each one's step time
(median and best) and its ratio to the first: `eager` (the --attention-backend, eager),
`eager-padded` (torch_sdpa's decode rows through the padded gather and masked SDPA instead of
the paged CPU kernel), `eager:NAME` (eager with attention backend NAME, e.g. eager:flex_paged),
and the compiled decode step with each of its kernels: `gather` (inductor's reduction over the
cache) and `paged` (attention/cpu_paged.py); for the compiled ones their attention share,
measured by difference against the same compiled step with the cached-context attention left
out (`none`: wrong results, timing only). On a busy machine the ratios, not the absolute times,
are what to read; --rounds repeats the whole comparison.

    python bench/step_profile.py --model bench/.cache/qwen2-100m --dtype bfloat16 --threads 2 \
        --compare eager,eager:flex_paged,gather --steps 20 --rounds 3
    python bench/step_profile.py --model bench/.cache/qwen2-100m --dtype bfloat16 --threads 2 \
        --compare eager-padded,eager,gather,paged --steps 20 --rounds 3
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

from gpu_workers.llm.runner import LLMRunner
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


def _skip_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, table: torch.Tensor,
                    num_cached: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    # timing only: the cached context is left out (each row sees only its own token)
    return v.float()[:, :, None, :].expand(q.shape).contiguous()


def _now() -> tuple[float, float]:
    """(wall, this thread's CPU time) in seconds."""
    return time.perf_counter(), time.thread_time()


class StepClock:
    """Timestamps of one step's forward, on two clocks (wall, and this thread's CPU time):
    when the model's forward starts (the end of the runner's preparation), and the forward's,
    the LM head's and the sampler's own times."""

    def __init__(self, runner: LLMRunner) -> None:
        self.forward_start = (0.0, 0.0)
        self.spent: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
        model = runner.model
        model.register_forward_pre_hook(self._pre)
        model.register_forward_hook(self._post)
        model.compute_logits = self._timed("logits", model.compute_logits)  # type: ignore[method-assign]
        runner.sampler.sample = self._timed("sampling", runner.sampler.sample)  # type: ignore[method-assign]

    def _add(self, name: str, start: tuple[float, float]) -> None:
        end = _now()
        spent = self.spent[name]
        spent[0] += end[0] - start[0]
        spent[1] += end[1] - start[1]

    def _pre(self, _m: nn.Module, _a: Any) -> None:
        self.forward_start = _now()

    def _post(self, _m: nn.Module, _a: Any, _o: Any) -> None:
        self._add("forward", self.forward_start)

    def _timed(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = _now()
            try:
                return fn(*args, **kwargs)
            finally:
                self._add(name, start)

        return timed


AROUND_PARTS = ("pipe", "prepare", "sampling", "runner rest")

# The sampler's options at one row, each timed alone: what a request may ask for.
SAMPLING_CASES: dict[str, protocol.SamplingOptions] = {
    "greedy": protocol.SamplingOptions(temperature=0.0),
    "temperature 1": protocol.SamplingOptions(temperature=1.0),
    "temperature 0.7, top_p 0.9": protocol.SamplingOptions(temperature=0.7, top_p=0.9),
    "temperature 0.7, top_k 40": protocol.SamplingOptions(temperature=0.7, top_k=40),
    "min_p 0.05": protocol.SamplingOptions(temperature=1.0, min_p=0.05),
    "greedy, repetition 1.1": protocol.SamplingOptions(temperature=0.0, repetition_penalty=1.1),
    "greedy, frequency + presence 0.5": protocol.SamplingOptions(
        temperature=0.0, frequency_penalty=0.5, presence_penalty=0.5
    ),
    "greedy, logprobs 0": protocol.SamplingOptions(temperature=0.0, logprobs=0),
    "greedy, logprobs 5": protocol.SamplingOptions(temperature=0.0, logprobs=5),
}


def around(args: argparse.Namespace, runner: LLMRunner, ids: list[str], computed: dict[str, int]) -> dict[str, Any]:
    """Decode steps split into the forward and what is around it (see the module's --around)."""
    clock = StepClock(runner)
    rows: dict[str, list[dict[str, float]]] = {"wall": [], "cpu": []}
    for s in range(args.warmup + args.steps):
        clock.spent.clear()
        step = protocol.Step(1 + s, [], [protocol.CachedRequest(r, [], computed[r], 1) for r in ids], [])
        t0 = _now()
        message = protocol.decode(protocol.encode(step))
        t1 = _now()
        result = runner.execute(message)
        t2 = _now()
        protocol.decode(protocol.encode(result))
        t3 = _now()
        if result.failed:
            raise SystemExit(f"step failed: {result.failed}")
        for r in ids:
            computed[r] += 1
        if s < args.warmup:
            continue
        for c, clock_name in enumerate(rows):
            sp = {k: v[c] for k, v in clock.spent.items()}
            inside = sp["forward"] + sp["logits"]
            rows[clock_name].append({
                "step": t3[c] - t0[c],
                "forward": inside,
                "pipe": (t1[c] - t0[c]) + (t3[c] - t2[c]),
                "prepare": clock.forward_start[c] - t1[c],
                "sampling": sp["sampling"],
                "runner rest": (t2[c] - clock.forward_start[c]) - inside - sp["sampling"],
            })  # fmt: skip
    figures: dict[str, Any] = {}
    print(f"\ndecode, {len(ids)} sequence(s): {len(rows['wall'])} steps; ms, best and median of each part,")
    print("on the wall clock and as this thread's CPU time (which a shared machine's preemption leaves out)")
    print(f"  {'':<34} {'wall best':>9} {'median':>8} {'cpu best':>9} {'median':>8}")
    for part in ("step", "forward", *AROUND_PARTS, "outside the forward"):
        cells = []
        for clock_name, runs in rows.items():
            values = sorted(sum(r[p] for p in AROUND_PARTS) if part == "outside the forward" else r[part] for r in runs)
            best, median = values[0], values[len(values) // 2]
            figures.setdefault(clock_name, {})[part] = {"best_ms": best * 1e3, "median_ms": median * 1e3}
            cells += [best * 1e3, median * 1e3]
        label = "  " + part if part in AROUND_PARTS else part
        print(f"  {label:<34} {cells[0]:9.3f} {cells[1]:8.3f} {cells[2]:9.3f} {cells[3]:8.3f}")

    vocab = runner.model_config.vocab_size
    sampler = type(runner.sampler)()
    history_rng = random.Random(1)
    history = [history_rng.randrange(vocab) for _ in range(args.context)]
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(0))
    cases = {}
    print(f"\nthe sampler alone, one row of {vocab} float32 logits, {args.steps} calls: ms best, median")
    for name, options in SAMPLING_CASES.items():
        state = _History(list(history), len(history) // 2)
        times = []
        for i in range(args.warmup + args.steps):
            row = logits.clone()  # the sampler may write it (penalties work on a copy of their own)
            t = time.perf_counter()
            out = sampler.sample(row, [options], [None], [state], request_ids=["r"])
            times.append(time.perf_counter() - t)
            state.token_ids.append(out[0].token_id)
        sampler.release("r")
        times = sorted(times[args.warmup :])
        cases[name] = {"best_ms": times[0] * 1e3, "median_ms": times[len(times) // 2] * 1e3}
        print(f"  {name:<34} {times[0] * 1e3:8.3f} {times[len(times) // 2] * 1e3:8.3f}")
    return {"decode": figures, "sampler_ms": cases}


class _History:
    """A TokenHistory for the sampler's penalties: the prompt, then what was sampled."""

    def __init__(self, token_ids: list[int], num_prompt_tokens: int) -> None:
        self.token_ids = token_ids
        self.num_prompt_tokens = num_prompt_tokens


def compare(args: argparse.Namespace) -> None:
    from gpu_workers.attention.compiled_decode import DECODE_KERNELS

    DECODE_KERNELS["none"] = _skip_attention
    variants = args.compare.split(",")
    runs = [v for v in variants if v.startswith("eager")]
    runs += [k for v in variants if not v.startswith("eager") for k in (v, f"{v}-none")]
    bs = args.block_size
    max_len = args.context + args.warmup + args.steps * args.rounds + 2
    num_blocks = args.seqs * (-(-max_len // bs)) + 8
    greedy = protocol.SamplingOptions(temperature=0.0)
    runners: dict[str, LLMRunner] = {}
    for name in runs:
        t = time.perf_counter()
        eager = name.startswith("eager")
        kernel = "none" if name.endswith("-none") else name
        backend = name.partition(":")[2] or args.attention_backend
        runner = LLMRunner(args.model, dtype=getattr(torch, args.dtype), block_size=bs, num_kv_blocks=num_blocks,
                           attention_backend=backend, compile_decode=not eager,
                           max_num_seqs=args.seqs, decode_kernel="gather" if eager else kernel)  # fmt: skip
        if name == "eager-padded":  # decode rows through the padded gather, not the paged kernel
            runner.attention_backend.paged_kernel = False  # type: ignore[attr-defined]
        mc = runner.model_config
        runner.attention_backend.warm_up(runner.kv_caches[0], mc.num_heads, mc.attention_scale)
        if runner.decode_graph is not None:
            runner.decode_graph.warm_up()
        runners[name] = runner
        print(f"{name}: ready in {time.perf_counter() - t:.1f} s", flush=True)
    rng = random.Random(0)
    vocab = runners[runs[0]].model_config.vocab_size
    ids = [f"d{i}" for i in range(args.seqs)]
    per = -(-max_len // bs)
    tables = {r: list(range(i * per, (i + 1) * per)) for i, r in enumerate(ids)}
    prompts = {r: [rng.randrange(vocab) for _ in range(args.context)] for r in ids}
    for runner in runners.values():
        news = [protocol.NewRequest(r, prompts[r], greedy, tables[r], 0, args.context) for r in ids]
        runner.execute(protocol.Step(0, news, [], []))
    timers = {n: Timers() for n in runners if n.startswith("eager")}
    for n, t in timers.items():
        backend = runners[n].attention_backend
        backend.forward = t.wrap("attention", backend.forward)  # type: ignore[method-assign]
    eager_attention: dict[str, list[float]] = {n: [] for n in timers}
    computed = {name: dict.fromkeys(ids, args.context) for name in runners}
    times: dict[str, list[float]] = {name: [] for name in runners}
    for s in range(args.warmup + args.steps * args.rounds):
        for name, runner in runners.items():
            cached = [protocol.CachedRequest(r, [], computed[name][r], 1) for r in ids]
            if name in timers:
                timers[name].spent.clear()
            t = time.perf_counter()
            runner.execute(protocol.Step(1 + s, [], cached, []))
            dt = time.perf_counter() - t
            for r in ids:
                computed[name][r] += 1
            if s >= args.warmup:
                times[name].append(dt)
                if name in timers:
                    eager_attention[name].append(timers[name].spent["attention"] / dt)
    med = {n: sorted(v)[len(v) // 2] for n, v in times.items()}
    first = variants[0]
    print(f"\n{args.model} {args.dtype}, {args.seqs} sequences at {args.context}+ tokens, "
          f"{torch.get_num_threads()} threads, {len(times[first])} steps each, interleaved")  # fmt: skip
    out = {}
    for name in variants:
        share = (sorted(eager_attention[name])[len(eager_attention[name]) // 2] if name in timers
                 else max(0.0, 1 - med[f"{name}-none"] / med[name]))  # fmt: skip
        out[name] = {"median_ms": med[name] * 1e3, "best_ms": min(times[name]) * 1e3,
                     "ratio_to_first": med[name] / med[first], "attention_share": share}  # fmt: skip
        print(f"  {name:<16} median {med[name] * 1e3:7.1f} ms  best {min(times[name]) * 1e3:7.1f} ms  "
              f"x{med[name] / med[first]:.2f} of {first}  attention {100 * share:4.1f}%")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps({"model": str(args.model), "dtype": args.dtype, "seqs": args.seqs,
                                         "context": args.context, "variants": out}, indent=2))  # fmt: skip


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
    ap.add_argument("--compare", default=None, help="eager,gather,flex: decode steps of each, interleaved")
    ap.add_argument("--rounds", type=int, default=1, help="with --compare: repeat the timed steps")
    ap.add_argument("--around", action="store_true", help="decode steps: the time outside the forward, by part")
    ap.add_argument("--quantization", default=None, choices=("int8", "gguf"), help="as the server's flag")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.compare:
        compare(args)
        return
    bs = args.block_size
    tokens_needed = args.seqs * (args.context + args.warmup + args.steps + 2) + 2 * args.chunk
    num_blocks = 2 * (-(-tokens_needed // bs)) + 4 * args.seqs
    runner = LLMRunner(args.model, dtype=getattr(torch, args.dtype), block_size=bs, num_kv_blocks=num_blocks,
                       attention_backend=args.attention_backend, quantization=args.quantization)  # fmt: skip
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
    computed = dict.fromkeys(ids, args.context)
    if args.around:
        print(f"{args.model} {args.dtype}, attention {type(runner.attention_backend).__name__}, "
              f"{torch.get_num_threads()} threads")  # fmt: skip
        figures = around(args, runner, ids, computed)
        if args.json:
            args.json.write_text(json.dumps({"model": str(args.model), "dtype": args.dtype, "seqs": args.seqs,
                                             "threads": torch.get_num_threads(), **figures}, indent=2))  # fmt: skip
        return
    timers = instrument(runner)
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
