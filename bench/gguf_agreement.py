#!/usr/bin/env python3
"""--quantization gguf against llama.cpp's own output on the same file, and against the float
model (issue 33, item 2 and acceptance 4). Timing plays no part: it may run on a busy machine.

llama-server (bench/build_llama_cpp.sh) serves SmolLM2's Q4_1 file and continues --prompts chat
prompts greedily for --tokens tokens (EOS ignored; /completion on the prompt's token ids, so
both sides read the same tokens). Then each continuation is read teacher-forced, in one forward
of prompt + continuation, by omni-serve's model with the file's blocks kept (--quantization
gguf) and by the same file dequantized to float32, and at every position we count:

- gguf == llama.cpp: our top-1 token is the one llama.cpp chose (both quantize activations per
  block of 32 to int8, in their own order of sums);
- float == llama.cpp: the float model's top-1 is llama.cpp's choice;
- gguf == float: the two of ours agree (the activations' rounding alone).

    python bench/gguf_agreement.py                    # 64 prompts x 128 tokens
    python bench/gguf_agreement.py --prompts 8 --tokens 32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(BENCH))

import torch
from int8_quality import chat_prompts, teacher_forced_logits
from run_text_bench import free_port

from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.llm.loader import load_model


def llama_continuations(server: Path, gguf: Path, prompts: list[list[int]], tokens: int, threads: int) -> list[list[int]]:
    port = free_port()
    proc = subprocess.Popen(
        [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads),
         "--ctx-size", "2048", "--parallel", "1"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):
            try:
                with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        out = []
        for prompt in prompts:
            body = {"prompt": prompt, "n_predict": tokens, "temperature": 0, "top_k": 1, "ignore_eos": True,
                    "return_tokens": True, "cache_prompt": False}  # fmt: skip
            req = urllib.request.Request(f"{base}/completion", json.dumps(body).encode(), {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=600) as r:
                got = json.load(r)["tokens"]
            if len(got) != tokens:
                raise RuntimeError(f"llama-server gave {len(got)} tokens, not {tokens}")
            out.append(got)
        return out
    finally:
        proc.terminate()
        proc.wait(30)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    from gpu_workers.tiny.smollm2 import smollm2_gguf

    gguf = smollm2_gguf()
    server = Path(subprocess.run([str(BENCH / "build_llama_cpp.sh")], check=True, capture_output=True, text=True)
                  .stdout.strip().splitlines()[-1])  # fmt: skip
    prompts = chat_prompts(gguf, args.prompts)
    theirs = llama_continuations(server, gguf, prompts, args.tokens, args.threads)
    torch.set_num_threads(args.threads)
    cpu = torch.device("cpu")
    kept = load_model(gguf, device=cpu, dtype=torch.float32, backend=TorchSDPABackend(16, cpu), quantization="gguf")
    plain = load_model(gguf, device=cpu, dtype=torch.float32, backend=TorchSDPABackend(16, cpu))
    counts = {"gguf == llama.cpp": 0, "float == llama.cpp": 0, "gguf == float": 0}
    total = 0
    for prompt, continuation in zip(prompts, theirs, strict=True):
        want = torch.tensor(continuation)
        a = teacher_forced_logits(kept, prompt, continuation).argmax(-1)  # type: ignore[arg-type]
        b = teacher_forced_logits(plain, prompt, continuation).argmax(-1)  # type: ignore[arg-type]
        counts["gguf == llama.cpp"] += int((a == want).sum())
        counts["float == llama.cpp"] += int((b == want).sum())
        counts["gguf == float"] += int((a == b).sum())
        total += len(continuation)
    shares = {k: v / total for k, v in counts.items()}
    print(f"SmolLM2-135M-Instruct Q4_1, {len(prompts)} prompts x {args.tokens} of llama.cpp's greedy tokens, teacher-forced top-1:")
    for k, v in shares.items():
        print(f"  {k:<20} {v:.2%}")
    if args.json:
        args.json.write_text(json.dumps({"prompts": len(prompts), "tokens": args.tokens, **shares}, indent=2))


if __name__ == "__main__":
    main()
