"""The grammar of an image span, so a span the model opens is always one the decoder can draw.

The reference model writes an image as (REFERENCE_MODEL.md):

    <|discrete_image_start|> <|vision_ratio_W:H|> <|vision_token|>
        (<|visionNNNNN|> x cols, <|vision_eol|>) x rows  <|vision_eof|> <|discrete_image_end|>

with rows x cols = 27 x 27 codes in the reference. ImageSpanFormat reads the marker and code
tokens from the tokenizer and writes the Lark grammar of everything after the opening token;
a span-mode TokenConstraint (trigger: the opening token) holds each span to it and lets the
text between spans run free. The codes are one token-id range in the vocabulary (the
tokenizer adds them in order), so the grammar names the range, not 65,536 alternatives.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from omni.text.tokenizer import TextTokenizer

START = "<|discrete_image_start|>"
END = "<|discrete_image_end|>"
VISION_TOKEN = "<|vision_token|>"
EOL = "<|vision_eol|>"
EOF = "<|vision_eof|>"
_RATIO = re.compile(r"^<\|vision_ratio_(\d+):(\d+)\|>$")
_CODE = re.compile(r"^<\|vision(\d{5})\|>$")


@dataclass(frozen=True, slots=True)
class ImageSpanFormat:
    start_token_id: int
    ratio_tokens: tuple[str, ...]  # the aspect-ratio tokens the vocabulary has, "<|vision_ratio_W:H|>"
    first_code_id: int  # the token of code 0; code c is first_code_id + c
    num_codes: int
    rows: int
    cols: int

    @classmethod
    def from_tokenizer(cls, tokenizer: TextTokenizer, rows: int = 27, cols: int = 27) -> ImageSpanFormat | None:
        """None when the vocabulary lacks a marker, has no ratio token, or its code tokens are
        not one contiguous run of ids in code order."""
        marks = [tokenizer.token_to_id(t) for t in (START, END, VISION_TOKEN, EOL, EOF)]
        if any(m is None for m in marks):
            return None
        vocab = tokenizer.backend.get_vocab(with_added_tokens=True)
        ratios = sorted(t for t in vocab if _RATIO.match(t))
        codes = sorted((int(m.group(1)), i) for t, i in vocab.items() if (m := _CODE.match(t)))
        if not ratios or not codes:
            return None
        first = codes[0][1]
        if any(code != n or token_id != first + n for n, (code, token_id) in enumerate(codes)):
            return None
        assert marks[0] is not None
        return cls(marks[0], tuple(ratios), first, len(codes), rows, cols)

    @staticmethod
    def ratio(token: str) -> tuple[int, int] | None:
        """(W, H) of a ratio token."""
        m = _RATIO.match(token)
        return (int(m.group(1)), int(m.group(2))) if m else None

    def code_of(self, token_id: int) -> int | None:
        code = token_id - self.first_code_id
        return code if 0 <= code < self.num_codes else None

    @property
    def span_tokens(self) -> int:
        """Tokens after the opening one: ratio, vision token, the rows with their ends, eof, end."""
        return 2 + self.rows * (self.cols + 1) + 2

    def grammar(self) -> str:
        """llguidance Lark for a span after its opening token (the constraint's trigger)."""
        return "\n".join(["%llguidance {}", "start: image_body", *self.rules("image"), ""])

    def rules(self, name: str) -> list[str]:
        """Lark rules for embedding spans in another grammar: `name` is a whole span, opening
        token included (a tool call's argument, in the reference's t2i_model_generation
        dialect), `name_body` a span after its opening token."""
        last = self.first_code_id + self.num_codes - 1
        ratios = " | ".join(self.ratio_tokens)
        return [
            f"{name}: {START} {name}_body",
            f"{name}_body: ({ratios}) {VISION_TOKEN} {name}_row{{{self.rows}}} {EOF} {END}",
            f"{name}_row: {name}_code{{{self.cols}}} {EOL}",
            f"{name}_code: <[{self.first_code_id}-{last}]>",
        ]
