"""What every endpoint's lifecycle shares: the Prepared value it returns, and the steps several
take (the serving gate, the request's compiled output constraint, a prompt whose answer is the
endpoint's output, the upload bound).

Each endpoint's lifecycle is its own module beside this one and reads top-down:

    model -> media -> prompt -> generate -> route output

chat.py, completions.py, images.py, image_edits.py, transcriptions.py, speech.py,
responses/create.py (the Responses API, answered by chat's), realtime/session.py (each
response a chat turn). Each takes what it uses (the served models, the parsed request, the
client's deadline) and returns the request made ready to run: every choice's routed output,
not yet run. The handler in omni/http/handlers read and parsed the body before, and writes the
response after, in its endpoint's format (JSON or SSE), inside the returned value's admitted():

    completion = await chat.chat(models, req, store=store, timeout=timeout)
    with completion.admitted():  # or a 429, before any response is written
        return await respond(request, req, completion)

Each step lives in the module that owns its noun: parsing in omni/serving/requests, media items
in omni/modalities/inputs, prompt building in omni/serving/prompt.py, one choice's tokens in
omni/engines/generation.py, output spans in omni/modalities/outputs/router.py. Nothing here
knows of HTTP.

Nothing runs on a worker until the response iterates the outputs: Generation submits its request
when its deltas are first asked for, so an error in an earlier step costs no engine work.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Any

from omni.engines.generation import Generation
from omni.errors import service_unavailable
from omni.modalities.outputs.chat_output import ChatOutput
from omni.modalities.outputs.router import OutputRouter
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.requests import ChatCompletionRequest, CompletionRequest
from omni.shared.media import MediaLimits
from omni.text.constrained.compiler import CompiledGrammar
from omni.text.reply_parser import OutputFormat


@dataclass(frozen=True, slots=True, kw_only=True)
class Prepared:
    """A request made ready to run: every choice's routed output, in choice index order, not
    yet run, and the client's deadline for them."""

    model: ServedModel
    outputs: list[OutputRouter]
    timeout: float | None  # seconds, the client's (X-Request-Timeout); the server's caps it

    @property
    def generations(self) -> list[Generation]:
        return [o.generation for o in self.outputs]

    def admitted(self) -> AbstractContextManager[object]:
        """The choices' place in the model's queue, all together, or Overloaded (a 429) now,
        before any response is written. Write the response inside it: each choice leaves the
        queue when it is submitted (its deltas first asked for), and leaving the block gives
        back the place of any never submitted (a stream the client left, say)."""
        return self.model.pool.admit([o.generation.request for o in self.outputs], self.timeout)


@dataclass(frozen=True, slots=True, kw_only=True)
class Completion(Prepared):
    """A chat or text completion, ready to run."""

    id: str
    output_format: OutputFormat = OutputFormat()  # chat: how each choice's text is read back
    kinds: tuple[ChatOutput, ...] = ()  # chat: the output kinds the choices may make (their body parts)
    # chat: the prompt tokens standing for media, by kind, before truncate_prompt_tokens cuts any
    num_media_tokens: Mapping[str, int] = field(default_factory=dict)


def check_serving(model: ServedModel) -> None:
    # A media request also needs the encoder: MediaPipeline.expand answers 503 for that.
    if not model.pool.serving:
        raise service_unavailable("The model is starting; retry shortly.", retry_after_s=5)


async def request_grammar(model: ServedModel, req: ChatCompletionRequest | CompletionRequest) -> CompiledGrammar | None:
    """The request's output constraint, compiled (off the event loop, once per spec); a spec
    that does not compile is a 400 before any work is queued."""
    return None if req.grammar is None else await model.grammars.compile(req.grammar)


def answer_template(model: ServedModel, messages: list[dict[str, Any]]) -> list[int]:
    """The prompt of a turn whose answer is the endpoint's output (a transcript, an edited
    image): templates that reason first are told not to."""
    return model.tokenizer.apply_chat_template(
        messages,
        add_generation_prompt=True,
        chat_template=model.chat_format.chat_template,
        enable_thinking=False,
        skip_reasoning=True,
    )


def max_upload_bytes(models: ModelRegistry) -> int:
    """The largest audio file any served model reads (--max-media-bytes): the bound on the
    upload while it is read, before the request names its model."""
    return max((m.media.limits.max_bytes for m in models if m.media is not None), default=MediaLimits().max_bytes)
