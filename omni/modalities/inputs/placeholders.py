"""The prompt grammar of media input: the placeholder tokens the chat template writes, the code
tokens a discrete component's output becomes, and which item each placeholder belongs to.

    <|IMAGE_PAD|>            image, vision_encoder   continuous: rows x IMAGE_PAD + a MediaSpan
    <|DISCRETE_IMAGE_PAD|>   image, image_tokenizer  discrete: the codes as <|visionNNNNN|>
    <|VIDEO_PAD|>            video, vision_encoder   continuous
    <|AUDIO_PAD|>            audio, audio_encoder    continuous
    <|DISCRETE_AUDIO_PAD|>   audio, audio_tokenizer  discrete: the units as <|audioNNNN|>

The k-th placeholder of a (component, kind) belongs to the k-th item of that kind in message
order; the template writes one placeholder per item and representation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omni.errors import APIError, bad_request
from omni.modalities.inputs.items import MediaItem
from omni.text.tokenizer import TextTokenizer


@dataclass(frozen=True, slots=True)
class Placeholder:
    kind: str  # the media kind it stands for
    component: str  # the encoder that fills it
    discrete: bool  # codes become vocabulary tokens; otherwise embeddings are injected


PLACEHOLDERS: dict[str, Placeholder] = {
    "<|IMAGE_PAD|>": Placeholder("image", "vision_encoder", False),
    "<|DISCRETE_IMAGE_PAD|>": Placeholder("image", "image_tokenizer", True),
    "<|VIDEO_PAD|>": Placeholder("video", "vision_encoder", False),
    "<|AUDIO_PAD|>": Placeholder("audio", "audio_encoder", False),
    "<|DISCRETE_AUDIO_PAD|>": Placeholder("audio", "audio_tokenizer", True),
}


def placeholder_ids(tokenizer: TextTokenizer) -> frozenset[int]:
    """The ids of the placeholder tokens the vocabulary has."""
    return tokenizer.special_ids(*PLACEHOLDERS)


def code_token(component: str, code: int) -> str:
    if component == "image_tokenizer":
        return f"<|vision{code:05d}|>"
    return f"<|audio{code:04d}|>"


@dataclass(frozen=True, slots=True)
class Slot:
    """One placeholder the template wrote: token_ids[pos] is filled by item's component output."""

    pos: int
    placeholder: Placeholder
    item: MediaItem


class PlaceholderTokens:
    """The grammar in one tokenizer's ids: placeholders by token id, and code -> token id."""

    def __init__(self, tokenizer: TextTokenizer) -> None:
        self.tokenizer = tokenizer
        self._placeholders: dict[int, Placeholder] = {}
        for token, placeholder in PLACEHOLDERS.items():
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:  # a vocabulary without it: that input is never rendered
                self._placeholders[token_id] = placeholder
        self._code_ids: dict[tuple[str, int], int] = {}

    def of_kind(self, kind: str) -> list[Placeholder]:
        """The placeholders of a media kind that this vocabulary has (one per representation)."""
        return [p for p in self._placeholders.values() if p.kind == kind]

    def slots(self, token_ids: Sequence[int], items: Sequence[MediaItem]) -> list[Slot]:
        """Every placeholder in token_ids with its item; a 400 when placeholders and items
        do not pair up (a placeholder typed in the text, or a template that drops a kind)."""
        by_kind: dict[str, list[MediaItem]] = {}
        for item in items:
            by_kind.setdefault(item.kind, []).append(item)
        slots: list[Slot] = []
        seen: dict[tuple[str, str], int] = {}  # (component, kind) -> placeholders so far
        for pos, token_id in enumerate(token_ids):
            placeholder = self._placeholders.get(token_id)
            if placeholder is None:
                continue
            k = seen.get((placeholder.component, placeholder.kind), 0)
            seen[(placeholder.component, placeholder.kind)] = k + 1
            kind_items = by_kind.get(placeholder.kind, [])
            if k >= len(kind_items):
                raise bad_request(
                    f"The prompt holds more {placeholder.kind} placeholders than {placeholder.kind} "
                    "inputs (a placeholder token typed in the text?).",
                    param="messages",
                )
            slots.append(Slot(pos, placeholder, kind_items[k]))
        for kind, kind_items in by_kind.items():
            if not any(slot.item is kind_items[-1] for slot in slots):
                raise bad_request(
                    f"This model's chat template does not render {kind} input.",
                    param=kind_items[-1].param,
                    code="unsupported_content_type",
                )
        return slots

    def code_id(self, component: str, code: int) -> int:
        token_id = self._code_ids.get((component, code))
        if token_id is None:
            found = self.tokenizer.token_to_id(code_token(component, code))
            if found is None:  # check_vocabulary() at start-up makes this unreachable
                raise APIError(500, f"The model's vocabulary has no token for {component} code {code}.")
            token_id = self._code_ids[(component, code)] = found
        return token_id

    def missing_code_token(self, component: str, num_codes: int) -> str | None:
        """The first or last code token of a codebook the vocabulary lacks, if any."""
        for code in (0, num_codes - 1):
            if self.tokenizer.token_to_id(code_token(component, code)) is None:
                return code_token(component, code)
        return None
