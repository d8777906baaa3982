"""bench/gpu_smoke/http_checks.py: the long prompt is counted in the served tokenizer's tokens."""

from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from bench.gpu_smoke.http_checks import prompt_of


def test_the_long_prompt_is_the_most_words_within_the_token_count(tiny_tokenizer_dir: Path) -> None:
    path = tiny_tokenizer_dir / "tokenizer.json"
    text, n = prompt_of(path, 2000)
    tok = Tokenizer.from_file(str(path))
    assert n == len(tok.encode(text, add_special_tokens=False).ids) <= 2000
    longer = prompt_of(path, 4000)[0]
    assert longer.startswith(text)  # the same words, cut later
    one_more = " ".join(longer.split(" ")[: len(text.split(" ")) + 1])
    assert len(tok.encode(one_more, add_special_tokens=False).ids) > 2000
    assert len(text.split(" ")) < n  # words are not tokens: this tokenizer makes more than one of each
