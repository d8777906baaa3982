"""A GGUF checkpoint against transformers on a real trained model (issue 23, acceptance 2):
SmolLM2-135M-Instruct as llama.cpp's Q4_1 file (Q4_1 and Q8_0 blocks, q/k rows permuted for
llama.cpp's RoPE), loaded by us (gpu_workers/llm/gguf_weights.py through loader.load_model and the
LLMRunner) and by transformers' AutoModelForCausalLM.from_pretrained(dir, gguf_file=...), which
dequantizes the same blocks with its own mapping and processors.

Measured on CPU, float32:
    weights     every tensor equal to transformers' (bf16 here: its float32 rounded once)
    greedy      20 chat prompts x 32 tokens equal token for token; the sampled tokens'
                logprobs within 4.0e-5 of the logits transformers chose them from
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from gpu_workers.llm.loader import _our_name, load_model
from gpu_workers.llm.runner import LLMRunner
from gpu_workers.models.llama import LlamaForCausalLM
from gpu_workers.models.registry import MergedLinear
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.shared import protocol
from omni.text.tokenizer import TextTokenizer
from tests.gpu_workers.conftest import StepDriver

CPU = torch.device("cpu")
MAX_NEW = 16  # 20 prompts x 16 greedy tokens: the acceptance counts prompts; a longer run proves nothing new
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colors.",
    "How many legs does a spider have?",
    "Write a haiku about the sea.",
    "What is 12 times 7?",
    "Give me a synonym for happy.",
    "Who wrote Romeo and Juliet?",
    "Explain photosynthesis in one sentence.",
    "What is the boiling point of water in Celsius?",
    "Translate 'good morning' into Spanish.",
    "List two benefits of exercise.",
    "What planet is known as the Red Planet?",
    "Describe a cat in five words.",
    "What does a CPU do?",
    "Suggest a name for a pet goldfish.",
    "Why is the sky blue?",
    "What is the largest ocean on Earth?",
    "Tell me a fun fact about honey.",
    "How do you make a cup of tea?",
    "What is the square root of 81?",
]


@pytest.fixture(scope="module")
def hf(smollm2_gguf: Path) -> Any:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        smollm2_gguf.parent, gguf_file=smollm2_gguf.name, dtype=torch.float32
    )
    return model.eval()


def test_weights_equal_transformers_dequantized_ones_cast_to_the_serving_dtype(smollm2_gguf: Path, hf: Any) -> None:
    ours = load_model(smollm2_gguf, device=CPU, dtype=torch.bfloat16, backend=TorchSDPABackend(16, CPU))
    assert ours.config.num_layers == 30 and ours.config.tie_word_embeddings
    params = dict(ours.named_parameters())
    modules = dict(ours.named_modules())
    theirs = hf.state_dict()
    assert len(theirs) == 1 + 30 * 9 + 2  # embeddings, 9 per layer, final norm, the tied head
    for hf_name, want in theirs.items():
        if hf_name == "lm_head.weight":
            continue  # tied: embed_tokens
        target = _our_name(hf_name, LlamaForCausalLM.STACKED_PARAMS)
        assert target is not None, hf_name
        name, shard = target
        got = params[name].data
        if shard is not None:
            module = modules[name.rsplit(".", 1)[0]]
            assert isinstance(module, MergedLinear)
            start = sum(module.shard_sizes[:shard])
            got = got[start : start + module.shard_sizes[shard]]
        assert got.dtype == torch.bfloat16
        assert torch.equal(got, want.to(torch.bfloat16)), hf_name


def test_greedy_equals_transformers_on_20_chat_prompts(smollm2_gguf: Path, hf: Any) -> None:
    """Ours as the worker runs it (LLMRunner on the file, packed CPU linears, the real
    scheduler, paged KV blocks scattered, prefill chunked), transformers generate() one prompt
    at a time. Sampled logprobs within 1e-3 (worst measured 4.0e-5 over 32 tokens)."""
    tokenizer = TextTokenizer.from_gguf(smollm2_gguf)
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    runner = LLMRunner(smollm2_gguf, device="cpu", dtype=torch.float32, block_size=16, num_kv_blocks=20 * 8)
    driver = StepDriver(runner, chunk=256, seed=5)
    got = driver.run(prompts, MAX_NEW, sampling=[protocol.SamplingOptions(temperature=0.0, logprobs=0)] * len(prompts))
    logprobs: dict[str, list[float]] = {}
    for result in driver.results:
        for s in result.sampled:
            assert s.logprob is not None
            logprobs.setdefault(s.request_id, []).append(s.logprob)

    worst = 0.0
    for i, prompt in enumerate(prompts):
        want, logits = hf_greedy_logits(hf, prompt)
        assert got[i] == want, f"prompt {i} ({QUESTIONS[i]!r}): {tokenizer.decode(got[i])!r} != {tokenizer.decode(want)!r}"
        theirs = logits.log_softmax(-1).gather(1, torch.tensor(want).view(-1, 1)).view(-1)
        worst = max(worst, (torch.tensor(logprobs[f"r{i}"]) - theirs).abs().max().item())
    print(f"worst sampled-logprob difference: {worst:.2e}")
    assert "Paris" in tokenizer.decode(got[0])
    assert worst < 1e-3, worst


def hf_greedy_logits(model: Any, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation and the logits it chose each token from (MAX_NEW, V)."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_NEW, min_new_tokens=MAX_NEW,
            do_sample=False, eos_token_id=None, pad_token_id=0, return_dict_in_generate=True, output_logits=True,
        )  # fmt: skip
    return out.sequences[0, len(prompt) :].tolist(), torch.cat(out.logits).float()


def write_gguf(checkpoint: Path, out: Path) -> None:
    """The tiny checkpoint as llama.cpp's convert_hf_to_gguf.py writes it, in float32: its
    metadata keys, gguf's tensor names, and for llama the q/k rows permuted (pairs of the rotary
    halves interleaved, LlamaModel.permute in the converter)."""
    import gguf

    config = json.loads((checkpoint / "config.json").read_text())
    arch = config["model_type"]
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    writer.add_vocab_size(config["vocab_size"])
    if arch == "llama":
        writer.add_rope_dimension_count(config["head_dim"])
    arch_id = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_id, config["num_hidden_layers"])

    def permute(w: np.ndarray, n_head: int) -> np.ndarray:
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    for name, tensor in load_file(checkpoint / "model.safetensors").items():
        w = tensor.numpy()
        if arch == "llama" and name.endswith("q_proj.weight"):
            w = permute(w, config["num_attention_heads"])
        elif arch == "llama" and name.endswith("k_proj.weight"):
            w = permute(w, config["num_key_value_heads"])
        module, _, suffix = name.rpartition(".")
        writer.add_tensor(f"{names.get_name(module)}.{suffix}", np.ascontiguousarray(w))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.mark.parametrize("model_type", ["llama", "qwen2"])
def test_a_converted_checkpoint_loads_as_its_safetensors(model_type: str, tmp_path: Path) -> None:
    """llama (q/k permuted) and qwen2 (q/k/v biases, not permuted): every weight equal to the
    safetensors checkpoint's, read back through gguf's names and transformers' un-permutation."""
    checkpoint = make_tiny_checkpoint(tmp_path / "ckpt", model_type)
    write_gguf(checkpoint, tmp_path / "tiny.gguf")
    backend = TorchSDPABackend(16, CPU)
    want = load_model(checkpoint, device=CPU, dtype=torch.float32, backend=backend)
    got = load_model(tmp_path / "tiny.gguf", device=CPU, dtype=torch.float32, backend=backend)
    assert dict(got.named_parameters()).keys() == dict(want.named_parameters()).keys()
    for (name, a), b in zip(got.named_parameters(), want.parameters(), strict=True):
        assert torch.equal(a, b), name
    assert got.config.rope_theta == want.config.rope_theta and got.config.qkv_bias == (model_type == "qwen2")
