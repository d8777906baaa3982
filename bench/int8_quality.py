"""How close `--quantization int8` (or `gguf`: the file's blocks kept) stays to bf16 on a real
trained model (issue 23 acceptance 2, issue 33 acceptance 4).

SmolLM2-135M-Instruct (its Q4_1 GGUF, gpu_workers/tiny/smollm2.py) answers --prompts chat
prompts greedily in bf16 through the LLM runner (paged KV cache, batched decode, EOS ignored so
every continuation is --tokens long). Then the bf16 model and the int8 one (as served: int8
Linear weights but those the model class's INT8_KEEP names) each read prompt + continuation in one forward (teacher forcing: the bf16
continuation fed back), and at each of the continuation's positions we compare:

- agreement: int8's top-1 token equals the bf16 greedy token (the acceptance's figure), and
  int8's top-1 equals bf16's own top-1 in that same forward (the same computation, weights apart);
- the logits: the worst |int8 - bf16| over every position and vocabulary entry, next to the
  largest |bf16 logit| for scale.

Timing plays no part: this may run on a busy machine.

    python bench/int8_quality.py                       # 64 prompts x 128 tokens
    python bench/int8_quality.py --prompts 8 --tokens 32
    python bench/int8_quality.py --quantization gguf   # the Q4_1 file's blocks as they are
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch

from gpu_workers.attention.backend import SequenceChunk
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.llm.loader import load_model
from gpu_workers.llm.runner import LLMRunner
from gpu_workers.models.llama import LlamaForCausalLM

SUBJECTS = ["the moon", "a bicycle", "coffee", "the ocean", "volcanoes", "honey bees", "the internet", "chess"]
ASKS = [
    "What is {}?",
    "Tell me three facts about {}.",
    "Write a short poem about {}.",
    "Explain {} to a child.",
    "What are the benefits of {}?",
    "Describe the history of {} in two sentences.",
    "Give me a fun fact about {}.",
    "How would you explain {} to someone from the year 1500?",
]
# 64 questions: each ask about each subject
QUESTIONS = [ask.format(subject) for ask in ASKS for subject in SUBJECTS]


@dataclass(frozen=True, slots=True)
class Agreement:
    prompts: int
    tokens: int  # per prompt
    agree_with_greedy: float  # int8 top-1 == the bf16 greedy token, share of positions
    agree_with_forward: float  # int8 top-1 == bf16 top-1 of the same teacher-forced forward
    bf16_self: float  # bf16 teacher-forced top-1 == its own greedy token (prefill vs paged decode)
    worst_logit_diff: float
    largest_logit: float


def chat_prompts(gguf: Path, count: int) -> list[list[int]]:
    from omni.text.tokenizer import TextTokenizer

    tokenizer = TextTokenizer.from_gguf(gguf)
    return [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS[:count]]


def greedy_continuations(gguf: Path, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """bf16 greedy continuations as the server's LLM worker makes them (EOS ignored)."""
    from tests.gpu_workers.conftest import StepDriver

    blocks = sum(-(-(len(p) + tokens) // 16) for p in prompts)
    runner = LLMRunner(gguf, device="cpu", dtype=torch.bfloat16, block_size=16, num_kv_blocks=blocks)
    return StepDriver(runner, chunk=512).run(prompts, tokens)


def teacher_forced_logits(model: LlamaForCausalLM, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """(len(continuation), V) float32 logits: row i is what the model predicts for
    continuation[i] having read prompt + continuation[:i]."""
    ids = torch.tensor(prompt + continuation[:-1])
    backend = model.layers[0].self_attn.backend
    metadata = backend.build_metadata([SequenceChunk(0, len(ids), 0, [])])
    with torch.inference_mode():
        hidden = model(ids, torch.arange(len(ids)), None, metadata)  # (T, H)
        return model.compute_logits(hidden[len(prompt) - 1 :])


def measure(gguf: Path, prompts: list[list[int]], tokens: int, quantization: str = "int8") -> Agreement:
    continuations = greedy_continuations(gguf, prompts, tokens)
    cpu = torch.device("cpu")
    models = {
        q: load_model(gguf, device=cpu, dtype=torch.bfloat16, backend=TorchSDPABackend(16, cpu), quantization=q)
        for q in (None, quantization)
    }
    with_greedy = with_forward = self_agree = total = 0
    worst = largest = 0.0
    for prompt, continuation in zip(prompts, continuations, strict=True):
        bf16 = teacher_forced_logits(models[None], prompt, continuation)
        int8 = teacher_forced_logits(models[quantization], prompt, continuation)
        want = torch.tensor(continuation)
        with_greedy += int((int8.argmax(-1) == want).sum())
        with_forward += int((int8.argmax(-1) == bf16.argmax(-1)).sum())
        self_agree += int((bf16.argmax(-1) == want).sum())
        total += len(continuation)
        worst = max(worst, (int8 - bf16).abs().max().item())
        largest = max(largest, bf16.abs().max().item())
    return Agreement(
        prompts=len(prompts),
        tokens=tokens,
        agree_with_greedy=with_greedy / total,
        agree_with_forward=with_forward / total,
        bf16_self=self_agree / total,
        worst_logit_diff=worst,
        largest_logit=largest,
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--prompts", type=int, default=64, help=f"at most {len(QUESTIONS)}")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, help="also write the figures here")
    p.add_argument("--quantization", default="int8", choices=("int8", "gguf"))
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from gpu_workers.tiny.smollm2 import smollm2_gguf

    gguf = smollm2_gguf()
    result = measure(gguf, chat_prompts(gguf, args.prompts), args.tokens, args.quantization)
    q = args.quantization
    print(
        f"SmolLM2-135M-Instruct, {result.prompts} prompts x {result.tokens} tokens, teacher-forced:\n"
        f"  {q} top-1 == bf16 greedy token:        {result.agree_with_greedy:.2%}\n"
        f"  {q} top-1 == bf16 top-1, same forward: {result.agree_with_forward:.2%}\n"
        f"  bf16 top-1 == its own greedy token:     {result.bf16_self:.2%}\n"
        f"  worst |{q} - bf16| logit: {result.worst_logit_diff:.3f} (largest |bf16 logit| {result.largest_logit:.1f})"
    )
    if args.json:
        args.json.write_text(json.dumps(asdict(result), indent=2))


if __name__ == "__main__":
    main()
