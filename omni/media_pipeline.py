"""The orchestrator's media steps for one served model: from chat parts to prompt token ids
with every media placeholder expanded, and the embedding spans the LLM worker injects.

    parts -> bytes (data: URL, or a checked remote fetch) -> chat template with one
    placeholder per item and representation -> per (item, component): store key -> cache
    lookup -> encode on a miss (batched across requests by EncoderEngine) -> expansion:

    <|IMAGE_PAD|>            -> rows x IMAGE_PAD, a MediaSpan keyed by the artifact's key
    <|DISCRETE_IMAGE_PAD|>   -> the image's codes as <|visionNNNNN|> tokens
    <|VIDEO_PAD|>            -> rows x VIDEO_PAD, a MediaSpan
    <|AUDIO_PAD|>            -> rows x AUDIO_PAD, a MediaSpan
    <|DISCRETE_AUDIO_PAD|>   -> the clip's units as <|audioNNNN|> tokens

The k-th placeholder of a kind belongs to the k-th item of that kind in message order.
Decoding happens in the encoder worker, so a corrupt file costs this server nothing but a
round trip; the worker's error names the part and becomes a 400.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omni.api.errors import APIError, bad_request, service_unavailable
from omni.api.schemas import ChatMessage, InputAudioPart, TextPart, VideoURLPart
from omni.encoder_engine import EncoderEngine
from omni.engine import EngineError
from omni.media import MediaLimits, decode_base64, is_video, load_media_bytes
from omni.metrics import Metrics
from omni.model_layout import component_revision
from omni.store.base import ArtifactStore, KeyNotFound, StoreError
from omni.store.codec import EMBEDDINGS, artifact_rows, decode_codes, header_size
from omni.store.keys import content_hash, encoder_key_for
from omni.tokenizer import TextTokenizer
from scheduler.request import MediaSpan

log = logging.getLogger("omni.media")

_HASH_IN_THREAD_BYTES = 1 << 20
_HEAD_BYTES = 4096  # an encoder artifact's safetensors header is a few hundred bytes


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


def code_token(component: str, code: int) -> str:
    if component == "image_tokenizer":
        return f"<|vision{code:05d}|>"
    return f"<|audio{code:04d}|>"


@dataclass(frozen=True, slots=True)
class MediaItem:
    kind: str  # image | video | audio
    param: str  # e.g. messages[0].content[1]
    data: bytes
    fmt: str | None = None
    digest: str = ""  # content_hash of data and the decode params: the key's last segment


@dataclass(frozen=True, slots=True)
class Encoded:
    num_rows: int
    codes: tuple[int, ...] | None  # discrete components only


@dataclass(frozen=True, slots=True)
class PromptInputs:
    token_ids: list[int]
    media: tuple[MediaSpan, ...]


class MediaPipeline:
    def __init__(
        self,
        model_name: str,
        tokenizer: TextTokenizer,
        encoder: EncoderEngine,
        store: ArtifactStore,
        components: Mapping[str, Path | str],
        limits: MediaLimits,
        metrics: Metrics,
        *,
        max_cached_entries: int = 65_536,
    ) -> None:
        self.model_name = model_name
        self.tokenizer = tokenizer
        self.encoder = encoder
        self.store = store
        # component -> weights revision, for store keys: a str as given, or hashed from the
        # component's directory by load_revisions()
        self._components = dict(components)
        self.revisions = {c: r for c, r in self._components.items() if isinstance(r, str)}
        self.limits = limits
        self.metrics = metrics
        self._pad_ids: dict[int, Placeholder] = {}
        for token, placeholder in PLACEHOLDERS.items():
            token_id = tokenizer.token_to_id(token)
            if token_id is not None:
                self._pad_ids[token_id] = placeholder
        # What an artifact holds (num_rows, codes) by key: a hit needs no store read at all.
        self._known: OrderedDict[str, Encoded] = OrderedDict()
        self._max_cached_entries = max_cached_entries
        self._code_ids: dict[tuple[str, int], int] = {}

    @property
    def ready(self) -> bool:
        return self.encoder.ready and len(self.revisions) == len(self._components)

    async def load_revisions(self) -> None:
        """Hash each component directory's files (a few seconds for real weights), concurrently."""
        dirs = {c: Path(d) for c, d in self._components.items() if c not in self.revisions}
        hashed = await asyncio.gather(*(asyncio.to_thread(component_revision, d) for d in dirs.values()))
        self.revisions.update(zip(dirs, hashed))

    def check_vocabulary(self, num_codes: dict[str, int]) -> None:
        """Raise ValueError at start-up when a discrete component (component -> codebook
        size) has codes the LLM's vocabulary cannot write: a mis-converted checkpoint would
        otherwise fail on its first image."""
        for component, n in num_codes.items():
            for code in (0, n - 1):
                if self.tokenizer.token_to_id(code_token(component, code)) is None:
                    raise ValueError(
                        f"{self.model_name}: the {component} has {n} codes but the LLM's "
                        f"vocabulary has no {code_token(component, code)} token"
                    )

    # ---- 1. parts -> bytes ---------------------------------------------------------------
    async def load_items(self, messages: Sequence[ChatMessage]) -> list[MediaItem]:
        parts = [
            (f"messages[{i}].content[{j}]", part)
            for i, m in enumerate(messages)
            if isinstance(m.content, tuple)
            for j, part in enumerate(m.content)
            if not isinstance(part, TextPart)
        ]
        self.limits.check_num_items(len(parts), "messages")

        async def load(param: str, part: Any) -> MediaItem:
            fmt = None
            if isinstance(part, InputAudioPart):
                kind, data, fmt = "audio", decode_base64(part.data, self.limits, param), part.format
            else:
                data = await load_media_bytes(part.url, self.limits, param)
                kind = "video" if isinstance(part, VideoURLPart) or is_video(data) else "image"
            params = self._decode_params(kind)
            if len(data) > _HASH_IN_THREAD_BYTES:  # keep the event loop free of long hashes
                digest = await asyncio.to_thread(content_hash, data, params)
            else:
                digest = content_hash(data, params)
            return MediaItem(kind, param, data, fmt, digest)

        return list(await asyncio.gather(*(load(p, part) for p, part in parts)))

    def _decode_params(self, kind: str) -> dict[str, object]:
        """What besides the bytes decides an encoder's output (the rest is in the revision)."""
        params: dict[str, object] = {"kind": kind}
        if kind == "video":  # the worker samples frames by these
            params |= {"fps": self.limits.video_fps, "max_frames": self.limits.max_video_frames}
        return params

    @staticmethod
    def template_messages(messages: Sequence[ChatMessage], items: list[MediaItem]) -> list[dict[str, Any]]:
        """Messages for the chat template: each media part becomes {"type": kind, "id": ...}
        (transformers' multimodal template convention); the template renders placeholders."""
        by_param = {item.param: item for item in items}
        counts: dict[str, int] = {}
        out = []
        for i, message in enumerate(messages):
            d = message.to_template_dict()
            if isinstance(message.content, tuple):
                content = []
                for j, part in enumerate(message.content):
                    if isinstance(part, TextPart):
                        content.append({"type": "text", "text": part.text})
                        continue
                    item = by_param[f"messages[{i}].content[{j}]"]
                    n = counts[item.kind] = counts.get(item.kind, 0) + 1
                    content.append({"type": item.kind, "id": f"{item.kind}_{n - 1}"})
                d["content"] = content
            out.append(d)
        return out

    # ---- 2. placeholders -> encoder outputs -> expanded prompt ---------------------------
    async def expand(self, token_ids: list[int], items: list[MediaItem]) -> PromptInputs:
        by_kind: dict[str, list[MediaItem]] = {}
        for item in items:
            by_kind.setdefault(item.kind, []).append(item)
        # (position in token_ids, placeholder, item) for every placeholder the template wrote
        slots: list[tuple[int, Placeholder, MediaItem]] = []
        seen: dict[str, int] = {}
        for pos, token_id in enumerate(token_ids):
            placeholder = self._pad_ids.get(token_id)
            if placeholder is None:
                continue
            k = seen.get(placeholder.component + placeholder.kind, 0)
            seen[placeholder.component + placeholder.kind] = k + 1
            kind_items = by_kind.get(placeholder.kind, [])
            if k >= len(kind_items):
                raise bad_request(
                    f"The prompt holds more {placeholder.kind} placeholders than {placeholder.kind} "
                    "inputs (a placeholder token typed in the text?).",
                    param="messages",
                )
            slots.append((pos, placeholder, kind_items[k]))
        for kind, kind_items in by_kind.items():
            if not any(item is kind_items[-1] for _, _, item in slots):
                raise bad_request(
                    f"This model's chat template does not render {kind} input.",
                    param=kind_items[-1].param,
                    code="unsupported_content_type",
                )
        if slots and not self.ready:  # starting, or restarting after a crash
            raise service_unavailable("The model's encoders are starting; retry shortly.", retry_after_s=5)
        missing = {p.component for _, p, _ in slots} - self.encoder.components
        if missing:
            item = next(it for _, p, it in slots if p.component in missing)
            raise bad_request(
                f"This model cannot read {item.kind} input (no {', '.join(sorted(missing))}).",
                param=item.param,
                code="unsupported_content_type",
            )
        # Each distinct (item, component) is encoded once, concurrently with the rest.
        jobs: dict[tuple[int, str], asyncio.Future[tuple[str, Encoded]]] = {}
        for _, p, item in slots:
            job = (id(item), p.component)
            if job not in jobs:
                jobs[job] = asyncio.ensure_future(self._encoded(item, p))
        # Every job's outcome is collected (none is left unretrieved); the first error wins.
        # If this request is cancelled, gather cancels the jobs; encodes already submitted
        # finish in the engine and are cached for the next asker.
        for outcome in await asyncio.gather(*jobs.values(), return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome
        out: list[int] = []
        spans: list[MediaSpan] = []
        start = 0
        for pos, p, item in slots:
            out.extend(token_ids[start:pos])
            start = pos + 1
            key, encoded = jobs[(id(item), p.component)].result()
            if p.discrete:
                assert encoded.codes is not None
                out.extend(self._code_id(p.component, c) for c in encoded.codes)
            else:
                spans.append(MediaSpan(len(out), encoded.num_rows, key))
                out.extend([token_ids[pos]] * encoded.num_rows)
        out.extend(token_ids[start:])
        return PromptInputs(out, tuple(spans))

    def _code_id(self, component: str, code: int) -> int:
        token_id = self._code_ids.get((component, code))
        if token_id is None:
            found = self.tokenizer.token_to_id(code_token(component, code))
            if found is None:
                raise APIError(500, f"The model's vocabulary has no token for {component} code {code}.")
            token_id = self._code_ids[(component, code)] = found
        return token_id

    # ---- the artifact store as a cache ---------------------------------------------------
    def _key(self, item: MediaItem, component: str) -> str:
        digest = item.digest or content_hash(item.data, self._decode_params(item.kind))
        return encoder_key_for(component, self.revisions[component], digest)

    async def _encoded(self, item: MediaItem, p: Placeholder) -> tuple[str, Encoded]:
        key = self._key(item, p.component)
        hit = await self._lookup(key, p.discrete)
        self.metrics.encoder_cache(self.model_name, p.component, hit=hit is not None)
        if hit is not None:
            return key, hit
        try:
            result = await self.encoder.encode(p.component, item.kind, key, item.data, item.fmt, item.param)
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
        self._remember(key, encoded)
        return key, encoded

    def _remember(self, key: str, encoded: Encoded) -> None:
        self._known[key] = encoded
        self._known.move_to_end(key)
        while len(self._known) > self._max_cached_entries:
            self._known.popitem(last=False)

    async def _lookup(self, key: str, discrete: bool) -> Encoded | None:
        """What the store holds under key, or None (absent, unreadable: encode again)."""
        known = self._known.get(key)
        if known is not None:
            self._known.move_to_end(key)
            # Codes live in this process; embeddings must still be in the store for the
            # LLM worker to read (the store may have been swept since).
            if discrete or await self._store_op("exists", self.store.exists(key)):
                return known
            del self._known[key]
            return None
        try:
            if discrete:  # codes are small and needed here: read them whole
                data = await self._store_op("get", self.store.get(key))
                if data is None:
                    return None
                _tensor, num_rows = artifact_rows(data)
                codes = tuple(decode_codes(data))
            else:  # embeddings stay in the store: the header's shape is all this needs
                found = await self._store_op("read_head", self.store.read_head(key, _HEAD_BYTES))
                if found is None:
                    return None
                head, size = found
                if header_size(head) > len(head):  # an unusually long header: read it all
                    found = await self._store_op("read_head", self.store.read_head(key, header_size(head)))
                    if found is None:
                        return None
                    head, size = found
                tensor, num_rows = artifact_rows(head, size)
                if tensor != EMBEDDINGS:
                    return None
                codes = None
        except Exception as e:  # ValueError, or safetensors' own error on a corrupt body
            log.warning("artifact %s is unreadable (%s); encoding again", key, e)
            return None
        encoded = Encoded(num_rows, codes)
        self._remember(key, encoded)
        return encoded

    async def _store_op(self, operation: str, call: Any) -> Any:
        """Await a store call; a missing key or a failing store reads as None (a miss)."""
        started = time.perf_counter()
        try:
            result = await call
        except KeyNotFound:
            self.metrics.observe_store(operation, time.perf_counter() - started)
            return None
        except StoreError as e:
            self.metrics.observe_store(operation, time.perf_counter() - started, failed=True)
            log.warning("artifact store %s failed (%s); encoding instead", operation, e)
            return None
        self.metrics.observe_store(operation, time.perf_counter() - started)
        return result
