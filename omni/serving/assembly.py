"""The composition root: each served model built from its ModelConfig into the registry, and
every worker started and stopped. The app (omni/http/app.py) holds models() in its cleanup
context and nothing more; nothing here knows of HTTP.

    ModelConfig -> tokenizer, ModelPool (the llm workers), MediaPipeline (the encoders, for an
    omni checkpoint), each output kind its checkpoint has, the chat format -> ServedModel

Workers start in a background task, so /health can answer 503 while they load.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from omni.config import ModelConfig
from omni.engines.encoder import EncoderEngine
from omni.engines.pool import ModelPool
from omni.engines.start_order import start_in_order
from omni.engines.worker_specs import encoder_device, encoder_worker_spec
from omni.metrics import Metrics
from omni.modalities.inputs.pipeline import MediaPipeline
from omni.modalities.outputs.kinds import OUTPUT_KINDS
from omni.model_layout import ModelLayout
from omni.serving.model import ModelRegistry, ServedModel
from omni.shared.store.base import ArtifactStore
from omni.text.chat_format import ChatFormat
from omni.text.tokenizer import TextTokenizer


@asynccontextmanager
async def models(
    configs: Sequence[ModelConfig], registry: ModelRegistry, store: ArtifactStore, metrics: Metrics
) -> AsyncIterator[asyncio.Task[None]]:
    """Each configured model built and added to the registry (under its aliases too), then a task
    starting every worker, yielded: it finishes when every engine has a ready worker and raises
    if one could not start. Leaving cancels it and stops every worker."""
    for config in configs:
        registry.add(await served_model(config, store, metrics), config.aliases)
    workers = [w for m in registry for w in m.workers()]

    async def start_all() -> None:
        # Encoders and decoders first, then the LLM workers one GPU-sharer at a time
        # (start_order.py). Hashing the encoders' weights for their store keys overlaps their start.
        await start_in_order(workers, *(m.media.load_revisions() for m in registry if m.media is not None))

    startup = asyncio.create_task(start_all(), name="start-engines")
    try:
        yield startup
    finally:
        startup.cancel()
        await asyncio.gather(*(w.stop() for w in workers), return_exceptions=True)


async def served_model(config: ModelConfig, store: ArtifactStore, metrics: Metrics) -> ServedModel:
    """One model as it is served, its workers not yet started; its output kinds' grammars are
    compiled here, before any request."""
    tokenizer = await asyncio.get_running_loop().run_in_executor(None, TextTokenizer.from_dir, config.model_dir)
    pool = ModelPool(config, metrics)
    media = None
    if config.encoder_dir is not None:
        media = await _media_pipeline(config, tokenizer, store, metrics)
    built = (kind.build(config, tokenizer, store, metrics) for kind in OUTPUT_KINDS)
    chat = config.chat_format
    chat_format = ChatFormat.resolve(
        tokenizer,
        tool_parser=chat.tool_call_parser,
        reasoning_parser=chat.reasoning_parser,
        auto_tool_choice=chat.enable_auto_tool_choice,
        chat_template=chat.chat_template,
        trust_request_chat_template=chat.trust_request_chat_template,
    )
    served = ServedModel(
        config.name,
        tokenizer,
        pool,
        created=int(time.time()),
        media=media,
        outputs=tuple(o for o in built if o is not None),
        chat_format=chat_format,
    )
    for output in served.outputs:
        await output.prepare(served.grammars)
    return served


async def _media_pipeline(
    config: ModelConfig, tokenizer: TextTokenizer, store: ArtifactStore, metrics: Metrics
) -> MediaPipeline:
    assert config.encoder_dir is not None
    layout = ModelLayout.from_dir(config.encoder_dir)
    encoder = EncoderEngine(
        encoder_worker_spec(config, encoder_device(config)),
        metrics,
        config.name,
        config.encoder,
        start_timeout=config.worker.worker_start_timeout,
    )
    pipeline = MediaPipeline(config.name, tokenizer, encoder, store, layout.revisions(), config.media_limits, metrics)
    pipeline.check_vocabulary(layout.codebook_sizes())
    return pipeline
