"""The tokenizer, chat template and stop ids of a GGUF model path come from the file's metadata
(TextTokenizer.from_gguf), as transformers' own GGUF reading gives them: compared with
AutoTokenizer.from_pretrained(dir, gguf_file=...) on SmolLM2-135M-Instruct's file. Exact: equal
ids for every text and chat below, the same template and special tokens."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from omni.text.tokenizer import TextTokenizer

TEXTS = [
    "What is the capital of France?",
    "  leading spaces, tabs\tand\nnewlines\n\n",
    "Numbers 1234567 and 3.14159; émoji 🙂 and 漢字 and Ελληνικά",
    "<|im_start|>user\nspecial tokens in plain text<|im_end|>",
    "def f(x):\n    return x ** 2  # code",
]


@pytest.fixture(scope="module")
def ours(smollm2_gguf: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(smollm2_gguf)  # a .gguf path goes to from_gguf


@pytest.fixture(scope="module")
def theirs(smollm2_gguf: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name)


def test_encodes_as_transformers_gguf_tokenizer(ours: TextTokenizer, theirs: Any) -> None:
    assert ours.vocab_size == len(theirs) == 49152
    for text in TEXTS:
        assert ours.hf_tokenizer.encode(text) == theirs.encode(text), text
        ids = theirs.encode(text, add_special_tokens=False)
        assert ours.decode(ids, skip_special_tokens=False) == theirs.decode(ids), text
    assert ours.special_token_ids == frozenset(i for i, t in theirs.added_tokens_decoder.items() if t.special)
    assert len(ours.special_token_ids) == 17  # the control tokens (<|im_start|>, <|im_end|>, <repo_name>, ...)


def test_chat_template_and_eos_come_from_the_metadata(smollm2_gguf: Path, ours: TextTokenizer, theirs: Any) -> None:
    from gguf import GGUFReader

    fields = GGUFReader(smollm2_gguf).fields
    template = fields["tokenizer.chat_template"].contents()
    assert "<|im_start|>" in template
    assert ours.hf_tokenizer.chat_template == template == theirs.chat_template
    eos = fields["tokenizer.ggml.eos_token_id"].contents()
    assert ours.eos_token_ids == frozenset({eos}) == frozenset({theirs.eos_token_id})
    assert ours.hf_tokenizer.eos_token == "<|im_end|>"

    chat = [
        {"role": "system", "content": "Answer in one word."},
        {"role": "user", "content": "What is the capital of France?"},
        {"role": "assistant", "content": "Paris"},
        {"role": "user", "content": "And of Italy?"},
    ]
    want = theirs.apply_chat_template(chat, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert ours.apply_chat_template(chat) == list(want)
    # the template's own default system prompt, when the chat has none
    assert "You are a helpful AI assistant named SmolLM" in ours.render_prompt(chat[1:2])


def test_the_server_reads_a_gguf_tokenizer_without_torch(smollm2_gguf: Path) -> None:
    code = f"""
import sys
from omni.model_layout import ModelLayout
from omni.text.tokenizer import TextTokenizer
layout = ModelLayout.from_dir({str(smollm2_gguf)!r})
assert layout.llm_dir == layout.root and not layout.has_encoders
tok = TextTokenizer.from_dir(layout.llm_dir)
assert tok.apply_chat_template([{{"role": "user", "content": "hi"}}])
assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=Path(__file__).parents[3])
