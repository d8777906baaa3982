"""vLLM's flags that omni-serve does not take, and why: a vLLM launch line fails naming them.

Flags with a counterpart are accepted under vLLM's name by the parser itself (omni/cli/main.py);
the ones below have none. A flag in neither place is simply unknown.
"""

from __future__ import annotations

from collections.abc import Sequence

UNSUPPORTED_VLLM_FLAGS: dict[str, str] = {
    "--kv-cache-dtype": "the KV cache is kept in the model's --dtype",
    "--tokenizer": "the tokenizer is read from the checkpoint directory",
    "--tokenizer-mode": "the tokenizer is read from the checkpoint directory",
    "--download-dir": "nothing is downloaded: a repo id is read from the local Hugging Face cache",
    "--hf-token": "nothing is downloaded: a repo id is read from the local Hugging Face cache",
    "--load-format": "weights are read from the checkpoint's safetensors",
    "--enable-lora": "LoRA adapters are not served",
    "--lora-modules": "LoRA adapters are not served",
    "--max-loras": "LoRA adapters are not served",
    "--max-lora-rank": "LoRA adapters are not served",
    "--cpu-offload-gb": "weights stay on their device",
    "--swap-space": "preempted requests are recomputed, not swapped to host memory",
    "--kv-transfer-config": "there is no disaggregated prefill; several nodes go behind a gateway (docs/SCALE_OUT.md)",
    "--distributed-executor-backend": "workers are processes the server supervises itself",
    "--limit-mm-per-prompt": "use --max-media-items (per request) and the other media limits",
    "--structured-outputs-config": "structured output always uses llguidance",
    "--guided-decoding-backend": "structured output always uses llguidance",
    "--compilation-config": "models run in eager mode",
    "-O": "models run in eager mode",
    "--enable-sleep-mode": "workers cannot release their memory while running",
    "--api-server-count": "one server process serves the API",
    "--middleware": "no user middleware is loaded",
    "--uds": "the server listens on TCP (--host, --port)",
    "--enable-lora-bias": "LoRA adapters are not served",
    "--max-num-partial-prefills": "chunked prefill has no partial-prefill limits",
    "--worker-extension-cls": "workers run omni-serve's own runners",
}


# --quantization: vLLM's names for the one scheme served here (int8 weights, a scale per output
# channel, quantized while loading; vLLM's tpu_int8 is that scheme), and why others are refused.
INT8_QUANTIZATION_NAMES = ("int8", "tpu_int8")
_PREQUANTIZED = (
    "reads a checkpoint quantized beforehand; omni-serve reads float (or GGUF) weights and "
    "quantizes them itself with --quantization int8"
)
_REFUSED_QUANTIZATIONS: dict[str, str] = {
    **dict.fromkeys(("fp8", "fbgemm_fp8", "ptpc_fp8", "mxfp4", "modelopt", "modelopt_fp4", "fp_quant"),
                    "fp8 and fp4 weights are not served; int8 weights are (--quantization int8)"),
    **dict.fromkeys(("awq", "awq_marlin", "gptq", "gptq_marlin", "gptq_marlin_24", "marlin", "compressed-tensors",
                     "bitsandbytes", "hqq", "quark", "auto-round", "inc", "ipex", "torchao", "gptq_bitblas",
                     "bitblas", "awq_triton"), _PREQUANTIZED),
    "experts_int8": "it quantizes mixture-of-experts layers, and the models served here have none; "
    "--quantization int8 quantizes every linear layer",
}  # fmt: skip


def quantization_method(name: str) -> str:
    """--quantization's value as the workers take it ("int8", "gguf"); ValueError saying why for
    any other of vLLM's names."""
    value = name.strip().lower()
    if value in INT8_QUANTIZATION_NAMES:
        return "int8"
    if value == "gguf":
        return "gguf"
    reason = _REFUSED_QUANTIZATIONS.get(value, "not a quantization omni-serve knows")
    raise ValueError(f"--quantization {name}: {reason} (served: {', '.join((*INT8_QUANTIZATION_NAMES, 'gguf'))})")


def unsupported_flag_message(extra: Sequence[str]) -> str | None:
    """The error for what the parser could not read: the first flag there, named, with why.

    `extra` is parse_known_args' leftover; values of an unknown flag are there too, so only
    tokens that look like flags are named."""
    flags = [t.split("=", 1)[0] for t in extra if t.startswith("-") and t != "-"]
    if not flags:
        return f"unexpected argument {extra[0]!r}" if extra else None
    flag = flags[0]
    reason = UNSUPPORTED_VLLM_FLAGS.get(flag)
    if reason is not None:
        return f"{flag} is a vLLM flag omni-serve does not support: {reason}"
    return f"unknown flag {flag} (omni-serve --help lists the flags)"
