"""Token offsets into the text the client gets, special tokens skipped or not, characters split
across tokens; and stop strings kept in the text when asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni.text.detokenizer import IncrementalDetokenizer, token_offsets
from omni.text.tokenizer import TextTokenizer
from tests.omni.text.test_detokenizer import VOCAB, _OffsetOnly


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


# Single bytes (they split multi-byte characters), anything, and the specials (1280 on).
token_id = st.one_of(st.integers(0, 255), st.integers(0, VOCAB - 1), st.integers(1280, VOCAB - 1))


def pieces(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[str, list[int]]:
    """Push one id at a time as a generation does: the text emitted and each id's offset."""
    parts, offsets = [], []
    for t in ids:
        offsets.append(detok.num_decoded_chars)
        parts.append(detok.push([t]))
        if detok.stopped:  # a generation ends at its stop string
            break
    parts.append(detok.finish())
    return "".join(parts), offsets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(token_id, max_size=30), skip=st.booleans(), byte_level=st.booleans())
def test_each_token_owns_the_text_between_its_offset_and_the_next(
    tok: TextTokenizer, tiny_tokenizer_dir: Path, ids: list[int], skip: bool, byte_level: bool
) -> None:
    tokenizer = tok if byte_level else _OffsetOnly(tok.hf_tokenizer, tok.eos_token_ids)
    text, offsets = pieces(IncrementalDetokenizer(tokenizer, skip_special_tokens=skip), ids)
    assert text == tokenizer.decode(ids, skip_special_tokens=skip)
    bounds = [*offsets, len(text)]
    assert bounds == sorted(bounds) and (not offsets or offsets[0] == 0)
    # what each token adds, the pieces in order, make the text
    assert "".join(text[a:b] for a, b in zip(bounds, bounds[1:])) == text
    assert (text, offsets) == token_offsets(tokenizer, ids, skip_special_tokens=skip)


def test_skipped_special_tokens_add_no_text_and_shown_ones_their_name(tok: TextTokenizer) -> None:
    im_start, im_end = tok.token_to_id("<|im_start|>"), tok.token_to_id("<|im_end|>")
    assert im_start is not None and im_end is not None
    hi, there = tok.encode("Hi", add_special_tokens=False), tok.encode(" there", add_special_tokens=False)
    ids = [im_start, *hi, im_end, *there, im_end]
    text, offsets = token_offsets(tok, ids, skip_special_tokens=True)
    assert (text, len(hi), len(there)) == ("Hi there", 2, 1)  # "H" "i", " there"
    assert offsets == [0, 0, 1, 2, 2, 8]
    assert [text[a:b] for a, b in zip(offsets, [*offsets[1:], len(text)])] == [
        tok.decode([t]) for t in ids
    ]
    text, offsets = token_offsets(tok, ids, skip_special_tokens=False)
    assert text == "<|im_start|>Hi<|im_end|> there<|im_end|>"
    assert offsets == [0, 12, 13, 14, 24, 30]
    assert [text[a:b] for a, b in zip(offsets, [*offsets[1:], len(text)])] == [
        tok.decode([t], skip_special_tokens=False) for t in ids
    ]


def test_a_character_split_across_tokens_belongs_to_the_token_that_completes_it(
    tok: TextTokenizer,
) -> None:
    # é is the bytes C3 A9: byte-level tokens "Ã" and "©" (GPT-2's printable stand-ins)
    ids = [tok.token_to_id("Ã"), tok.token_to_id("©"), tok.token_to_id("!")]
    assert all(isinstance(t, int) for t in ids)
    text, offsets = token_offsets(tok, ids, skip_special_tokens=True)  # type: ignore[arg-type]
    assert (text, offsets) == ("é!", [0, 0, 1])


@pytest.mark.parametrize(("include", "expected"), [(False, "one "), (True, "one STOP")])
def test_a_stop_string_is_kept_only_when_asked(tok: TextTokenizer, include: bool, expected: str) -> None:
    detok = IncrementalDetokenizer(tok, stop=["STOP"], include_stop_str_in_output=include)
    ids = tok.encode("one STOP two", add_special_tokens=False)
    text, offsets = pieces(detok, ids)
    assert (text, detok.stop_reason) == (expected, "STOP")
    # the text is still a prefix of what was decoded, so the offsets still index it
    assert tok.decode(ids).startswith(text)
    assert offsets == token_offsets(tok, ids, skip_special_tokens=True)[1][: len(offsets)]


def test_a_kept_stop_string_ends_the_text_even_mid_token(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["ab"], include_stop_str_in_output=True)
    assert detok.push(tok.encode("xxabyy", add_special_tokens=False)) == "xxab"
    assert detok.stopped and detok.push([65]) == "" and detok.finish() == ""
