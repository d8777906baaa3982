"""OutputKind: an output modality as data. Each omni/modalities/outputs/<kind>.py exports one
(IMAGE in image.py, AUDIO in audio.py), and omni/modalities/outputs/kinds.py lists them; the
layers above iterate over a model's kinds instead of naming one:

    build       the model-side object (a ModelOutput) for a served model, or None: it has no
                decoder for the kind (app start-up builds each kind this way)
    span format the ModelOutput's `format`, whose start_token_id opens a span (the choice
                constraints hold a span to its grammar from that token on); start_token
                spells it, for a model that has the token but no decoder
    ban rule    `allowed(modalities)`: a chat request may get the kind; else its opener is banned
                (`unasked`: whether it comes in a turn whose request gives no modalities)
    route       `route_type`, the SpanRoute one choice's spans go through (omni/modalities/outputs/router.py)
    piece type  what a span makes, carried on the Delta that completed it, in Delta.pieces
                under the kind's name (`add` and `pieces` read and write them typed)

OutputSpans is what a choice's token constraint holds of one kind: its span grammar and opener
(omni/serving/choice_constraints.py). How a chat turn gets each kind is its chat side
(omni/modalities/outputs/chat_output.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from omni.config import ModelConfig
from omni.engines.generation import Delta
from omni.engines.supervisor import SupervisedWorker
from omni.metrics import Metrics
from omni.shared.store.base import ArtifactStore
from omni.text.constrained.compiler import CompiledGrammar, GrammarCompiler
from omni.text.tokenizer import TextTokenizer


class Carrier(Protocol):
    """A Delta, or what collects a choice's Deltas (omni/http/sse.py Choice)."""

    pieces: dict[str, list[Any]]


class SpanFormat(Protocol):
    @property
    def start_token_id(self) -> int: ...


class ModelOutput(Protocol):
    """An output modality of a served model (ModelImages, ModelAudio): its workers (the image
    decoder's replicas, the vocoder), its span format, and its span grammar compiled once at
    start-up (prepare)."""

    @property
    def workers(self) -> tuple[SupervisedWorker, ...]: ...

    @property
    def format(self) -> SpanFormat: ...

    @property
    def grammar(self) -> CompiledGrammar | None: ...

    @property
    def ready(self) -> bool: ...

    async def prepare(self, compiler: GrammarCompiler) -> None: ...


@dataclass(frozen=True, slots=True)
class OutputSpans:
    """A span grammar (one output kind's spans) a choice's output is held to wherever the model
    opens such a span (from its opening token on), or, opened, from the first token: the
    prompt opened it."""

    grammar: CompiledGrammar
    start_token_id: int
    opened: bool = False
    # Tokens that open a span without its opening token (the reference dialect's bare audio
    # units, when its route speaks them): held back in the reasoning with the opener.
    bare_openers: frozenset[int] = frozenset()


M = TypeVar("M", bound=ModelOutput)
P = TypeVar("P")

# (the model's config, its tokenizer, the artifact store, the metrics) -> its ModelOutput, or None
Build = Callable[[ModelConfig, TextTokenizer, ArtifactStore, Metrics], Any]


@dataclass(frozen=True, eq=False)
class OutputKind(Generic[M, P]):
    name: str  # the modality's name: in a chat request's `modalities`, and the key in Delta.pieces
    output_type: type[M]  # the model-side object a served model that makes the kind holds
    piece_type: type[P]  # what a span makes
    route_type: type  # one choice's spans (a SpanRoute)
    build: Build  # -> M | None
    start_token: str  # the token that opens its spans (its span format's), as the vocabulary spells it
    # The kind comes when a chat request gives no modalities: an image the model draws is part
    # of its turn; audio comes only when modalities asks for it, as OpenAI's chat answers.
    unasked: bool = True

    def of(self, outputs: tuple[ModelOutput, ...]) -> M | None:
        """This kind's object among a model's outputs, None: the model does not make it."""
        return next((o for o in outputs if isinstance(o, self.output_type)), None)

    def opener(self, output: ModelOutput) -> int:
        """The token that opens one of its spans (its span format's)."""
        return output.format.start_token_id

    def allowed(self, modalities: Collection[str] | None) -> bool:
        """The ban rule: a chat request may get the kind when it names it, or, giving no
        modalities, when the kind comes unasked."""
        return self.unasked if modalities is None else self.name in modalities

    def add(self, delta: Delta, piece: P) -> None:
        delta.pieces.setdefault(self.name, []).append(piece)

    def pieces(self, carrier: Carrier) -> list[P]:
        """Its pieces on a Delta (or a collected choice), in order."""
        return list(carrier.pieces.get(self.name, ()))
