"""The reference model's spoken-answer markup, read out of a reply's content.

An audio answer of the reference model (HyperCLOVAX-SEED-Omni) is written as

    <user_transcript>what the user said</user_transcript>
    <assistant_transcript>the answer</assistant_transcript>
    <audio_decoder_call><speaker_info>{"gender": "f", "age": "20-30"}</speaker_info><|audio0123|>...

(older outputs give the speaker info as "\\n\\n{json}\\n\\n" right before the units, and some wrap
the units in <discrete_audio>...</discrete_audio></audio_decoder_call>). The units are the audio
route's (omni/modalities/outputs/audio.py: they never reach the text, and the route reads the
speaker info itself to pick the voice); what is left here is text, of which the client sees only
the answer: the assistant transcript without its tags. The user transcript, the speaker info and
the call markup are dropped, with the whitespace before them, and so is the whitespace at either
end of the content, as the reference's own chainer strips it.

An image the model draws comes as the reference's t2i_model_generation tool call. When no tool
parser reads it (the client declared no such tool), the image still comes out (the image route
takes its span) and the call's leftover markup is dropped here too.

parse() and push()/finish() agree for any chunking of the same text.
"""

from __future__ import annotations

import re
from typing import ClassVar

# A block dropped with everything in it: opening tag -> closing tag.
_BLOCKS = {
    "<user_transcript>": "</user_transcript>",
    "<speaker_info>": "</speaker_info>",
}
# Tags dropped on their own (their content, if any, stays).
_TAGS = (
    "<assistant_transcript>",
    "</assistant_transcript>",
    "<audio_decoder_call>",
    "</audio_decoder_call>",
    "<discrete_audio>",
    "</discrete_audio>",
)
_T2I_OPEN = "<tool_call>"
_T2I_CLOSE = "</tool_call>"
_T2I_NAME = "t2i_model_generation"
_MARKERS = (*_BLOCKS, *_TAGS, _T2I_OPEN)
# The legacy speaker info: a flat JSON object after a blank line, at the very end of the text.
_LEGACY_SPEAKER = re.compile(r"\n\n\{[^{}]+\}(?:\n\n)?")
_LEGACY_PREFIX = re.compile(r"\n(?:\n(?:\{[^{}]*(?:\}\n{0,2})?)?)?")


class SpokenMarkupParser:
    markup_tokens: ClassVar[tuple[str, ...]] = (
        *_BLOCKS, *_BLOCKS.values(), *_TAGS, _T2I_OPEN, _T2I_CLOSE,
        "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
    )  # fmt: skip

    def __init__(self) -> None:
        self._rest = ""  # text not yet decided
        self._started = False  # some content went out: its whitespace is no longer leading

    def parse(self, text: str, *, spoke: bool = False) -> str:
        """The whole content -> what the client sees. spoke: audio came out of the reply (the
        legacy speaker info is recognized only then)."""
        return SpokenMarkupParser()._take(text, final=True, spoke=spoke)

    def push(self, text: str) -> str:
        return self._take(text, final=False, spoke=False)

    def finish(self, *, spoke: bool = False) -> str:
        return self._take("", final=True, spoke=spoke)

    def _take(self, text: str, *, final: bool, spoke: bool) -> str:
        rest = self._rest + text
        out: list[str] = []
        while rest:
            at = rest.find("<")
            legacy = rest.find("\n\n{")
            if 0 <= legacy and (at < 0 or legacy < at):
                at = legacy
            head = rest if at < 0 else rest[:at]
            if head.strip():  # text: out, but whitespace at its end waits for what follows
                body = head.rstrip()
                out.append(body if self._started else body.lstrip())
                self._started = True
                rest = rest[len(body) :]
                continue
            # rest = whitespace, then a possible marker at `at` (or the end)
            if at < 0:
                break  # only whitespace: held (kept if text follows, dropped at the end)
            taken = self._marker(rest, at, final=final, spoke=spoke)
            if taken is None:  # undecided until more text comes
                break
            if taken == 0:  # no marker after all: the whitespace and one character are text
                piece = rest[: at + 1]
                out.append(piece if self._started else piece.lstrip())
                self._started = True
                rest = rest[at + 1 :]
                continue
            rest = rest[at + taken :]  # markup, with the whitespace before it
        if final:
            rest = ""  # whitespace at the very end, or markup the end cut short
        self._rest = rest
        return "".join(out)

    def _marker(self, rest: str, at: int, *, final: bool, spoke: bool) -> int | None:
        """How much of rest[at:] is markup to drop: > 0 that many characters, 0 none (it is
        text), None not known before more text comes."""
        tail = rest[at:]
        if tail.startswith("\n\n{"):
            match = _LEGACY_SPEAKER.match(tail)
            if match is not None and match.end() == len(tail):
                return len(tail) if final and spoke else (0 if final else None)
            if not final and _LEGACY_PREFIX.fullmatch(tail):
                return None
            return 0
        for opening, closing in _BLOCKS.items():
            if tail.startswith(opening):
                end = tail.find(closing)
                if end >= 0:
                    return end + len(closing)
                return len(tail) if final else None  # cut short inside it: dropped
        for tag in _TAGS:
            if tail.startswith(tag):
                return len(tag)
        if tail.startswith(_T2I_OPEN):
            inner = tail[len(_T2I_OPEN) :].lstrip()
            if inner.startswith(_T2I_NAME):
                end = tail.find(_T2I_CLOSE)
                if end >= 0:
                    return end + len(_T2I_CLOSE)
                return len(tail) if final else None
            if not final and _T2I_NAME.startswith(inner):
                return None
            return 0
        if not final and any(m.startswith(tail) for m in _MARKERS):
            return None  # the beginning of a marker
        return 0
