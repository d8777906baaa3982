"""An image span the model opens is always one the decoder can draw: after <|discrete_image_start|>
the span grammar holds (ratio, vision token, rows of codes with their ends, eof, end); the text
around spans is free, and several spans may follow one another."""

from __future__ import annotations

import numpy as np
import pytest

from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.constrained.image_span import END, EOF, EOL, VISION_TOKEN, ImageSpanFormat
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer


def test_the_format_comes_from_the_vocabulary(tokenizer: TextTokenizer) -> None:
    fmt = ImageSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None
    assert fmt.num_codes == 64 and tokenizer.decode([fmt.first_code_id], skip_special_tokens=False) == "<|vision00000|>"
    assert "<|vision_ratio_16:9|>" in fmt.ratio_tokens and ImageSpanFormat.ratio("<|vision_ratio_16:9|>") == (16, 9)
    assert fmt.code_of(fmt.first_code_id + 63) == 63 and fmt.code_of(fmt.first_code_id + 64) is None
    assert fmt.span_tokens == 2 + 27 * 28 + 2


def _spans(tokenizer: TextTokenizer, ids: list[int], fmt: ImageSpanFormat) -> list[list[int]]:
    """The token ids of each span (after its opening token), split where the grammar says."""
    end = tokenizer.token_to_id(END)
    spans, current = [], None
    for t in ids:
        if current is not None:
            current.append(t)
            if t == end:
                spans.append(current)
                current = None
        elif t == fmt.start_token_id:
            current = []
    assert current is None, "every span the walk opened was closed"
    return spans


@pytest.mark.parametrize("rows, cols", [(27, 27), (2, 3)])
async def test_walks_make_only_whole_spans(compiler: GrammarCompiler, tokenizer: TextTokenizer, rows: int, cols: int) -> None:
    fmt = ImageSpanFormat.from_tokenizer(tokenizer, rows, cols)
    assert fmt is not None
    grammar = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, fmt.grammar(), "image"))
    text_tokens = tokenizer.encode("a cat on a mat, then", add_special_tokens=False)
    ratios = {tokenizer.token_to_id(r) for r in fmt.ratio_tokens}
    rng = np.random.default_rng(0)
    c = grammar.new_constraint(fmt.start_token_id, spans=True)
    ids: list[int] = []
    for _ in range(3):  # text, a span, text, a span, ...
        for t in text_tokens[: rng.integers(1, len(text_tokens))]:
            assert not c.active
            c.advance(t)
            ids.append(t)
        c.advance(fmt.start_token_id)
        ids.append(fmt.start_token_id)
        first = True
        while c.active:
            allowed = allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size)
            if first:
                assert set(allowed.tolist()) == ratios  # a span starts with its aspect ratio
                first = False
            t = int(rng.choice(allowed))
            c.advance(t)
            assert not c.violated and not c.complete  # spans never end the request
            ids.append(t)
    assert c.num_spans == 3
    spans = _spans(tokenizer, ids, fmt)
    assert len(spans) == 3
    for span in spans:
        assert len(span) == fmt.span_tokens
        text = [tokenizer.decode([t], skip_special_tokens=False) for t in span]
        assert text[0] in fmt.ratio_tokens and text[1] == VISION_TOKEN and text[-2:] == [EOF, END]
        rows_part = span[2:-2]
        for r in range(rows):
            row = rows_part[r * (cols + 1) : (r + 1) * (cols + 1)]
            assert all(fmt.code_of(t) is not None for t in row[:-1])
            assert tokenizer.decode([row[-1]], skip_special_tokens=False) == EOL


async def test_spans_beside_a_triggered_grammar(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    """tool_choice "auto" with image output: an image span opened in free text is held to the span
    grammar, a call opened by <tool_call> to the call grammar, and only the call ends the request."""
    from omni.text.constrained.constraint import WithSpans

    fmt = ImageSpanFormat.from_tokenizer(tokenizer, 2, 3)
    assert fmt is not None
    spans = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, fmt.grammar(), "image"))
    call_open = tokenizer.token_to_id("<tool_call>")
    call_close = tokenizer.token_to_id("</tool_call>")
    assert call_open is not None and call_close is not None
    call = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, '%llguidance {}\nstart: "f" </tool_call>\n', "tools"))
    end = tokenizer.token_to_id(END)
    text = tokenizer.encode("some words", add_special_tokens=False)
    rng = np.random.default_rng(1)
    for _ in range(5):
        c = WithSpans(call.new_constraint(call_open), spans.new_constraint(fmt.start_token_id, spans=True))
        for t in text:
            assert not c.active
            c.advance(t)
        c.advance(fmt.start_token_id)  # an image in free text: the span grammar holds it
        span = []
        while c.active:
            allowed = allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size)
            assert call_open not in allowed.tolist()
            t = int(rng.choice(allowed))
            c.advance(t)
            span.append(t)
        assert len(span) == fmt.span_tokens and span[-1] == end and not c.complete
        c.advance(call_open)  # then a call: the call grammar holds it, to the end of the request
        walked = []
        while not c.complete:
            assert c.active
            allowed = allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size)
            assert fmt.start_token_id not in allowed.tolist()
            t = int(rng.choice(allowed))
            c.advance(t)
            walked.append(t)
        assert walked[-1] == call_close and not c.violated
