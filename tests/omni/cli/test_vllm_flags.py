"""vLLM's flags without a counterpart: the error names the first one and says why; and
--quantization takes vLLM's names for int8, refusing the others with their reason."""

from __future__ import annotations

import pytest

from omni.cli.vllm_flags import UNSUPPORTED_VLLM_FLAGS, quantization_method, unsupported_flag_message


def test_a_vllm_flag_is_named_with_its_reason() -> None:
    message = unsupported_flag_message(["--enable-lora", "--max-loras", "4"])
    assert message == "--enable-lora is a vLLM flag omni-serve does not support: LoRA adapters are not served"
    assert unsupported_flag_message(["--swap-space=4"]) == (
        "--swap-space is a vLLM flag omni-serve does not support: " + UNSUPPORTED_VLLM_FLAGS["--swap-space"]
    )


def test_an_unknown_flag_or_a_stray_value_is_said_so() -> None:
    assert unsupported_flag_message(["--frobnicate", "1"]) == "unknown flag --frobnicate (omni-serve --help lists the flags)"
    assert unsupported_flag_message(["stray"]) == "unexpected argument 'stray'"
    assert unsupported_flag_message(["-"]) == "unexpected argument '-'"
    assert unsupported_flag_message([]) is None


def test_every_reason_is_written() -> None:
    assert all(flag.startswith("-") and reason for flag, reason in UNSUPPORTED_VLLM_FLAGS.items())


@pytest.mark.parametrize("name", ["int8", "INT8", " tpu_int8 "])
def test_vllms_names_for_int8_are_int8(name: str) -> None:
    assert quantization_method(name) == "int8"


def test_gguf_is_served() -> None:
    assert quantization_method(" GGUF") == "gguf"


@pytest.mark.parametrize(
    ("name", "reason"),
    [("fp8", "fp8 and fp4 weights are not served"), ("awq", "quantized beforehand"),
     ("experts_int8", "mixture-of-experts"), ("nf5", "not a quantization omni-serve knows")],
)  # fmt: skip
def test_other_quantizations_are_refused_saying_why(name: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as refused:
        quantization_method(name)
    assert str(refused.value).startswith(f"--quantization {name}:") and "(served: int8, tpu_int8, gguf)" in str(refused.value)
