import json
from pathlib import Path
from typing import Any

import tokenizers
import transformers

from gpu_workers.tiny.tokenizer import REFERENCE_TOKENS, SPECIAL_TOKENS, build_tiny_tokenizer

FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def test_build_is_deterministic(tmp_path: Path) -> None:
    n1 = build_tiny_tokenizer(tmp_path / "a")
    n2 = build_tiny_tokenizer(tmp_path / "b")
    assert n1 == n2 == 1280 + len(SPECIAL_TOKENS) + 64 + 64 + len(REFERENCE_TOKENS)
    for name in FILES:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


def test_code_token_counts_are_parameters(tmp_path: Path) -> None:
    n = build_tiny_tokenizer(tmp_path, num_vision_codes=3, num_audio_codes=2)
    tok = tokenizers.Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert n == tok.get_vocab_size() == 1280 + len(SPECIAL_TOKENS) + 5 + len(REFERENCE_TOKENS)
    assert tok.token_to_id("<|vision00002|>") is not None
    assert tok.token_to_id("<|vision00003|>") is None
    assert tok.token_to_id("<|audio0001|>") == n - 1 - len(REFERENCE_TOKENS)  # the dialect's tokens come last


def test_loads_with_transformers_and_tokenizers(tiny_tokenizer_dir: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)
    raw = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    assert len(hf) == raw.get_vocab_size() == 1280 + len(SPECIAL_TOKENS) + 128 + len(REFERENCE_TOKENS) == 1458
    assert hf.eos_token == "<|im_end|>"
    assert hf.pad_token == "<|endoftext|>"
    assert hf.model_max_length == 8192
    config = json.loads((tiny_tokenizer_dir / "tokenizer_config.json").read_text())
    assert config["tokenizer_class"] == "PreTrainedTokenizerFast"
    for token in SPECIAL_TOKENS + ("<|vision00000|>", "<|vision00063|>", "<|audio0063|>"):
        token_id = raw.token_to_id(token)
        assert token_id is not None and token_id >= 1280
        assert hf.encode(token, add_special_tokens=False) == [token_id]
        assert hf.decode([token_id], skip_special_tokens=True) == ""


def test_multibyte_characters_span_several_tokens(tiny_tokenizer_dir: Path) -> None:
    raw = tokenizers.Tokenizer.from_file(str(tiny_tokenizer_dir / "tokenizer.json"))
    assert len(raw.encode("龍").ids) == 3
    assert len(raw.encode("🦄").ids) == 3
    # Token boundaries fall inside characters: the second token ends mid-character.
    assert raw.encode("안녕하세요").tokens == ["ì", "ķĪëħ", "ķíķ", "ĺìĦ", "¸ìļĶ"]
    assert raw.decode(raw.encode("안녕하세요 😀").ids) == "안녕하세요 😀"
    assert raw.encode("def fibonacci").tokens == ["def", "Ġfibonacci"]


def test_chat_template(tiny_tokenizer_dir: Path) -> None:
    hf = transformers.AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)
    parts = [{"type": "text", "text": "Hi "}, {"type": "text", "text": "안녕"}]
    messages: Any = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": parts},
        {"role": "assistant", "content": None},
    ]
    text = hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        "<|im_start|>user\nHi 안녕<|im_end|>\n"
        "<|im_start|>assistant\n<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    text = hf.apply_chat_template(messages[:1], tokenize=False, add_generation_prompt=False)
    assert text == "<|im_start|>system\nBe brief.<|im_end|>\n"
