"""vLLM's flags that omni-serve does not take, and why: a vLLM launch line fails naming them.

Flags with a counterpart are accepted under vLLM's name by the parser itself (omni/cli/main.py);
the ones below have none. A flag in neither place is simply unknown.
"""

from __future__ import annotations

from collections.abc import Sequence

UNSUPPORTED_VLLM_FLAGS: dict[str, str] = {
    "--quantization": "checkpoints are served in the dtype given by --dtype; quantized weights are not read",
    "-q": "checkpoints are served in the dtype given by --dtype; quantized weights are not read",
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
    "--speculative-config": "speculative decoding is not implemented",
    "--cpu-offload-gb": "weights stay on their device",
    "--swap-space": "preempted requests are recomputed, not swapped to host memory",
    "--kv-transfer-config": "there is no disaggregated prefill; several nodes go behind a gateway (docs/SCALE_OUT.md)",
    "--distributed-executor-backend": "workers are processes the server supervises itself",
    "--limit-mm-per-prompt": "use --max-media-items (per request) and the other media limits",
    "--structured-outputs-config": "structured output always uses llguidance",
    "--guided-decoding-backend": "structured output always uses llguidance",
    "--scheduling-policy": "the scheduler serves requests first come, first served",
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
