"""One Realtime API session (GET /v1/realtime, omni/http/handlers/realtime.py): its settings,
its input audio buffer, its conversation, server VAD, and the response in flight. It takes
client events one at a time (handle) and emits server events (the emit callback), and knows
nothing of WebSockets.

    session.update            settings replaced field by field (audio by its parts)
    input_audio_buffer.*      appended audio (bounded); under server or semantic VAD (turn_detection.py)
                              each append's audio goes through Silero on a thread: speech_started (a
                              response playing is cancelled when interrupt_response), speech_stopped
                              (semantic: at a pause what was said so far is scored, end_of_turn.py),
                              then the commit and, with create_response, a response
    conversation.item.*       the items (omni/serving/realtime/conversation.py)
    response.create / cancel  one response at a time (omni/serving/realtime/response.py), run on
                              a task the session owns; the prompt is the whole conversation
    idle_timeout_ms           server VAD's: once a response has ended and its audio has played
                              (on the input audio's timeline), that much input audio without
                              speech commits what is held and triggers a response
                              (input_audio_buffer.timeout_triggered)

A refused event gets an `error` event naming it (its type and event_id) and the session goes
on; so does a response that admission control refuses or that fails (then response.done says
failed). close() cancels what the session still runs: requests abort, their blocks freed.
Metrics (omni/metrics.py): each response's status, and the first audio's latency.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import functools
import logging
import time
import uuid
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import msgspec
import numpy as np
from msgspec import UNSET

from omni.errors import APIError, bad_request, internal_error
from omni.metrics import Metrics
from omni.modalities.inputs.voice_activity import WINDOW_MS, VoiceActivity, VoiceActivityModel
from omni.modalities.outputs.audio import AUDIO
from omni.serving.errors import api_error
from omni.serving.model import ModelRegistry, ServedModel
from omni.serving.realtime import client_events as ev
from omni.serving.realtime import end_of_turn
from omni.serving.realtime import turn_detection as td
from omni.serving.realtime.conversation import Conversation, Item, new_item_id, not_found, wav_bytes
from omni.serving.realtime.input_image import encode_ahead, item_images
from omni.serving.realtime.input_transcription import transcribe
from omni.serving.realtime.response import Event, ResponseEvents, chat_request, new_response_id
from omni.serving.realtime.settings import default_settings, overlay, session_object
from omni.serving.realtime.truncation import Prepare, Truncation
from omni.shared.media import g711
from omni.shared.media.decimator import Decimator
from omni.shared.media.errors import MediaError

log = logging.getLogger("omni.serving.realtime")
MIN_COMMIT_MS = 100  # OpenAI's least: a shorter buffer is an error


class RealtimeSession:
    def __init__(
        self, models: ModelRegistry, model: ServedModel, emit: Callable[[Event], None], *,
        vad_model: VoiceActivityModel | None, max_buffer_seconds: float, timeout: float | None = None,
        metrics: Metrics | None = None,
    ) -> None:  # fmt: skip
        self.models = models
        self.metrics = metrics
        if metrics is not None:
            metrics.realtime_model(model.name)
        self.model = model
        self._emit = emit
        self.vad_model = vad_model
        self.timeout = timeout
        self.id = f"sess_{uuid.uuid4().hex[:24]}"
        self.settings = default_settings(speaks=model.output(AUDIO) is not None, detects_voice=vad_model is not None)
        self.conversation = Conversation()
        self.max_buffer_seconds = max_buffer_seconds
        self._buffer: list[np.ndarray] = []  # int16 at the input format's rate, uncommitted
        self._buffer_start = 0  # the buffer's first sample, counted from the session's first
        self._appended = 0  # samples appended in all
        self._vad: VoiceActivity | None = None
        self._decimator: Decimator | None = None
        self._detector: td.TurnDetector | None = None
        self._vad_windows = 0
        self._speech_start_ms = 0
        self._pending_item = new_item_id()  # the id the next committed audio gets
        self._response: tuple[ResponseEvents, asyncio.Task[None]] | None = None
        self._cancel_reason: str | None = None
        self._idle_from_ms: int | None = None  # input audio ms where the idle timeout counts from
        self._first_audio_ms: int | None = None  # input audio ms when the response's audio began
        self._spoken = asyncio.Event()  # the response's audio began, or it ended: transcripts may run
        self._spoken.set()
        self._tasks: set[asyncio.Task[None]] = set()
        self.num_responses = 0

    # ------------------------------------------------------------------ plumbing

    def emit(self, event: Event) -> None:
        self._emit({"event_id": f"event_{uuid.uuid4().hex[:20]}", **event})

    def error(self, exc: APIError, event_type: str | None, event_id: str | None) -> None:
        message = exc.message
        if event_type is not None:
            message = f"{event_type}: {message}"
        error = {"type": exc.type, "code": exc.code, "message": message, "param": exc.param, "event_id": event_id}
        self.emit({"type": "error", "error": error})

    def start(self) -> None:
        self.emit({"type": "session.created", "session": self.session_json()})

    async def close(self) -> None:
        """The socket closed: cancel the response and transcriptions; their requests abort."""
        tasks = list(self._tasks)
        if self._response is not None:
            tasks.append(self._response[1])
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._buffer.clear()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ------------------------------------------------------------------ events

    async def handle(self, frame: str | bytes) -> None:
        try:
            event = ev.parse_event(frame)
        except ev.EventError as exc:
            self.error(exc.error, exc.event_type, exc.event_id)
            return
        try:
            await self._dispatch(event)
        except (APIError, MediaError) as exc:
            self.error(api_error(exc) or internal_error(), event.type, event.event_id)

    async def _dispatch(self, event: Any) -> None:
        if isinstance(event, ev.SessionUpdate):
            self._update(event.session)
            self.emit({"type": "session.updated", "session": self.session_json()})
        elif isinstance(event, ev.AudioAppend):
            await self._append(event.audio)
        elif isinstance(event, ev.AudioCommit):
            self._commit(None, None)
        elif isinstance(event, ev.AudioClear):
            self._clear_buffer()
            self.emit({"type": "input_audio_buffer.cleared"})
        elif isinstance(event, ev.ItemCreate):
            await self._create_item(event.item, event.previous_item_id)
        elif isinstance(event, ev.ItemRetrieve):
            self.emit({"type": "conversation.item.retrieved", "item": self.conversation.get(event.item_id)})
        elif isinstance(event, ev.ItemDelete):
            self.conversation.delete(event.item_id)
            self.emit({"type": "conversation.item.deleted", "item_id": event.item_id})
        elif isinstance(event, ev.ItemTruncate):
            self.conversation.truncate(event.item_id, event.content_index, event.audio_end_ms)
            self.emit({"type": "conversation.item.truncated", "item_id": event.item_id,
                       "content_index": event.content_index, "audio_end_ms": event.audio_end_ms})  # fmt: skip
        elif isinstance(event, ev.ResponseCreate):
            self.respond(event.response, event_id=event.event_id)
        elif isinstance(event, ev.ResponseCancel):
            if self._response is None or (event.response_id not in (None, self._response[0].id)):
                raise bad_request("There is no active response to cancel.", param="response_id",
                                  code="response_cancel_not_active")  # fmt: skip
            self.cancel("client_cancelled")
        elif isinstance(event, ev.OutputAudioClear):
            pass  # over a WebSocket the client holds what was sent; nothing is buffered here

    # ------------------------------------------------------------------ settings

    def _update(self, f: ev.SessionFields) -> None:
        if f.model is not UNSET and f.model not in self.models.names(self.model):  # an alias too (openai-agents')
            raise bad_request(f"The session's model is '{self.model.name}'; it cannot change.", param="session.model")
        s = overlay(self.settings, f)
        if f.audio is not UNSET:
            if f.audio.input is not UNSET:
                a = f.audio.input
                if a.format is not UNSET:
                    if self._buffer and a.format.type != s["input_format"].type:
                        raise bad_request("Clear or commit the input audio before its format changes.",
                                          param="session.audio.input.format")  # fmt: skip
                    s["input_format"] = a.format
                if a.transcription is not UNSET:
                    s["transcription"] = a.transcription
                if a.turn_detection is not UNSET:
                    if a.turn_detection is not None and self.vad_model is None:
                        raise bad_request("This server has no voice activity model (silero-vad): turn_detection "
                                          "must be null.", param="session.audio.input.turn_detection")  # fmt: skip
                    s["turn_detection"] = a.turn_detection
            if f.audio.output is not UNSET:
                o = f.audio.output
                if o.format is not UNSET:
                    s["output_format"] = o.format
                if o.voice is not UNSET:
                    self._check_voice(o.voice, "session.audio.output.voice")
                    s["voice"] = o.voice
        if "audio" in s["output_modalities"] and self.model.output(AUDIO) is None:
            raise bad_request(f"The model '{self.model.name}' cannot speak.", param="session.output_modalities")
        if any(s[k] != self.settings[k] for k in ("turn_detection", "input_format", "transcription")):
            self._vad = None  # a fresh detector for the new settings, on the next append
        self.settings = s

    def _check_voice(self, voice: str, param: str) -> None:
        audio = self.model.output(AUDIO)
        if audio is not None:
            audio.voice_index(voice, param)  # a 400 naming both tables

    def session_json(self) -> dict[str, Any]:
        return session_object(self.id, self.model.name, self.settings)

    # ------------------------------------------------------------------ input audio

    def _decode(self, data: str, param: str) -> np.ndarray:
        try:
            raw = base64.b64decode(data, validate=True)
        except (binascii.Error, ValueError):
            raise bad_request("The audio is not valid base64.", param=param, code="invalid_value") from None
        fmt = self.settings["input_format"].type
        if fmt == "audio/pcm":
            if len(raw) % 2:
                raise bad_request("audio/pcm is 16-bit samples: an even number of bytes.", param=param)
            return np.frombuffer(raw, dtype="<i2")
        return g711.decode(raw, "pcmu" if fmt == "audio/pcmu" else "pcma")

    @property
    def _rate(self) -> int:
        return int(self.settings["input_format"].sample_rate)

    def _ms(self, samples: int) -> int:
        return samples * 1000 // self._rate

    async def _append(self, data: str) -> None:
        samples = self._decode(data, "audio")
        held = sum(len(b) for b in self._buffer)
        if (held + len(samples)) / self._rate > self.max_buffer_seconds:
            raise bad_request(
                f"The input audio buffer holds at most {self.max_buffer_seconds:g} s (--realtime-max-buffer-seconds); "
                "commit or clear it first.", param="audio", code="input_audio_buffer_full",
            )  # fmt: skip
        self._buffer.append(samples)
        self._appended += len(samples)
        if self.settings["turn_detection"] is not None and len(samples):
            await self._detect(samples)

    async def _detect(self, samples: np.ndarray) -> None:
        vad: ev.TurnDetection = self.settings["turn_detection"]
        if self._vad is None:
            assert self.vad_model is not None
            self._vad = self.vad_model.stream()
            self._decimator = Decimator(3) if self._rate == 24000 else None
            self._detector = td.new_detector(vad, WINDOW_MS, scoring=self.settings["transcription"] is not None)
            self._vad_windows = self._ms(self._appended - len(samples)) // WINDOW_MS
        assert self._detector is not None
        x = samples.astype(np.float32) / 32768.0
        if self._decimator is not None:
            x = self._decimator.push(x)
        probs = await asyncio.to_thread(self._vad.push, x)  # onnxruntime, off the event loop
        events = self._detector.push(probs, self._vad_windows * WINDOW_MS)
        self._vad_windows += len(probs)
        for turn in events:
            self._turn(turn, vad)
        if not self._detector.speaking:  # keep only the prefix padding's worth of quiet audio
            self._trim(self._ms(self._appended) - td.padding_ms(vad))
            if isinstance(vad, ev.ServerVad):
                self._check_idle(vad)

    def _turn(self, turn: td.TurnEvent, vad: ev.TurnDetection) -> None:
        if isinstance(turn, td.SpeechStarted):
            self._speech_start_ms = turn.audio_start_ms
            self._idle_from_ms = None
            self.emit({"type": "input_audio_buffer.speech_started", "audio_start_ms": turn.audio_start_ms,
                       "item_id": self._pending_item})  # fmt: skip
            if vad.interrupt_response and self._response is not None:
                self.cancel("turn_detected")
        elif isinstance(turn, td.Pause):
            assert isinstance(self._detector, td.SemanticTurnDetector)  # the buffer: the padding, the speech, the pause
            self._spawn(self._score_pause(self._detector, np.concatenate(self._buffer), turn))
        else:
            self.emit({"type": "input_audio_buffer.speech_stopped", "audio_end_ms": turn.audio_end_ms,
                       "item_id": self._pending_item})  # fmt: skip
            turn_end = time.monotonic()
            start = max(self._speech_start_ms - td.padding_ms(vad), 0)
            self._commit(start, turn.audio_end_ms)
            if vad.create_response and self._response is None:
                self.respond(ev.ResponseFields(), turn_end=turn_end)

    async def _score_pause(self, detector: td.SemanticTurnDetector, clip: np.ndarray, pause: td.Pause) -> None:
        wav, language = wav_bytes(clip, self._rate), self.settings["transcription"].language
        p_end = await end_of_turn.pause_score(self.models, self.model.name, wav, language, timeout=self.timeout)
        try:  # the detector decides (unless the settings changed meanwhile); its commit may be refused
            for turn in detector.score(pause.silence_from_ms, p_end) if detector is self._detector and self._vad else ():
                self._turn(turn, self.settings["turn_detection"])
        except APIError as exc:  # as in _detect: an `error` event, and the session goes on
            self.error(exc, None, None)

    def _check_idle(self, vad: ev.ServerVad) -> None:
        """idle_timeout_ms of input audio without speech since the last response's audio
        played: what the buffer holds (the padding's worth of that quiet) is committed, when
        it is long enough to be an item, and a response is created."""
        now_ms = self._ms(self._appended)
        idle_from = self._idle_from_ms
        if vad.idle_timeout_ms is None or idle_from is None or self._response is not None:
            return
        if now_ms - idle_from < vad.idle_timeout_ms:
            return
        turn_end = time.monotonic()
        self._idle_from_ms = None
        self.emit({"type": "input_audio_buffer.timeout_triggered", "audio_start_ms": idle_from,
                   "audio_end_ms": now_ms, "item_id": self._pending_item})  # fmt: skip
        if self._ms(sum(len(b) for b in self._buffer)) >= MIN_COMMIT_MS:
            self._commit(None, None)
        self.respond(ev.ResponseFields(), turn_end=turn_end)

    def _trim(self, before_ms: int) -> None:
        keep_from = max(before_ms * self._rate // 1000, self._buffer_start)
        if keep_from <= self._buffer_start:
            return
        audio = np.concatenate(self._buffer) if self._buffer else np.zeros(0, np.int16)
        self._buffer = [audio[keep_from - self._buffer_start :]]
        self._buffer_start = keep_from

    def _clear_buffer(self) -> None:
        self._buffer = []
        self._buffer_start = self._appended
        if self._detector is not None:
            self._detector.reset()

    def _commit(self, start_ms: int | None, end_ms: int | None) -> None:
        """The buffer (or its [start_ms, end_ms) part, server VAD's turn) as a user audio item."""
        audio = np.concatenate(self._buffer) if self._buffer else np.zeros(0, np.int16)
        lo = 0 if start_ms is None else max(start_ms * self._rate // 1000 - self._buffer_start, 0)
        hi = len(audio) if end_ms is None else min(max(end_ms * self._rate // 1000 - self._buffer_start, 0), len(audio))
        clip = audio[lo:hi]
        if self._ms(len(clip)) < MIN_COMMIT_MS:
            raise bad_request(
                f"The input audio buffer holds {self._ms(len(clip))} ms; a commit needs at least {MIN_COMMIT_MS} ms.",
                code="input_audio_buffer_commit_empty",
            )  # fmt: skip
        self._buffer = [audio[hi:]]
        self._buffer_start += hi
        item_id, self._pending_item = self._pending_item, new_item_id()
        item = {"id": item_id, "object": "realtime.item", "type": "message", "role": "user", "status": "completed",
                "content": [{"type": "input_audio", "transcript": None}]}  # fmt: skip
        previous = self.conversation.add(item)
        wav = wav_bytes(clip, self._rate)
        self.conversation.set_user_audio(item_id, 0, wav)
        self.emit({"type": "input_audio_buffer.committed", "previous_item_id": previous, "item_id": item_id})
        self.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item})
        if self.settings["transcription"] is not None:
            self._spawn(self._transcribe(item, wav))
        else:
            self.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item})

    async def _transcribe(self, item: Item, wav: bytes) -> None:
        """The user's turn in words, as POST /v1/audio/transcriptions writes it; the item's
        transcript, then conversation.item.done. It waits for the spoken response that answers
        the turn (server VAD starts it with the commit) to begin its audio: before that it would
        compete with the answer for the encoder and the LLM, and delay the first audio."""
        await self._spoken.wait()
        t: ev.InputTranscription = self.settings["transcription"]

        def delta(text: str) -> None:
            self.emit({"type": "conversation.item.input_audio_transcription.delta", "item_id": item["id"],
                       "content_index": 0, "delta": text})  # fmt: skip

        try:
            said, usage = await transcribe(self.models, self.model, wav, language=t.language, prompt=t.prompt,
                                           timeout=self.timeout, on_text=delta)  # fmt: skip
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the turn goes on without its transcript
            self.emit({"type": "conversation.item.input_audio_transcription.failed", "item_id": item["id"],
                       "content_index": 0, "error": {"type": "transcription_error", "message": str(exc)}})  # fmt: skip
            return
        transcript = said.strip()
        item["content"][0]["transcript"] = transcript
        self.emit({"type": "conversation.item.input_audio_transcription.completed", "item_id": item["id"],
                   "content_index": 0, "transcript": transcript,
                   "usage": {"type": "tokens", "input_tokens": usage.prompt_tokens, "output_tokens": usage.completion_tokens,
                             "total_tokens": usage.prompt_tokens + usage.completion_tokens}})  # fmt: skip
        if item in self.conversation.items:
            self.emit({"type": "conversation.item.done", "previous_item_id": self.conversation.previous_id(item["id"]),
                       "item": item})  # fmt: skip

    # ------------------------------------------------------------------ items

    async def _create_item(self, given: ev.Item, previous_item_id: str | None) -> None:
        item: Item = msgspec.to_builtins(given)
        item.setdefault("id", new_item_id())
        item["object"], item["status"] = "realtime.item", "completed"
        if isinstance(given, ev.MessageItem):
            allowed = {"user": ("input_text", "input_audio", "input_image"), "system": ("input_text",),
                       "assistant": ("output_text", "output_audio")}[given.role]  # fmt: skip
            for i, part in enumerate(given.content):
                kind = item["content"][i]["type"]
                if kind not in allowed:
                    raise bad_request(f"A {given.role} message may not hold {kind}.", param=f"item.content[{i}].type")
        audio: dict[int, bytes] = {}
        if isinstance(given, ev.MessageItem):
            for i, part in enumerate(given.content):
                if isinstance(part, ev.InputAudio) and part.audio is not UNSET:
                    clip = self._decode(part.audio, f"item.content[{i}].audio")
                    audio[i] = wav_bytes(clip, self._rate)
                    item["content"][i].pop("audio", None)
                    item["content"][i].setdefault("transcript", None)
                elif isinstance(part, ev.OutputAudio):
                    item["content"][i].pop("audio", None)
        images = await item_images(self.model, item["id"], given)  # checked before the item is added
        if isinstance(given, ev.FunctionCallItem):
            item.setdefault("call_id", f"call_{uuid.uuid4().hex[:16]}")
        previous = self.conversation.add(item, previous_item_id)
        for i, wav in audio.items():
            self.conversation.set_user_audio(item["id"], i, wav)
        for i, image in images.items():
            self.conversation.set_user_image(item["id"], i, image.url)
        if images:
            self._spawn(encode_ahead(self.model, list(images.values())))
        self.emit({"type": "conversation.item.added", "previous_item_id": previous, "item": item})
        self.emit({"type": "conversation.item.done", "previous_item_id": previous, "item": item})

    # ------------------------------------------------------------------ responses

    def respond(self, fields: ev.ResponseFields, *, event_id: str | None = None, turn_end: float | None = None) -> None:
        """event_id: the response.create's (a failure's `error` names it); turn_end: when the
        turn it answers ended (time.monotonic(); now when None), where first-audio latency starts."""
        if self._response is not None:
            raise bad_request(
                f"Conversation already has an active response in progress: {self._response[0].id}. Wait until the "
                "response is finished before creating a new one.", code="conversation_already_has_active_response",
            )  # fmt: skip
        s = overlay(self.settings, fields)
        if fields.audio is not UNSET and fields.audio.output is not UNSET:
            if fields.audio.output.voice is not UNSET:
                self._check_voice(fields.audio.output.voice, "response.audio.output.voice")
                s["voice"] = fields.audio.output.voice
            if fields.audio.output.format is not UNSET:
                s["output_format"] = fields.audio.output.format
        speaks = "audio" in s["output_modalities"]
        if speaks and self.model.output(AUDIO) is None:
            raise bad_request(f"The model '{self.model.name}' cannot speak.", param="response.output_modalities")
        out_of_band = fields.conversation == "none"
        if fields.input is not UNSET and not out_of_band:
            raise bad_request("'input' is for out-of-band responses (conversation 'none').", param="response.input")
        items = self.conversation.items
        if fields.input is not UNSET:
            items = [self._reference(x, i) for i, x in enumerate(fields.input)]
        max_media = self.model.media.limits.max_items_per_request if self.model.media is not None else None
        messages = self.conversation.messages(items, max_media)
        request = functools.partial(chat_request, self.model, s)  # of all messages, or truncation.py's fewer
        request(messages)  # a request the conversation cannot make is this event's error
        response = {
            "id": new_response_id(), "object": "realtime.response", "status": "in_progress", "status_details": None,
            "output": [], "conversation_id": None if out_of_band else f"conv_{self.id[5:]}",
            "output_modalities": s["output_modalities"], "max_output_tokens": s["max_output_tokens"],
            "audio": {"output": {"format": s["output_format"].json(), "voice": s["voice"]}},
            "usage": None, "metadata": fields.metadata or None,
        }  # fmt: skip
        events = ResponseEvents(self.emit, response, None if out_of_band else self.conversation, audio=speaks,
                                audio_format=s["output_format"].type, turn_end=turn_end,
                                on_first_audio=self._first_audio)  # fmt: skip
        self._cancel_reason = None
        self._idle_from_ms = self._first_audio_ms = None
        if speaks:
            self._spoken = asyncio.Event()
        truncation = Truncation.of(s["truncation"], self.model)
        prepare = functools.partial(truncation.chat, self.models, messages, request, timeout=self.timeout)
        task = asyncio.create_task(self._run(prepare, events, event_id))
        task.add_done_callback(lambda done: self._never_ran(events, done))
        self._response = (events, task)
        self.num_responses += 1
        events.created()

    def _reference(self, x: Any, i: int) -> Item:
        """An out-of-band response's input item: a reference to a conversation item by id, or an item."""
        if isinstance(x, dict) and x.get("type") == "item_reference":
            try:
                return self.conversation.get(str(x.get("id")))
            except APIError:
                raise not_found(str(x.get("id")), f"response.input[{i}].id") from None
        raise bad_request("Only item references ({'type': 'item_reference', 'id': ...}) are read here.",
                          param=f"response.input[{i}]")  # fmt: skip

    def cancel(self, reason: str) -> None:
        if self._response is None:
            return
        self._cancel_reason = reason
        self._response[1].cancel()

    def _never_ran(self, events: ResponseEvents, task: asyncio.Task[None]) -> None:
        """A task cancelled before its first step (a response.cancel read in the same turn of the
        loop as its response.create) never enters _run, nor its finally: end the response here,
        or the session would hold it as active for good."""
        if self._response is None or self._response[1] is not task:
            return  # _run ended it
        self._response = None
        if self._cancel_reason is not None:  # None: the session closed, nobody to tell
            events.done("cancelled", None, {"type": "cancelled", "reason": self._cancel_reason})
        self._ended(events)

    def _first_audio(self, seconds: float) -> None:
        self._spoken.set()
        self._first_audio_ms = self._ms(self._appended)
        if self.metrics is not None:
            self.metrics.observe_first_audio(self.model.name, seconds)

    def _ended(self, events: ResponseEvents) -> None:
        """Count the response; the idle timeout counts from when its audio has played: its first
        audio's input position plus its length, or its end if that is later."""
        self._spoken.set()
        status = events.response["status"]
        if self.metrics is not None:
            self.metrics.add_realtime_response(self.model.name, "cancelled" if status == "in_progress" else status)
        if self._cancel_reason == "turn_detected":
            return  # the user is speaking: no idle time counts until the next response
        end_ms = self._ms(self._appended)
        if self._first_audio_ms is not None:
            end_ms = max(end_ms, self._first_audio_ms + events.audio_samples * 1000 // 24000)
        self._idle_from_ms = end_ms

    async def _run(self, prepare: Prepare, events: ResponseEvents, event_id: str | None) -> None:
        finish: str | None = None
        usage = None
        try:
            completion = await prepare()  # chat's turn of the conversation (truncation.py)
            events.parser = completion.output_format.new_parser()
            events.num_media_tokens = completion.num_media_tokens
            output = completion.outputs[0]
            try:
                with completion.admitted():
                    async with aclosing(output.deltas()) as deltas:
                        async for delta in deltas:
                            finish = delta.finish_reason or finish
                            events.push(delta)
            finally:
                usage = output.usage
        except asyncio.CancelledError:
            if self._cancel_reason is None:  # the session closed: nobody to tell
                raise
            events.done("cancelled", usage, {"type": "cancelled", "reason": self._cancel_reason})
        except Exception as exc:  # noqa: BLE001 - a refusal or an engine's failure ends this response only
            error = api_error(exc)
            if error is None:
                log.exception("realtime: a response failed")
                error = internal_error()
            self.error(error, "response.create", event_id)
            events.done("failed", usage, {"type": "failed", "error": {"type": error.type, "code": error.code}})
        else:
            if finish == "length":
                events.done("incomplete", usage, {"type": "incomplete", "reason": "max_output_tokens"})
            else:
                events.done("completed", usage)
        finally:
            self._response = None
            self._ended(events)
