#!/usr/bin/env python3
"""Write a deterministic random Qwen2 checkpoint (+ tiny tokenizer) for CPU benchmarks.

    python bench/make_checkpoint.py --out bench/.cache/qwen2-100m            # ~101M params
    python bench/make_checkpoint.py --out bench/.cache/qwen2-tiny --size tiny # ~0.5M, for smoke tests

The tokenizer is the repo's tiny byte-level BPE (``gpu_workers.tiny.tokenizer``, ~1.4k ids,
ChatML template, eos ``<|im_end|>``). Because the vocabulary is tiny, the ~100M parameters
sit in the transformer body (hidden 768, 12 layers, 12 query / 4 KV heads, MLP 2944);
``vocab_size`` is the tokenizer size rounded up to a multiple of 64.

Weights are float32: the benchmark is about CPU serving and float32 is the dtype every
system handles natively on CPU (bf16 matmuls on CPU go through slower/less uniform kernels
across torch builds, which would measure the kernels instead of the serving engine).

"Never stops early" trick (documented in bench/README.md): with tied embeddings a token's
logit is ``<h, E[token]>``. We zero the embedding rows of (a) every added/special token
(``<|im_end|>`` = eos included), (b) every vocabulary-padding id and (c) every BPE token
that does not decode to a standalone printable ASCII string (partial UTF-8 bytes, control
characters, newlines), contains "<" or ends in whitespace (streaming response parsers hold
those back while they look for tool-call / end markers, which would shift TTFT). Their
logits are then exactly 0 while ~1k random ASCII tokens compete, so greedy decoding never
picks them (the max of ~1k zero-mean logits is > 0 with probability 1 - 2^-1000): every
request runs to ``max_tokens`` on every server, no ``ignore_eos`` needed, and every output
token detokenises to a non-empty ASCII delta (so per-token streaming and TTFT are not
distorted by held-back partial characters). The client still verifies token counts.

Re-running with the same arguments reuses the directory (``.bench_ckpt.json`` marker).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

SIZES = {
    # ~101M params: 12 x (attn 1.57M + MLP 6.78M) + tied embeddings ~1.1M
    "100m": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, num_key_value_heads=4,
                 intermediate_size=2944),
    # smoke-test size
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=384),
}


def _import_tiny_tokenizer(wait_s: float):
    """The repo's tiny tokenizer builder (gpu_workers/tiny/tokenizer.py); polls for it if absent."""
    sys.path.insert(0, str(REPO))
    path = REPO / "gpu_workers" / "tiny" / "tokenizer.py"
    deadline = time.time() + wait_s
    while not path.exists():
        if time.time() > deadline:
            raise SystemExit(f"{path} not found after {wait_s}s")
        print(f"[make_checkpoint] waiting for {path} ...", file=sys.stderr)
        time.sleep(10)
    from gpu_workers.tiny.tokenizer import build_tiny_tokenizer

    return build_tiny_tokenizer


def _never_emit_ids(tok_dir: Path, vocab_size: int) -> list[int]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
    n = tok.get_vocab_size(with_added_tokens=True)
    added = {int(i) for i in tok.get_added_tokens_decoder().keys()}
    bad = set(range(n, vocab_size)) | added
    for i in range(n):
        if i in bad:
            continue
        s = tok.decode([i], skip_special_tokens=False)
        # Emittable: printable ASCII, no "<" and no trailing whitespace. Servers' streaming
        # response parsers (e.g. transformers' qwen2 template: r"\s*<tool_call>", r"\s*<|im_end|>")
        # hold back whitespace and "<" until disambiguated, which would shift TTFT by a few tokens
        # for reasons unrelated to scheduling.
        if not (s and s.isascii() and s.isprintable() and "<" not in s and not s[-1].isspace()):
            bad.add(i)
    return sorted(bad)


def make_checkpoint(out: Path, size: str = "100m", seed: int = 0, dtype: str = "float32",
                    wait_s: float = 600.0, force: bool = False) -> Path:
    spec = {"size": size, "seed": seed, "dtype": dtype, "arch": SIZES[size], "version": 3}
    marker = out / ".bench_ckpt.json"
    if not force and marker.exists() and json.loads(marker.read_text()) == spec:
        print(f"[make_checkpoint] reusing {out}")
        return out

    build_tiny_tokenizer = _import_tiny_tokenizer(wait_s)
    import torch
    from transformers import GenerationConfig, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    n_tok = int(build_tiny_tokenizer(out))
    tok = PreTrainedTokenizerFast.from_pretrained(str(out))
    vocab_size = (n_tok + 63) // 64 * 64
    eos_id = tok.convert_tokens_to_ids("<|im_end|>")
    bos_id = tok.convert_tokens_to_ids("<|endoftext|>")

    config = Qwen2Config(
        vocab_size=vocab_size,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=bos_id,
        use_sliding_window=False,
        torch_dtype=dtype,
        **SIZES[size],
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).eval()
    never = _never_emit_ids(out, vocab_size)
    with torch.no_grad():
        model.get_input_embeddings().weight[never] = 0.0
    model = model.to(getattr(torch, dtype))
    n_params = sum(p.numel() for p in model.parameters())
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=bos_id,
        do_sample=False,
    ).save_pretrained(str(out))
    marker.write_text(json.dumps(spec))
    print(f"[make_checkpoint] wrote {out}: {n_params / 1e6:.1f}M params, vocab {vocab_size} "
          f"(tokenizer {n_tok}), {len(never)} never-emitted ids, dtype {dtype}")
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="deterministic random qwen2 checkpoint for benchmarks")
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--size", choices=sorted(SIZES), default="100m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    p.add_argument("--wait", type=float, default=600.0, help="seconds to wait for gpu_workers/tiny/tokenizer.py")
    p.add_argument("--force", action="store_true", help="rebuild even if a matching checkpoint exists")
    a = p.parse_args(argv)
    make_checkpoint(a.out, a.size, a.seed, a.dtype, a.wait, a.force)
    return 0


if __name__ == "__main__":
    sys.exit(main())
