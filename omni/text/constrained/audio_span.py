"""The grammar of an audio span, so a span the model opens is always one the vocoder can speak.

The reference model answers aloud with text, then its audio as unit tokens (REFERENCE_MODEL.md):

    <|discrete_audio_start|> <|audioNNNN|> x (3 to 2,000) <|discrete_audio_end|>

(25 units a second: 0.12 s to 80 s of speech). The reference's own dialect writes the units
bare after its spoken call (docs/REFERENCE_DIALECT.md):

    <audio_decoder_call> <|audioNNNN|> x (3 to 2,000) <|im_end|>

so a spoken answer forced in that dialect opens with the call tag and is held to bare_grammar:
the units, then the end of the turn. The voice is the request's (`audio.voice`);
nothing of the span names it. AudioSpanFormat reads the markers and the unit tokens from the
tokenizer and writes the Lark grammar of everything after the opening token; a span-mode
constraint (trigger: the opening token) holds each span to it, as for images. The units are
one run of token ids in unit order, so the grammar names the range.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omni.text.tokenizer import TextTokenizer

START = "<|discrete_audio_start|>"
END = "<|discrete_audio_end|>"
CALL = "<audio_decoder_call>"  # the reference dialect's spoken call: bare units follow it
_UNIT = re.compile(r"^<\|audio(\d{4})\|>$")

MIN_UNITS = 3
MAX_UNITS = 2000


@dataclass(frozen=True, slots=True)
class AudioSpanFormat:
    start_token_id: int
    end_token_id: int
    first_unit_id: int  # the token of unit 0; unit u is first_unit_id + u
    num_units: int
    call_token_id: int | None = None  # CALL, when the vocabulary has it
    min_units: int = MIN_UNITS
    max_units: int = MAX_UNITS

    @classmethod
    def from_tokenizer(cls, tokenizer: TextTokenizer) -> AudioSpanFormat | None:
        """None when the vocabulary lacks a marker or its unit tokens are not one run of ids
        in unit order."""
        start, end = tokenizer.token_to_id(START), tokenizer.token_to_id(END)
        if start is None or end is None:
            return None
        vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
        units = sorted((int(m.group(1)), i) for t, i in vocab.items() if (m := _UNIT.match(t)))
        if not units:
            return None
        first = units[0][1]
        if any(unit != n or token_id != first + n for n, (unit, token_id) in enumerate(units)):
            return None
        return cls(start, end, first, len(units), tokenizer.token_to_id(CALL))

    def unit_of(self, token_id: int) -> int | None:
        unit = token_id - self.first_unit_id
        return unit if 0 <= unit < self.num_units else None

    def grammar(self) -> str:
        """llguidance Lark for a span after its opening token (the constraint's trigger)."""
        return "\n".join(["%llguidance {}", "start: audio_body", *self.rules("audio"), ""])

    def bare_grammar(self) -> str:
        """llguidance Lark for the reference dialect's spoken answer after its call tag: the
        units alone, no marker; the end of the turn (EOS, allowed once they are complete) ends it."""
        unit = self.rules("audio")[-1]
        return "\n".join(["%llguidance {}", f"start: audio_unit{{{self.min_units},{self.max_units}}}", unit, ""])

    def rules(self, name: str) -> list[str]:
        """`name`: a whole span, opening token included; `name_body`: after the opening token."""
        last = self.first_unit_id + self.num_units - 1
        return [
            f"{name}: {START} {name}_body",
            f"{name}_body: {name}_unit{{{self.min_units},{self.max_units}}} {END}",
            f"{name}_unit: <[{self.first_unit_id}-{last}]>",
        ]
