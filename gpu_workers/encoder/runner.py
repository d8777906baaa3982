"""EncoderRunner: the media encoders of one model in one worker process.

A batch (protocol.EncodeBatch) holds items from many requests. The runner decodes each item's
bytes once (omni/shared/media: Pillow, PyAV), preprocesses it per component, then runs ONE forward
per component over all of that component's items: the vision tower packs every image and
video of the batch into one variable-length sequence, the audio encoder stacks every 30 s
window (cut into several forwards where the items' patches or samples exceed the component's
max_forward_cost, which bounds a forward's memory). Outputs go to the artifact store under the keys the server chose (write, then
publish); only row counts and discrete codes travel back over the pipe.

Components (gpu_workers/encoder/components.py) each have a directory under the model root, or
a key prefix in the published checkpoint; a missing one is simply not served.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from pathlib import Path
from typing import Any

import torch

from gpu_workers.artifacts import embeddings_to_bytes
from gpu_workers.distributed import GroupMember
from gpu_workers.encoder.component_files import ComponentFiles
from gpu_workers.encoder.components import COMPONENTS, Component, forward_groups
from gpu_workers.runner import Runner, register_runner
from gpu_workers.store_client import StoreClient
from omni.shared import protocol
from omni.shared.media import MediaError, MediaLimits, decode_audio, decode_image, decode_video
from omni.shared.safetensors_index import PUBLISHED_PREFIXES, SafetensorsIndex, is_published
from omni.shared.store.codec import encode_codes

log = logging.getLogger("omni.encoder")


@register_runner
class EncoderRunner(Runner):
    SPEC = protocol.EncoderWorkerSpec
    JOB = protocol.EncodeBatch

    def __init__(
        self,
        model_dir: Path | str,
        *,
        store: StoreClient,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        limits: MediaLimits | None = None,
        max_decode_threads: int = 4,
    ) -> None:
        root = Path(model_dir)
        self.device = torch.device(device)
        self.store = store
        self.limits = limits or MediaLimits()
        published = is_published(root)
        index = SafetensorsIndex.read(root) if published else None
        self.components: dict[str, Component] = {
            name: Component.create(name, ComponentFiles.open(root, name, published=published), self.device, dtype)
            for name in COMPONENTS
            if (index.has_prefix(PUBLISHED_PREFIXES[name][0]) if index else (root / name / "config.json").is_file())
        }
        if not self.components:
            raise ValueError(f"{root}: no encoder component ({', '.join(COMPONENTS)}) found")
        self._decoders = concurrent.futures.ThreadPoolExecutor(max_decode_threads, thread_name_prefix="decode")

    @classmethod
    def from_spec(cls, spec: protocol.EncoderWorkerSpec, group: GroupMember) -> EncoderRunner:
        return cls(
            spec.model_dir,
            store=StoreClient.from_settings(spec.store),
            device=spec.device,
            dtype=getattr(torch, spec.dtype),
            limits=spec.media_limits,
        )

    def ready_message(self, spec: protocol.EncoderWorkerSpec) -> protocol.EncoderReady:
        return protocol.EncoderReady(spec.worker_id, spec.device, list(self.components))

    def run(self, job: protocol.EncodeBatch) -> protocol.EncodeResult:
        return self.encode(job)

    def profile(self) -> None:
        for component in self.components.values():
            inputs = component.largest_forward()
            if inputs is not None:
                with torch.inference_mode():
                    component.forward(inputs)

    def close(self) -> None:
        self._decoders.shutdown(wait=False)
        self.store.close()

    def encode(self, batch: protocol.EncodeBatch) -> protocol.EncodeResult:
        results: dict[int, protocol.EncodedItem] = {}
        decoded = self._decode_all(batch.items, results)
        forwards: list[protocol.ForwardTiming] = []
        publish: list[tuple[protocol.EncodeItem, bytes]] = []
        for name, component in self.components.items():
            items = [it for it in batch.items if it.component == name and it.item_id in decoded]
            started = time.perf_counter()
            prepared = []
            for item in items:
                try:
                    prepared.append((item, component.prepare(item.kind, decoded[item.item_id])))
                except ValueError as e:
                    results[item.item_id] = _client_error(item, f"cannot use the {item.kind} in {item.param}: {e}")
            for group in forward_groups(component, [p for _, p in prepared]):
                part = [prepared[i] for i in group]
                with torch.inference_mode():
                    outputs = component.forward([p for _, p in part])
                forwards.append(protocol.ForwardTiming(name, len(part), time.perf_counter() - started))
                started = time.perf_counter()
                for (item, _), out in zip(part, outputs):
                    results[item.item_id], data = self._serialize(component, item, out)
                    publish.append((item, data))
        put_started = time.perf_counter()
        failures = self._publish(publish, results)
        put_seconds = time.perf_counter() - put_started if publish else 0.0
        for item in batch.items:
            if item.item_id not in results:  # no such component, or one that takes other media
                results[item.item_id] = _client_error(
                    item, f"this model has no {item.component} for the {item.kind} in {item.param}"
                )
        return protocol.EncodeResult(
            batch.batch_id, [results[it.item_id] for it in batch.items], forwards, put_seconds, failures
        )

    def _decode_all(self, items: list[protocol.EncodeItem], results: dict[int, protocol.EncodedItem]) -> dict[int, Any]:
        """Decode every item once; two components asking for the same media share a decode.

        Distinct media decode in parallel threads (Pillow and FFmpeg release the GIL), so one
        long video does not hold up the images batched with it."""
        usable = [
            it for it in items
            if it.component in self.components and it.kind in self.components[it.component].kinds
        ]  # fmt: skip  (the rest is reported as unsupported by encode())
        first: dict[tuple[str, str | None, bytes], protocol.EncodeItem] = {}
        for item in usable:
            first.setdefault((item.kind, item.fmt, item.data), item)
        seen: dict[tuple[str, str | None, bytes], Any] = {}
        if first:
            futures = {key: self._decoders.submit(self._try_decode, it) for key, it in first.items()}
            seen = {key: f.result() for key, f in futures.items()}
        decoded: dict[int, Any] = {}
        for item in usable:
            value = seen[(item.kind, item.fmt, item.data)]
            if isinstance(value, MediaError) and value.param != item.param:
                value = self._try_decode(item)  # decoded again so the message names this part
            if isinstance(value, MediaError):
                results[item.item_id] = _client_error(item, value.message)
            else:
                decoded[item.item_id] = value
        return decoded

    def _try_decode(self, item: protocol.EncodeItem) -> Any:
        try:
            return self._decode(item)
        except MediaError as e:
            return e

    def _decode(self, item: protocol.EncodeItem) -> Any:
        if item.kind == "image":
            return decode_image(item.data, self.limits, item.param)
        if item.kind == "video":
            frames, _timestamps = decode_video(item.data, self.limits, item.param)
            return frames
        return decode_audio(item.data, item.fmt, self.limits, item.param)

    @staticmethod
    def _serialize(
        component: Component, item: protocol.EncodeItem, out: torch.Tensor
    ) -> tuple[protocol.EncodedItem, bytes]:
        meta = {"component": component.name, "kind": item.kind}
        if component.discrete:
            codes = [int(c) for c in out.tolist()]
            return protocol.EncodedItem(item.item_id, len(codes), codes), encode_codes(codes, meta)
        return protocol.EncodedItem(item.item_id, int(out.shape[0])), embeddings_to_bytes(out, meta)

    def _publish(
        self, outputs: list[tuple[protocol.EncodeItem, bytes]], results: dict[int, protocol.EncodedItem]
    ) -> int:
        """Write every output of the batch at once; a failed write marks only its item.
        Returns how many failed."""
        errors = self.store.put_many([(item.key, data) for item, data in outputs])
        for (item, _), error in zip(outputs, errors):
            if error is not None:
                log.error("store put %s failed: %s", item.key, error)
                results[item.item_id].store_error = str(error) or type(error).__name__
        return sum(error is not None for error in errors)


def _client_error(item: protocol.EncodeItem, message: str) -> protocol.EncodedItem:
    return protocol.EncodedItem(item.item_id, 0, None, error=message)
