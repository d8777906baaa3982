"""A json_object answer is closed before max_tokens cuts it: the closing text completes any
prefix of a compact JSON object, and a walk over the grammar's tokens always ends parseable
within its budget."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omni.text.constrained.compiler import GrammarCompiler
from omni.text.constrained.constraint import allowed_tokens, fill_masks
from omni.text.constrained.json_close import JsonScanner
from omni.text.constrained.spec import GrammarKind, GrammarSpec
from omni.text.tokenizer import TextTokenizer

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=200, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=5), json_values, max_size=4), ascii_only=st.booleans())
def test_every_prefix_plus_its_closing_is_a_json_object(obj: dict, ascii_only: bool) -> None:
    data = json.dumps(obj, separators=(",", ":"), ensure_ascii=ascii_only).encode()
    scanner = JsonScanner()
    for cut in range(len(data) + 1):
        closed = data[:cut] + scanner.closing()
        assert isinstance(json.loads(closed.decode("utf-8")), dict), closed
        scanner.feed(data[cut : cut + 1])
    assert scanner.closing() == b""


@pytest.mark.parametrize("max_tokens", [2, 5, 12, 40, 120])  # 1 cannot hold "{}"
async def test_random_walks_end_as_json_within_the_budget(tokenizer: TextTokenizer, max_tokens: int) -> None:
    grammar = await GrammarCompiler(tokenizer).compile(GrammarSpec(GrammarKind.JSON_OBJECT))
    cut = 0
    for seed in range(25):
        rng = np.random.default_rng(seed)
        c = grammar.new_constraint(max_tokens=max_tokens)
        ids: list[int] = []
        while len(ids) < max_tokens and not c.complete:
            allowed = allowed_tokens(fill_masks([c])[0], tokenizer.vocab_size)
            token = int(rng.choice(allowed))
            if token in tokenizer.eos_token_ids:
                break
            c.advance(token)
            assert not c.violated  # every forced byte is one the grammar takes
            ids.append(token)
        text = tokenizer.decode(ids, skip_special_tokens=False)
        assert isinstance(json.loads(text), dict), text
        cut += c.cut_short
    if max_tokens <= 12:
        assert cut > 0  # small budgets are where the closer has to act
