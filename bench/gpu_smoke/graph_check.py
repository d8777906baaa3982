"""The compiled decode step (gpu_workers/llm/decode_graph.py) on CUDA, through LLMRunner.

1. copy: a compiled runner with a --kv-gib cache; torch.cuda.memory_allocated() across
   DecodeGraph.warm_up(). CUDA-graph trees give every input that is neither a parameter nor
   marked static (torch._dynamo.mark_static_address) a graph-owned copy per recording: a delta
   near the cache's size means the KV cache is duplicated (at a server's sizing the copy cannot
   fit, warm-up runs out of memory and decode runs eagerly). `kv_marked_static` says whether
   the cache carries the mark when warm-up starts (issue 34 item 1 puts it there).
2. parity: 3 greedy requests, --steps decode steps, compiled against an eager runner with the
   same weights and block tables: steps that went through the graph, tokens equal until the
   first difference, the logits' worst difference until then, ms per step each.
3. static (--static): when 1 copied and the cache was not marked, the same warm-up with the
   cache marked by hand first, the fix measured. A knob for the rerun on the warm machine; once
   DecodeGraph marks the cache itself this has nothing to add and says so.
Writes one JSON object to --json after every stage (a timeout keeps what was measured).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from gpu_workers.llm.loader import read_model_config
from gpu_workers.llm.runner import LLMRunner, kv_bytes_per_block
from omni.shared import protocol

GREEDY = protocol.SamplingOptions(temperature=0.0)
BLOCK = 16
PROMPTS = (37, 300, 1000)  # tokens: three table widths


def marked_static(t: torch.Tensor) -> bool:
    # torch._dynamo.mark_static_address records itself on the tensor under this name
    return getattr(t, "_dynamo_static_input_type", None) is not None


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def allocated() -> int:
    return torch.cuda.memory_allocated() if torch.cuda.is_available() else 0


def runner_kwargs(a: argparse.Namespace, compiled: bool, blocks: int) -> dict[str, Any]:
    return {"device": a.device, "dtype": getattr(torch, a.dtype), "block_size": BLOCK, "num_kv_blocks": blocks,
            "attention_backend": a.attention_backend, "compile_decode": compiled, "max_num_seqs": 4}  # fmt: skip


def make_runner(a: argparse.Namespace, compiled: bool, blocks: int, static: bool = False) -> LLMRunner:
    r = LLMRunner(a.model, **runner_kwargs(a, compiled, blocks))
    if static and not marked_static(r.kv_cache):
        torch._dynamo.mark_static_address(r.kv_cache)
    mc = r.model_config
    r.attention_backend.warm_up(r.kv_caches[0], mc.num_heads, mc.attention_scale)
    return r


def warm(r: LLMRunner, out: dict[str, Any], key: str) -> bool:
    assert r.decode_graph is not None
    sync()
    before = allocated()
    kv = r.kv_cache.numel() * r.kv_cache.element_size()
    stage: dict[str, Any] = {"kv_gib": round(kv / 2**30, 3), "kv_marked_static": marked_static(r.kv_cache)}
    out[key] = stage
    t = time.perf_counter()
    ok = True
    try:
        r.decode_graph.warm_up()
    except Exception as exc:  # noqa: BLE001 - what LLMRunner.from_spec catches, logs and serves eagerly after
        stage["error"] = f"{type(exc).__name__}: {exc}"[:600]
        ok = False
    sync()
    delta = allocated() - before
    stage.update(warm_up_s=round(time.perf_counter() - t, 1), allocated_delta_gib=round(delta / 2**30, 3),
                 kv_copied=delta >= kv // 2, decode_graph=r.decode_graph.stats())  # fmt: skip
    return ok


def decode(r: LLMRunner, prompts: dict[str, list[int]], tables: dict[str, list[int]], steps: int) -> tuple[list[torch.Tensor], list[list[int]], float]:  # fmt: skip
    logits: list[torch.Tensor] = []
    compute = r.model.compute_logits

    def record(hidden: torch.Tensor) -> torch.Tensor:
        x = compute(hidden)
        logits.append(x.float().cpu())
        return x

    r.model.compute_logits = record  # type: ignore[method-assign]
    news = [protocol.NewRequest(k, p, GREEDY, tables[k], 0, len(p)) for k, p in prompts.items()]
    first = r.execute(protocol.Step(0, news, [], []))
    tokens = [[t.token_id for t in first.sampled]]
    done = {k: len(p) for k, p in prompts.items()}
    sync()
    t = time.perf_counter()
    for s in range(steps):
        step = protocol.Step(1 + s, [], [protocol.CachedRequest(k, [], done[k], 1) for k in prompts], [])
        tokens.append([x.token_id for x in r.execute(step).sampled])
        for k in prompts:
            done[k] += 1
    sync()
    return logits[1:], tokens, (time.perf_counter() - t) / steps


def summary(out: dict[str, Any]) -> str:
    c, q, s = out.get("copy", {}), out.get("parity", {}), out.get("static", {})
    marked = " (marked static)" if c.get("kv_marked_static") else ""
    copied = ", KV COPIED" if c.get("kv_copied") else ""
    parts = [f"KV {c.get('kv_gib')} GiB{marked}, +{c.get('allocated_delta_gib')} GiB over warm-up ({c.get('warm_up_s')} s){copied}"]
    if s.get("skipped"):
        parts.append(f"no hand marking: {s['skipped']}")
    elif s:
        parts.append(f"marked by hand: +{s.get('allocated_delta_gib')} GiB")
    if q:
        parts.append(f"graph steps {q['graph_steps']}/{q['steps']}, tokens equal {q['tokens_equal_until']}/{q['of']}, "
                     f"worst logit diff {q['worst_logit_diff']}; {q['compiled_ms_per_step']} vs eager "
                     f"{q['eager_ms_per_step']} ms/step")  # fmt: skip
    parts += [str(e)[:200] for e in (c.get("error"), out.get("error")) if e]
    return "; ".join(parts)


def dump(out: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(out, indent=1, default=str))
    print("SUMMARY: " + summary(out), flush=True)


def run(a: argparse.Namespace, out: dict[str, Any]) -> None:
    config = read_model_config(Path(a.model))
    blocks = int(a.kv_gib * 2**30) // kv_bytes_per_block(config, BLOCK, getattr(torch, a.dtype))
    compiled = make_runner(a, True, blocks)
    graph_ok = warm(compiled, out, "copy")
    dump(out, a.json)
    eager = make_runner(a, False, blocks)
    rng = random.Random(0)
    prompts = {f"r{i}": [rng.randrange(config.vocab_size) for _ in range(n)] for i, n in enumerate(PROMPTS)}
    tables, nxt = {}, 0
    for k, prompt in prompts.items():
        need = -(-(len(prompt) + a.steps + 2) // BLOCK)
        tables[k], nxt = list(range(nxt, nxt + need)), nxt + need
    calls = 0
    if compiled.decode_graph is not None and graph_ok:
        inner = compiled.decode_graph.forward

        def counting(*args: Any, **kw: Any) -> torch.Tensor:
            nonlocal calls
            calls += 1
            return inner(*args, **kw)

        compiled.decode_graph.forward = counting  # type: ignore[method-assign]
    else:
        compiled.decode_graph = None  # as from_spec serves after a failed warm-up
    lc, tc, sc = decode(compiled, prompts, tables, a.steps)
    le, te, se = decode(eager, prompts, tables, a.steps)
    same = next((i for i, (x, y) in enumerate(zip(tc, te)) if x != y), len(tc))
    worst = max((float((x - y).abs().max()) for x, y in zip(lc[:same], le)), default=None)
    out["parity"] = {"graph_steps": calls, "steps": a.steps, "tokens_equal_until": same, "of": len(tc),
                     "worst_logit_diff": worst, "compiled_ms_per_step": round(1e3 * sc, 2),
                     "eager_ms_per_step": round(1e3 * se, 2)}  # fmt: skip
    out["ok"] = graph_ok and not out["copy"]["kv_copied"] and calls == a.steps and same == len(tc)
    dump(out, a.json)
    copied_unmarked = out["copy"]["kv_copied"] and not out["copy"]["kv_marked_static"]
    del compiled, eager
    gc.collect()
    torch._dynamo.reset()  # drops the CUDA-graph trees and their copies
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    if a.static and copied_unmarked:
        warm(make_runner(a, True, blocks, static=True), out, "static")
    elif a.static:
        out["static"] = {"skipped": "the cache was marked already or not copied"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True)
    p.add_argument("--json", type=Path, required=True)
    p.add_argument("--kv-gib", type=float, default=2.0)
    p.add_argument("--device", default="cuda:0", help="cpu runs the same calls (no CUDA graphs, no memory figure)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--attention-backend", default="torch_sdpa",
                   help="prefill attention (torch_sdpa needs no JIT; flashinfer once fi_check passed)")  # fmt: skip
    p.add_argument("--static", action="store_true", help="also warm up with the cache marked static by hand")
    return p


def main() -> int:
    a = parser().parse_args()
    out: dict[str, Any] = {"torch": torch.__version__, "attention_backend": a.attention_backend, "ok": False}
    try:
        run(a, out)
    except Exception as exc:  # noqa: BLE001
        out["error"] = f"{type(exc).__name__}: {exc}"[:2000]
        out["traceback"] = traceback.format_exc()[-4000:]
        out["ok"] = False
    dump(out, a.json)
    return 0 if out.get("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
