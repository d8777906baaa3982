"""The models this server answers for, by the name clients put in the request body."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from omni.engines.pool import ModelPool
from omni.engines.supervisor import SupervisedWorker
from omni.errors import bad_request, model_not_found
from omni.modalities.inputs.pipeline import MediaPipeline
from omni.modalities.outputs.kind import ModelOutput, OutputKind
from omni.modalities.outputs.kinds import OUTPUT_KINDS
from omni.text.chat_format import ChatFormat
from omni.text.constrained.compiler import GrammarCompiler
from omni.text.tokenizer import TextTokenizer

M = TypeVar("M", bound=ModelOutput)


@dataclass(slots=True)
class ServedModel:
    name: str
    tokenizer: TextTokenizer
    pool: ModelPool
    created: int
    media: MediaPipeline | None = None  # None: a text-only model, media parts are refused
    outputs: tuple[ModelOutput, ...] = ()  # what it makes besides text (one per output kind), each with its worker
    # The chat template and the tool-call and reasoning parsers (omni/text/chat_format.py).
    chat_format: ChatFormat = field(default_factory=ChatFormat)
    # Output constraints for this model's tokenizer, compiled once per spec.
    grammars: GrammarCompiler = field(init=False)

    def __post_init__(self) -> None:
        self.grammars = GrammarCompiler(self.tokenizer)

    def output(self, kind: OutputKind[M, Any]) -> M | None:
        """What the model makes of an output kind; None: it has no decoder for it."""
        return kind.of(self.outputs)

    @property
    def kinds(self) -> list[tuple[OutputKind, ModelOutput]]:  # type: ignore[type-arg]
        """The output kinds the model makes, each with its object, in OUTPUT_KINDS' order."""
        return [(k, o) for k in OUTPUT_KINDS if (o := k.of(self.outputs)) is not None]

    @property
    def ready(self) -> bool:
        return (
            self.pool.ready
            and (self.media is None or self.media.ready)
            and all(o.ready for o in self.outputs)
        )

    def workers(self) -> tuple[SupervisedWorker, ...]:
        """Every worker the model owns, in the order they start: the encoders, the output
        decoders, then the LLM workers (which size their KV cache from the GPU memory the others
        leave free)."""
        encoders = () if self.media is None else (self.media.encoder,)
        return (*encoders, *(w for o in self.outputs for w in o.workers), *self.pool.engines)


class ModelRegistry:
    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}
        self._aliases: dict[str, ServedModel] = {}  # more names of a model (--served-model-name a b)

    def add(self, model: ServedModel, aliases: tuple[str, ...] = ()) -> None:
        for name in (model.name, *aliases):
            if name in self._models or name in self._aliases:
                raise ValueError(f"two models are named {name!r}")
        self._models[model.name] = model
        self._aliases.update(dict.fromkeys(aliases, model))

    def get(self, name: str) -> ServedModel:
        model = self._models.get(name) or self._aliases.get(name)
        if model is None:
            raise model_not_found(name)
        return model

    def names(self, model: ServedModel) -> list[str]:
        """The names clients may send for model: its own, then its aliases."""
        return [model.name, *(alias for alias, m in self._aliases.items() if m is model)]

    def capable(self, name: str | None, able: Callable[[ServedModel], bool], *, lacks: str, does: tuple[str, str]) -> ServedModel:
        """The named model, which must be able (else a 400: it `lacks`), or the only served model
        that is; does: what able models do, said of one and of several ("draws images", "draw images")."""
        if name is not None:
            model = self.get(name)
            if not able(model):
                raise bad_request(f"The model '{name}' {lacks}.", param="model")
            return model
        found = [m for m in self._models.values() if able(m)]
        if len(found) != 1:
            what = f"No served model {does[0]}" if not found else f"Several served models {does[1]}; name one"
            raise bad_request(f"{what}.", param="model")
        return found[0]

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(self._models.values())

    def __len__(self) -> int:
        return len(self._models)

    @property
    def all_ready(self) -> bool:
        return bool(self._models) and all(m.ready for m in self._models.values())
