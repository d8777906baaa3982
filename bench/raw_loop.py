#!/usr/bin/env python3
"""The raw ceiling: a plain-torch batched greedy decode loop over the transformers model.

Same workload as ``chat_load.py`` (the same seeded prompts, rendered through the
checkpoint's chat template; ``--max-tokens`` output tokens each), no HTTP, no scheduler:

    for each group of ``--batch-size`` requests (in arrival order):
        prefill every request on its own (batch 1)  -> its first token (greedy)
        left-pad the per-request KV caches into one batch cache
        decode the whole group together for max_tokens - 1 steps (greedy)

Implementation choices (all selectable, defaults are the fastest measured on the 2-core
CPU with the 100M checkpoint -- see bench/README.md):

* ``--cache static``  (default): a transformers ``StaticCache`` preallocated to
  ``max_prompt + max_tokens``; ``dynamic``: a ``DynamicCache`` (torch.cat per step).
* ``--attn sdpa_gqa`` (default): the model's own forward with a tiny registered attention
  function that calls ``F.scaled_dot_product_attention(..., enable_gqa=True)`` with the
  padding mask, instead of transformers' ``sdpa`` which expands K/V to all query heads
  (``repeat_kv``) whenever a mask is present; ``sdpa`` / ``eager`` use the stock ones.
* The 4-D boolean padding mask is built by hand and passed as
  ``attention_mask={"full_attention": mask}`` so the per-step transformers mask builder is
  skipped; positions are passed explicitly (``len_i + t``), so RoPE matches per request.

TTFT is reported two ways (both count prefills of earlier requests in the same group):

* ``ttft_*`` (closed loop, the definition ``chat_load.py`` measures): a request of group k
  is "sent" when group k-1 finished -- exactly when a closed-loop client with
  concurrency = batch size would send it -- and its TTFT runs from then to its first token.
* ``ttft_t0_*`` (all requests arrive at t0): group k's requests also wait for groups < k.

Throughput = total output tokens / wall time of the whole run (prefills included).

    python bench/raw_loop.py --model bench/.cache/qwen2-100m                    # 64 x 128, batch 32
    python bench/raw_loop.py --model bench/.cache/qwen2-tiny -n 4 -b 4 -m 8
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from chat_load import make_prompts, mean, percentile  # noqa: E402  (same prompt set)


def _register_sdpa_gqa() -> None:
    import torch.nn.functional as F
    from transformers import AttentionInterface

    def sdpa_gqa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
        # query [B, Hq, q, d], key/value [B, Hkv, kv, d]; attention_mask: bool [B, 1, q, >=kv] or None
        if attention_mask is not None:
            attention_mask = attention_mask[:, :, :, : key.shape[-2]]
        causal = attention_mask is None and query.shape[2] > 1
        out = F.scaled_dot_product_attention(
            query, key, value, attn_mask=attention_mask, is_causal=causal, scale=scaling,
            enable_gqa=query.shape[1] != key.shape[1],
        )
        return out.transpose(1, 2).contiguous(), None

    AttentionInterface.register("sdpa_gqa", sdpa_gqa)


def run(args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, StaticCache

    torch.set_num_threads(args.threads)
    if args.attn == "sdpa_gqa":
        _register_sdpa_gqa()
    if args.tokenizer == "omni":
        # omni-serve's own loader: follows tokenizer.json as written, where transformers'
        # AutoTokenizer may substitute a model-specific pre-tokenizer (qwen2 splits digits).
        from omni.text.tokenizer import TextTokenizer

        tok = TextTokenizer.from_dir(args.model).hf_tokenizer
    else:
        tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(
        args.model, dtype=getattr(torch, args.dtype), attn_implementation=args.attn
    )
    model.eval()
    cfg = model.config

    prompts = make_prompts(args.num_requests, seed=args.seed, words_per_prompt=args.prompt_words)
    prompt_ids = [
        tok.apply_chat_template(p, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        for p in prompts
    ]
    M = args.max_tokens
    no_mask = {"full_attention": None}  # prefill: batch 1, no padding -> plain causal attention

    def prefill(ids: list[int]):
        cache = DynamicCache(config=cfg)
        out = model(
            input_ids=torch.tensor([ids]), cache=cache, use_cache=True, logits_to_keep=1,
            attention_mask=no_mask if args.attn == "sdpa_gqa" else None,
        )
        return cache, out.logits[0, -1].argmax().item()

    def run_group(group: list[list[int]], on_first_token) -> list[list[int]]:
        B = len(group)
        firsts, caches = [], []
        for j, ids in enumerate(group):
            cache, first = prefill(ids)
            on_first_token(j)
            caches.append(cache)
            firsts.append(first)
        lens = torch.tensor([len(ids) for ids in group])
        P = int(lens.max())
        total = P + M
        # Left-pad each request's K/V into [B, Hkv, P, d].
        if args.cache == "static":
            batch_cache = StaticCache(config=cfg, max_cache_len=total)
        else:
            batch_cache = DynamicCache(config=cfg)
        for li in range(cfg.num_hidden_layers):
            k0 = caches[0].layers[li].keys
            K = k0.new_zeros((B, k0.shape[1], P, k0.shape[3]))
            V = torch.zeros_like(K)
            for j, c in enumerate(caches):
                L = c.layers[li].keys.shape[2]
                K[j, :, P - L:] = c.layers[li].keys[0]
                V[j, :, P - L:] = c.layers[li].values[0]
            batch_cache.update(K, V, li)
        del caches
        valid = torch.zeros((B, total), dtype=torch.bool)
        for j, ids in enumerate(group):
            valid[j, P - len(ids): P] = True
        if args.cache == "dynamic":
            valid[:, P:] = True  # only the first P+t+1 slots are ever used
        mask4 = valid[:, None, None, :]
        pos = lens.unsqueeze(1)  # position of the first generated token
        cur = torch.tensor(firsts).unsqueeze(1)
        outs = [cur]
        for t in range(M - 1):
            kv_len = P + t + 1
            if args.cache == "static":
                valid[:, P + t] = True
                m = mask4
            else:
                m = mask4[..., :kv_len]
            logits = model(
                input_ids=cur, position_ids=pos + t, cache=batch_cache, use_cache=True,
                attention_mask={"full_attention": m}, logits_to_keep=1,
            ).logits
            cur = logits[:, -1].argmax(-1, keepdim=True)
            outs.append(cur)
        return torch.cat(outs, dim=1).tolist()

    with torch.inference_mode():
        # Warm-up (unmeasured): one short group through both paths.
        wm = min(4, M)
        saved = M
        M = wm
        run_group(prompt_ids[: min(2, len(prompt_ids))], lambda j: None)
        M = saved

        t0 = time.perf_counter()
        first_tok_at = [None] * len(prompt_ids)
        sent_at = [None] * len(prompt_ids)
        outputs = [None] * len(prompt_ids)
        group_times = []
        for g0 in range(0, len(prompt_ids), args.batch_size):
            g_start = time.perf_counter()
            idxs = list(range(g0, min(g0 + args.batch_size, len(prompt_ids))))
            for i in idxs:
                sent_at[i] = g_start

            def on_first(j, idxs=idxs):
                first_tok_at[idxs[j]] = time.perf_counter()

            res = run_group([prompt_ids[i] for i in idxs], on_first)
            for i, r in zip(idxs, res):
                outputs[i] = r
            g_end = time.perf_counter()
            prefill_s = first_tok_at[idxs[-1]] - g_start
            group_times.append({"requests": len(idxs), "prefill_s": prefill_s, "decode_s": g_end - g_start - prefill_s,
                                "decode_tok_per_s": len(idxs) * (M - 1) / max(g_end - g_start - prefill_s, 1e-9)})
        wall = time.perf_counter() - t0

    ttft = [first_tok_at[i] - sent_at[i] for i in range(len(prompt_ids))]
    ttft_t0 = [first_tok_at[i] - t0 for i in range(len(prompt_ids))]
    total_out = sum(len(o) for o in outputs)
    summary = {
        "num_requests": len(prompt_ids),
        "completed": len(prompt_ids),
        "failed": 0,
        "concurrency": args.batch_size,
        "max_tokens": M,
        "total_output_tokens": total_out,
        "total_prompt_tokens": sum(len(p) for p in prompt_ids),
        "wall_s": wall,
        "output_tok_per_s": total_out / wall,
        "ttft_mean_s": mean(ttft),
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p90_s": percentile(ttft, 90),
        "ttft_p99_s": percentile(ttft, 99),
        "ttft_t0_mean_s": mean(ttft_t0),
        "ttft_t0_p50_s": percentile(ttft_t0, 50),
        "ttft_t0_p90_s": percentile(ttft_t0, 90),
        "num_early_stops": 0,
    }
    return {
        "system": args.label,
        "args": vars(args),
        "summary": summary,
        "groups": group_times,
        "text_preview": [tok.decode(o[:24]) for o in outputs[:2]],
        # Same shape as chat_load's per-request records, for output cross-checks.
        "requests": [{"index": i, "completion_tokens": len(o), "ttft": ttft[i],
                      "text_preview": tok.decode(o, skip_special_tokens=True)[:120]} for i, o in enumerate(outputs)],
    }


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description="raw batched decode loop (ceiling)",
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--model", required=True, help="checkpoint directory")
    p.add_argument("--label", default="raw-loop")
    p.add_argument("--num-requests", "-n", type=int, default=64)
    p.add_argument("--batch-size", "-b", type=int, default=32, help="decode batch (= client concurrency)")
    p.add_argument("--max-tokens", "-m", type=int, default=128)
    p.add_argument("--seed", type=int, default=0, help="prompt-set seed (same as chat_load)")
    p.add_argument("--prompt-words", type=int, default=10, help="same as chat_load --prompt-words")
    p.add_argument("--cache", choices=["static", "dynamic"], default="static")
    p.add_argument("--attn", choices=["sdpa_gqa", "sdpa", "eager"], default="sdpa_gqa")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument(
        "--tokenizer",
        choices=["auto", "omni"],
        default="auto",
        help="auto: transformers' AutoTokenizer (what transformers serve uses); omni: the "
        "tokenizer.json-faithful loader omni-serve uses (same prompt ids as omni-serve)",
    )
    p.add_argument("--out", default=None)
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    report = run(args)
    s = report["summary"]
    print(
        f"[{report['system']}] cache={args.cache} attn={args.attn} n={s['num_requests']} b={args.batch_size} "
        f"m={s['max_tokens']}: out_tokens={s['total_output_tokens']} wall={s['wall_s']:.2f}s\n"
        f"  output tok/s = {s['output_tok_per_s']:.2f}\n"
        f"  TTFT (closed loop) mean/p50/p90 = {s['ttft_mean_s']:.3f} / {s['ttft_p50_s']:.3f} / {s['ttft_p90_s']:.3f} s\n"
        f"  TTFT (all at t0)   mean/p50/p90 = {s['ttft_t0_mean_s']:.3f} / {s['ttft_t0_p50_s']:.3f} / "
        f"{s['ttft_t0_p90_s']:.3f} s\n"
        f"  groups: " + "; ".join(f"prefill {g['prefill_s']:.2f}s decode {g['decode_s']:.2f}s "
                                  f"({g['decode_tok_per_s']:.1f} tok/s)" for g in report["groups"])
    )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"  wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
