"""MediaPipeline (one per served omni model): a chat request's media parts -> expanded prompt
token ids and the MediaSpans the LLM worker injects.

    parts -> items (bytes + hash) -> chat template with one placeholder per item and
    representation -> slots -> per (item, component): store key -> cache lookup -> encode on a
    miss (batched across requests by EncoderEngine) -> expansion:

    continuous:  token_ids[pos] -> num_rows x the same placeholder, MediaSpan(offset, num_rows, key)
    discrete:    token_ids[pos] -> one code token per code (ordinary prompt tokens)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from omni.engines.encoder import EncoderEngine
from omni.engines.llm import EngineError
from omni.errors import bad_request, service_unavailable
from omni.metrics import Metrics
from omni.modalities.inputs import items
from omni.modalities.inputs.encoder_cache import Encoded, EncoderCache
from omni.modalities.inputs.items import MediaItem
from omni.modalities.inputs.placeholders import Placeholder, PlaceholderTokens
from omni.shared.media import MediaLimits
from omni.shared.store.base import ArtifactStore
from omni.shared.store.keys import content_hash, encoder_key_for
from omni.text.tokenizer import TextTokenizer
from scheduler.request import MediaSpan


@dataclass(frozen=True, slots=True)
class PromptInputs:
    token_ids: list[int]
    media: tuple[MediaSpan, ...]
    # prompt tokens standing for media, by kind (embedding rows and code tokens alike), as expanded
    num_media_tokens: Mapping[str, int] = field(default_factory=dict)


class MediaPipeline:
    def __init__(
        self,
        model_name: str,
        tokenizer: TextTokenizer,
        encoder: EncoderEngine,
        store: ArtifactStore,
        components: Mapping[str, str | Callable[[], str]],
        limits: MediaLimits,
        metrics: Metrics,
        *,
        max_cached_entries: int = 65_536,
    ) -> None:
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.store = store
        # component -> weights revision, for store keys: a str as given, or got by calling the
        # given function (ModelLayout.revisions: it reads files) in load_revisions()
        self._components = dict(components)
        self.revisions = {c: r for c, r in self._components.items() if isinstance(r, str)}
        self.limits = limits
        self.metrics = metrics
        self.placeholders = PlaceholderTokens(tokenizer)
        self.cache = EncoderCache(store, metrics, max_entries=max_cached_entries)

    @property
    def ready(self) -> bool:
        return self.encoder.ready and len(self.revisions) == len(self._components)

    async def load_revisions(self) -> None:
        """Read each component's revision off the loop, concurrently."""
        pending = {c: r for c, r in self._components.items() if c not in self.revisions and callable(r)}
        found = await asyncio.gather(*(asyncio.to_thread(read) for read in pending.values()))
        self.revisions.update(zip(pending, found))

    def check_vocabulary(self, num_codes: dict[str, int]) -> None:
        """Raise ValueError at start-up when a discrete component (component -> codebook
        size) has codes the LLM's vocabulary cannot write: a mis-converted checkpoint would
        otherwise fail on its first image."""
        for component, n in num_codes.items():
            missing = self.placeholders.missing_code_token(component, n)
            if missing is not None:
                raise ValueError(
                    f"{self.model_name}: the {component} has {n} codes but the LLM's "
                    f"vocabulary has no {missing} token"
                )

    async def expand(self, token_ids: list[int], loaded: list[MediaItem], *, priority: int = 0) -> PromptInputs:
        """token_ids as the template rendered them -> the prompt the LLM worker runs. priority:
        the request's; the encoder takes the most urgent items first."""
        slots = self.placeholders.slots(token_ids, loaded)
        if slots and not self.ready:  # starting, or restarting after a crash
            raise service_unavailable("The model's encoders are starting; retry shortly.", retry_after_s=5)
        missing = {s.placeholder.component for s in slots} - self.encoder.components
        if missing:
            item = next(s.item for s in slots if s.placeholder.component in missing)
            raise bad_request(
                f"This model cannot read {item.kind} input (no {', '.join(sorted(missing))}).",
                param=item.param,
                code="unsupported_content_type",
            )
        # Each distinct (item, component) is encoded once, concurrently with the rest.
        jobs: dict[tuple[int, str], asyncio.Future[tuple[str, Encoded]]] = {}
        for s in slots:
            job = (id(s.item), s.placeholder.component)
            if job not in jobs:
                jobs[job] = asyncio.ensure_future(self._encoded(s.item, s.placeholder, priority))
        # Every job's outcome is collected (none is left unretrieved); the first error wins.
        # If this request is cancelled, gather cancels the jobs; encodes already submitted
        # finish in the engine and are cached for the next asker.
        for outcome in await asyncio.gather(*jobs.values(), return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        out: list[int] = []
        spans: list[MediaSpan] = []
        counts: dict[str, int] = {}
        start = 0  # token_ids[start:pos] is copied as is; token_ids[pos] is replaced
        for s in slots:
            out.extend(token_ids[start : s.pos])
            start = s.pos + 1
            key, encoded = jobs[(id(s.item), s.placeholder.component)].result()
            at = len(out)
            if s.placeholder.discrete:
                assert encoded.codes is not None
                out.extend(self.placeholders.code_id(s.placeholder.component, c) for c in encoded.codes)
            else:
                spans.append(MediaSpan(len(out), encoded.num_rows, key))
                out.extend([token_ids[s.pos]] * encoded.num_rows)
            counts[s.item.kind] = counts.get(s.item.kind, 0) + len(out) - at
        out.extend(token_ids[start:])
        return PromptInputs(out, tuple(spans), counts)

    async def encode_ahead(self, item: MediaItem, *, priority: int = 0) -> None:
        """Encode item now with each of its kind's components, as a prompt holding it will be
        (a realtime image is shown before the turn that asks about it): that prompt then finds
        it in the cache, or joins the encode under way. An error is left to that prompt."""
        if not self.ready:
            return
        placeholders = [p for p in self.placeholders.of_kind(item.kind) if p.component in self.encoder.components]
        await asyncio.gather(*(self._encoded(item, p, priority) for p in placeholders), return_exceptions=True)

    def _key(self, item: MediaItem, component: str) -> str:
        digest = item.digest or content_hash(item.data, items.decode_params(item.kind, self.limits))
        return encoder_key_for(component, self.revisions[component], digest)

    async def _encoded(self, item: MediaItem, p: Placeholder, priority: int) -> tuple[str, Encoded]:
        """The item's output of p's component: from the cache, or encoded now and remembered."""
        key = self._key(item, p.component)
        hit = await self.cache.lookup(key, p.discrete)
        self.metrics.encoder_cache(self.model_name, p.component, hit=hit is not None)
        if hit is not None:
            return key, hit
        try:
            result = await self.encoder.encode(
                p.component, item.kind, key, item.data, item.fmt, item.param, priority=priority
            )
        except EngineError as e:
            raise service_unavailable(f"The {p.component} is unavailable: {e}", retry_after_s=5) from None
        if result.error is not None:
            raise bad_request(result.error, param=item.param)
        encoded = Encoded(result.num_rows, tuple(result.codes) if result.codes is not None else None)
        if result.store_error is not None:  # counted by the engine with the batch's timing
            if not p.discrete:  # the LLM worker reads embeddings from the store: nothing to read
                raise service_unavailable(
                    f"The artifact store could not take the {p.component} output: {result.store_error}",
                    retry_after_s=5,
                )
            return key, encoded  # codes travel in the prompt itself; just not cached
        self.cache.remember(key, encoded)
        return key, encoded
