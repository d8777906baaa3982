"""An audio span the model opens is always one the vocoder can speak: after
<|discrete_audio_start|> only unit tokens may follow, 3 to max_units of them, then the span's end."""

from __future__ import annotations

import dataclasses

import numpy as np

from omni.text.constrained.audio_span import END, AudioSpanFormat
from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer


def test_the_format_comes_from_the_vocabulary(tokenizer: TextTokenizer) -> None:
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None
    assert tokenizer.decode([fmt.first_unit_id], skip_special_tokens=False) == "<|audio0000|>"
    assert fmt.unit_of(fmt.first_unit_id + fmt.num_units - 1) == fmt.num_units - 1
    assert fmt.unit_of(fmt.first_unit_id + fmt.num_units) is None and fmt.unit_of(fmt.start_token_id) is None
    assert tokenizer.token_to_id(END) == fmt.end_token_id


async def test_walks_make_only_whole_spans_within_the_bounds(compiler: GrammarCompiler, tokenizer: TextTokenizer) -> None:
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None
    fmt = dataclasses.replace(fmt, max_units=12)  # small, so walks reach the upper bound
    grammar = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, fmt.grammar(), "audio"))
    units = set(range(fmt.first_unit_id, fmt.first_unit_id + fmt.num_units))
    text = tokenizer.encode("say it sadly:", add_special_tokens=False)
    rng = np.random.default_rng(0)
    lengths = []
    for _ in range(20):
        c = grammar.new_constraint(fmt.start_token_id, spans=True)
        for t in text:
            assert not c.active
            c.advance(t)
        c.advance(fmt.start_token_id)
        span: list[int] = []
        while c.active:
            allowed = set(allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size).tolist())
            n = len(span)
            if n < fmt.min_units:
                assert allowed == units  # no end before the third unit
            elif n < fmt.max_units:
                assert allowed == units | {fmt.end_token_id}
            else:
                assert allowed == {fmt.end_token_id}
            # end early about half the time once allowed, so lengths spread over the range
            t = fmt.end_token_id if fmt.end_token_id in allowed and rng.random() < 0.3 else int(rng.choice(sorted(allowed)))
            c.advance(t)
            span.append(t)
        assert span[-1] == fmt.end_token_id and not c.violated and not c.complete
        lengths.append(len(span) - 1)
    assert min(lengths) >= fmt.min_units and max(lengths) <= fmt.max_units and len(set(lengths)) > 3


async def test_the_reference_dialects_speech_is_bare_units_the_end_of_turn_ends(
    compiler: GrammarCompiler, tokenizer: TextTokenizer
) -> None:
    """After <audio_decoder_call>: units only, no marker, 3 of them before the turn may end (EOS),
    and nothing but EOS after the most."""
    fmt = AudioSpanFormat.from_tokenizer(tokenizer)
    assert fmt is not None and fmt.call_token_id == tokenizer.token_to_id("<audio_decoder_call>")
    fmt = dataclasses.replace(fmt, max_units=5)
    grammar = await compiler.compile(GrammarSpec(GrammarKind.GRAMMAR, fmt.bare_grammar(), "audio"))
    units = set(range(fmt.first_unit_id, fmt.first_unit_id + fmt.num_units))
    eos = set(tokenizer.eos_token_ids)
    c = grammar.new_constraint(None)
    for n in range(fmt.max_units + 1):
        allowed = set(allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size).tolist())
        if n < fmt.min_units:
            assert allowed == units
        elif n < fmt.max_units:
            assert allowed == units | eos
        else:
            assert allowed == eos
            break
        c.advance(fmt.first_unit_id + n)
    assert not c.violated
