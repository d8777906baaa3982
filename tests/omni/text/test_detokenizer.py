from pathlib import Path

import pytest
import transformers
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from omni.text.detokenizer import IncrementalDetokenizer
from omni.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tok(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture(scope="module")
def hf(tiny_tokenizer_dir: Path) -> transformers.PreTrainedTokenizerBase:
    return transformers.AutoTokenizer.from_pretrained(tiny_tokenizer_dir, local_files_only=True)


class _OffsetOnly(TextTokenizer):
    """The same tokenizer, pretending not to be byte-level, to exercise the offset decoder."""

    @property
    def is_byte_level(self) -> bool:
        return False


VOCAB = 1458
# Ids below 256 are single bytes: they split multi-byte characters. 1280.. are specials.
token_id = st.one_of(
    st.integers(0, 255), st.integers(0, VOCAB - 1), st.integers(1280, VOCAB - 1)
)
text = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40
) | st.sampled_from(["안녕하세요 😀", "龍🦄 crème brûlée", "def fibonacci(n):\n"])


def stream(detok: IncrementalDetokenizer, ids: list[int], cuts: list[int]) -> list[str]:
    """Push ids in chunks cut at the given points; return every delta, finish() last."""
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    deltas = [detok.push(ids[a:b]) for a, b in zip(bounds, bounds[1:])]
    return deltas + [detok.finish()]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ids=st.lists(token_id, max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=40),
    skip=st.booleans(),
)
def test_random_ids_decode_exactly(
    tok: TextTokenizer, hf: transformers.PreTrainedTokenizerBase, ids: list[int], cuts: list[int], skip: bool
) -> None:
    detok = IncrementalDetokenizer(tok, [1281, 100], skip_special_tokens=skip)
    out = "".join(stream(detok, ids, cuts))
    assert out == tok.decode(ids, skip_special_tokens=skip)
    assert out == hf.decode(ids, skip_special_tokens=skip)
    assert not detok.stopped


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(s=text, cuts=st.lists(st.integers(0, 80), max_size=80))
def test_valid_text_never_emits_replacement_char(tok: TextTokenizer, s: str, cuts: list[int]) -> None:
    ids = tok.encode(s)
    # Special-token text in s (e.g. "<|im_end|>") encodes to a special token that decodes to "".
    full = tok.decode(ids)
    for t in (tok, _OffsetOnly(tok.hf_tokenizer, tok.eos_token_ids)):
        deltas = stream(IncrementalDetokenizer(t, [1281]), ids, cuts)
        assert "".join(deltas) == full
        if "\ufffd" not in full:
            assert all("\ufffd" not in d for d in deltas)


def test_one_token_at_a_time_waits_for_whole_character(tok: TextTokenizer) -> None:
    ids = tok.encode("a안녕하세요")
    assert len(ids) == 6
    detok = IncrementalDetokenizer(tok)
    # "안녕하세요" tokens end mid-character; each delta is the characters completed so far.
    assert [detok.push([i]) for i in ids] == ["a", "", "안", "녕", "하", "세요"]
    assert detok.finish() == ""


def test_incomplete_character_at_end_becomes_replacement(tok: TextTokenizer) -> None:
    ids = tok.encode("안")[:1]
    detok = IncrementalDetokenizer(tok)
    assert detok.push(ids) == ""
    assert detok.finish() == "\ufffd" == tok.decode(ids)


def test_byte_level_path_never_redecodes(tok: TextTokenizer, monkeypatch: pytest.MonkeyPatch) -> None:
    detok = IncrementalDetokenizer(tok)
    monkeypatch.setattr(tok, "decode", lambda *a, **k: pytest.fail("decode called"))
    assert "".join(detok.push([i]) for i in tok.encode("hello world")) == "hello world"


def pushed(detok: IncrementalDetokenizer, tok: TextTokenizer, pieces: list[str]) -> list[str]:
    return [detok.push(tok.encode(p)) for p in pieces] + [detok.finish()]


def test_stop_string_held_back_then_released(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["STOP"])
    assert pushed(detok, tok, ["Hello S", "T", "ay"]) == ["Hello ", "", "STay", ""]
    assert not detok.stopped and detok.stop_reason is None


def test_stop_string_truncates_and_nothing_after(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["STOP", "\n\n"])
    assert pushed(detok, tok, ["one ST", "OP two", " three"]) == ["one ", "", "", ""]
    assert detok.stopped and detok.stop_reason == "STOP"


def test_first_completed_stop_string_wins(tok: TextTokenizer) -> None:
    # "bc" completes before "abcd" would; output stops at "bc".
    detok = IncrementalDetokenizer(tok, stop=["abcd", "bc"])
    assert pushed(detok, tok, ["xa", "b", "c", "d"]) == ["x", "", "a", "", ""]
    assert detok.stop_reason == "bc"
    # In one chunk, the earliest starting one wins.
    detok = IncrementalDetokenizer(tok, stop=["bc", "abcd"])
    assert pushed(detok, tok, ["xabcd"]) == ["x", ""]
    assert detok.stop_reason == "abcd"


def test_stop_string_in_multibyte_text(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["녕하"])
    ids = tok.encode("안녕하세요")
    deltas = [detok.push([i]) for i in ids] + [detok.finish()]
    assert "".join(deltas) == "안"
    assert detok.stop_reason == "녕하"


def test_stop_at_finish(tok: TextTokenizer) -> None:
    detok = IncrementalDetokenizer(tok, stop=["\ufffd"])
    assert detok.push(tok.encode("ok") + tok.encode("안")[:1]) == "ok"
    assert detok.finish() == ""
    assert detok.stop_reason == "\ufffd"


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    s=text,
    stops=st.lists(st.text(alphabet="ab안😀 \n", min_size=1, max_size=4), max_size=4),
    cuts=st.lists(st.integers(0, 80), max_size=80),
    offsets=st.booleans(),
)
def test_stop_strings_property(
    tok: TextTokenizer, s: str, stops: list[str], cuts: list[int], offsets: bool
) -> None:
    ids = tok.encode(s + "ab안😀 a\nb")
    s = tok.decode(ids)
    t = _OffsetOnly(tok.hf_tokenizer, tok.eos_token_ids) if offsets else tok
    detok = IncrementalDetokenizer(t, stop=stops)
    bounds = sorted({0, len(ids), *(c % (len(ids) + 1) for c in cuts)})
    emitted = ""
    for a, b in zip(bounds, bounds[1:]):
        emitted += detok.push(ids[a:b])
        assert s.startswith(emitted)  # a prefix of the text at every step
        assert not any(x in emitted for x in stops)  # never a (partial-then-completed) stop
    emitted += detok.finish()
    if detok.stopped:
        assert detok.stop_reason in stops
        assert s.startswith(emitted + detok.stop_reason)
        assert not any(x in emitted for x in stops)
    else:
        assert emitted == s
        assert not any(x in s for x in stops)
    if len(stops) == 1:
        i = s.find(stops[0])
        assert emitted == (s if i == -1 else s[:i])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ids=st.lists(token_id, max_size=40), cuts=st.lists(st.integers(0, 40), max_size=40))
def test_kept_specials_are_written_and_the_rest_skipped(
    tok: TextTokenizer, ids: list[int], cuts: list[int]
) -> None:
    """keep_special: the markup a parser reads (<think>, <tool_call>) survives a skipping decode."""
    keep = tok.special_ids("<think>", "</think>", "<tool_call>")
    assert len(keep) == 3
    expected = tok.decode(
        [i for i in ids if i in keep or i not in tok.special_token_ids], skip_special_tokens=False
    )
    for t in (tok, _OffsetOnly(tok.hf_tokenizer, tok.eos_token_ids)):
        detok = IncrementalDetokenizer(t, [1281, 100], keep_special=keep)
        assert "".join(stream(detok, ids, cuts)) == expected
