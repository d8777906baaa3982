#!/usr/bin/env python3
"""Realtime API under load (issue 25, acceptance 2): many sessions at once, each speaking one
turn in real time under server VAD; the server's memory after they close; and sessions that
leave mid-answer.

Starts `bin/omni-serve` on its embedded default (the tiny omni checkpoint; no --model) with
--no-image-output on a free port (or uses --base-url and --pid of a running server), then:

  warm-up      --sessions sessions, each one spoken turn (unmeasured: lazy imports, thread pools,
               allocator arenas and the encoder's cache are filled, so the start figure counts them)
  start RSS    the server process's VmRSS (/proc/<pid>/status; its workers are other processes)
  load         --sessions sessions at once, each: session.update (server VAD, silence 400 ms, a
               logit bias on <|im_end|> so the random model's text ends soon and it speaks), then
               an espeak-ng clip (--text, about 2 s, plus 0.8 s of silence) in --chunk-ms appends
               paced in real time; the turn ends at response.done. Each must be completed and
               carry audio.
  disconnect   --sessions sessions at once start a long spoken answer (no bias) and close their
               socket at its first audio delta
  idle         /metrics until the engines run nothing, their KV usage is 0, no vocoder stream is
               open and no WebSocket is active (vllm:websocket_connections_active)
  end RSS      VmRSS again once the sockets are closed and the server is idle

Prints a table: sessions answered, first audio after speech_stopped (p50/p90/max, as each client
saw it), wall times, RSS at start and end and their difference (acceptance: under 50 MB).
The e2e test (tests/e2e/test_realtime.py) runs the same rounds, smaller, with these functions.

    PYTHONPATH=. .venv/bin/python bench/realtime_load.py                  # 50 sessions
    PYTHONPATH=. .venv/bin/python bench/realtime_load.py --sessions 8     # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MODEL = "omni-tiny"  # the embedded default's served name
SAMPLE_RATE = 24000
TEXT = "What is the weather like in Seoul today?"  # about 2.2 s in espeak-ng's voice

OnEvent = Callable[[bytes], None]


@dataclass
class Turn:
    """One spoken turn as the client saw it (times: time.monotonic() at receipt)."""

    status: str | None = None
    audio_samples: int = 0  # 24 kHz PCM16 samples of output audio
    speech_started: float | None = None
    speech_stopped: float | None = None
    created: float | None = None  # response.created
    first_text: float | None = None  # the first transcript (or text) delta
    text_end: float | None = None  # the last transcript delta before the first audio
    first_audio: float | None = None
    done: float | None = None
    usage: dict[str, Any] | None = None
    kinds: list[str] = field(default_factory=list)
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def first_audio_s(self) -> float | None:
        """speech_stopped -> the first response.output_audio.delta."""
        if self.speech_stopped is None or self.first_audio is None:
            return None
        return self.first_audio - self.speech_stopped


def clip_pcm16(text: str = TEXT, silence_s: float = 0.8) -> bytes:
    """espeak-ng's speech of text at 24 kHz, then silence_s of silence, as PCM16 bytes."""
    sys.path.insert(0, str(ROOT))
    from tests.e2e.audio import spoken

    clip = spoken(text, SAMPLE_RATE, silence_s=silence_s)
    if clip is None:
        raise RuntimeError("espeak-ng is not installed (bin/setup test installs it)")
    return (np.clip(clip, -1, 1) * 32767).astype("<i2").tobytes()


def dithered(pcm: bytes, seed: int) -> bytes:
    """pcm with +-2 LSB of noise: each session's clip its own bytes, so no session's audio is
    an encoder-cache or prefix-cache hit of another's."""
    x = np.frombuffer(pcm, dtype="<i2").astype(np.int32)
    noise = np.random.default_rng(seed).integers(-2, 3, len(x))
    return np.clip(x + noise, -32768, 32767).astype("<i2").tobytes()


def im_end_bias(base: str, model: str, value: float = 8.0) -> dict[str, float]:
    body = json.dumps({"model": model, "prompt": "<|im_end|>", "add_special_tokens": False}).encode()
    req = urllib.request.Request(f"{base}/tokenize", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return {str(json.loads(r.read())["tokens"][0]): value}


def connect(base: str, model: str, api_key: str = "unused") -> Any:
    import openai

    client = openai.AsyncOpenAI(base_url=f"{base}/v1", api_key=api_key, max_retries=0)
    return client.realtime.connect(model=model)


async def configure(conn: Any, bias: dict[str, float], *, silence_ms: int = 400, max_output_tokens: int = 200,
                    seed: int = 3, transcribe: bool = False, **vad: Any) -> None:  # fmt: skip
    """Server VAD (silence_ms; vad: its other fields), the bias, and the user's turns
    transcribed when transcribe."""
    turn_detection = {"type": "server_vad", "silence_duration_ms": silence_ms, **vad}
    await conn.send({"type": "session.update", "session": {
        "type": "realtime", "logit_bias": bias, "seed": seed, "max_output_tokens": max_output_tokens,
        "audio": {"input": {"turn_detection": turn_detection, "transcription": {} if transcribe else None}}}})  # fmt: skip


async def read_turn(conn: Any, turn: Turn, on_event: OnEvent | None = None, until: str = "response.done") -> Turn:
    """Events into turn, up to and including the first of kind `until`."""
    while True:
        raw = await conn.recv_bytes()
        now = time.monotonic()
        if on_event is not None:
            on_event(raw)
        event = json.loads(raw)
        kind = event["type"]
        turn.kinds.append(kind)
        if kind == "input_audio_buffer.speech_started":
            turn.speech_started = turn.speech_started or now
        elif kind == "input_audio_buffer.speech_stopped":
            turn.speech_stopped = now
        elif kind == "response.created":
            turn.created = now
        elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
            turn.first_text = turn.first_text or now
            if turn.first_audio is None:
                turn.text_end = now
        elif kind == "response.output_audio.delta":
            turn.audio_samples += len(base64.b64decode(event["delta"])) // 2
            if turn.first_audio is None:
                turn.first_audio = now
        elif kind == "error":
            turn.errors.append(event["error"])
        elif kind == "response.done":
            turn.done, turn.status, turn.usage = now, event["response"]["status"], event["response"]["usage"]
        if kind == until:
            return turn


async def send_audio(conn: Any, pcm: bytes, *, chunk_ms: int = 20, realtime: bool = True) -> None:
    """pcm in chunk_ms appends; realtime: each sent when the audio before it has played."""
    step = SAMPLE_RATE * 2 * chunk_ms // 1000
    start = time.monotonic()
    for n, i in enumerate(range(0, len(pcm), step)):
        if realtime:
            delay = start + n * chunk_ms / 1000 - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
        await conn.send({"type": "input_audio_buffer.append", "audio": base64.b64encode(pcm[i : i + step]).decode()})


async def speak(conn: Any, pcm: bytes, *, chunk_ms: int = 20, realtime: bool = True, on_event: OnEvent | None = None,
                timeout: float = 300) -> Turn:  # fmt: skip
    """Send the clip while reading the session's events until the response it triggers is done."""
    turn = Turn()
    reader = asyncio.create_task(read_turn(conn, turn, on_event))
    try:
        await send_audio(conn, pcm, chunk_ms=chunk_ms, realtime=realtime)
        return await asyncio.wait_for(reader, timeout)
    finally:
        reader.cancel()


async def spoken_session(base: str, model: str, pcm: bytes, bias: dict[str, float], *, chunk_ms: int = 20,
                         realtime: bool = True, on_event: OnEvent | None = None) -> Turn:  # fmt: skip
    """One session, one spoken turn under server VAD, then the socket closes."""
    async with connect(base, model) as conn:
        await configure(conn, bias)
        return await speak(conn, pcm, chunk_ms=chunk_ms, realtime=realtime, on_event=on_event)


async def abandoned_session(base: str, model: str, *, max_output_tokens: int = 1500, timeout: float = 300) -> Turn:
    """A long spoken answer (no bias), the socket closed at its first audio delta: mid-answer,
    with its LLM request running and its vocoder stream open."""
    turn = Turn()
    async with connect(base, model) as conn:
        await conn.send({"type": "session.update", "session": {"type": "realtime", "seed": 3, "logit_bias": {},
                                                               "audio": {"input": {"turn_detection": None}}}})  # fmt: skip
        await conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                     "content": [{"type": "input_text", "text": "Talk."}]}})  # fmt: skip
        await conn.send({"type": "response.create", "response": {"max_output_tokens": max_output_tokens}})
        await asyncio.wait_for(read_turn(conn, turn, until="response.output_audio.delta"), timeout)
    return turn


def read_metrics(base: str) -> dict[str, float]:
    """Each series' samples summed over their labels (name -> total)."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=30) as r:
        text = r.read().decode()
    totals: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            totals[name] = totals.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return totals


IDLE_SERIES = ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
               "omni_audio_decoder_streams_open", "vllm:websocket_connections_active")  # fmt: skip


async def wait_idle(base: str, timeout: float = 60) -> dict[str, float]:
    """IDLE_SERIES once all are 0, or as they are when the wait runs out (the engines' gauges
    are set at each scheduler step)."""
    deadline = time.monotonic() + timeout
    while True:
        m = await asyncio.to_thread(read_metrics, base)
        state = {k: m.get(k, 0.0) for k in IDLE_SERIES}
        if not any(state.values()) or time.monotonic() > deadline:
            return state
        await asyncio.sleep(0.2)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


# ---- the bench ------------------------------------------------------------------------------
def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def run(base: str, pid: int, args: argparse.Namespace) -> dict[str, Any]:
    pcm = clip_pcm16(args.text)
    bias = im_end_bias(base, args.model)
    n = args.sessions
    out: dict[str, Any] = {"sessions": n, "clip_s": len(pcm) / 2 / SAMPLE_RATE}

    async def load_round() -> tuple[list[Turn], float]:
        t0 = time.monotonic()
        turns = await asyncio.gather(
            *(spoken_session(base, args.model, dithered(pcm, seed), bias, chunk_ms=args.chunk_ms) for seed in range(n))
        )
        return list(turns), time.monotonic() - t0

    _, out["warmup_s"] = await load_round()
    out["idle_after_warmup"] = await wait_idle(base)
    out["rss_start_kib"] = rss_kib(pid)
    turns, out["load_s"] = await load_round()
    ok = [t for t in turns if t.status == "completed" and t.audio_samples > 0]
    out["answered"] = len(ok)
    out["statuses"] = sorted({str(t.status) for t in turns})
    firsts = [t.first_audio_s for t in ok if t.first_audio_s is not None]
    out["first_audio_ms"] = {
        "p50": _pct(firsts, 50) * 1000,
        "p90": _pct(firsts, 90) * 1000,
        "max": max(firsts, default=float("nan")) * 1000,
    }
    t0 = time.monotonic()
    left = await asyncio.gather(*(abandoned_session(base, args.model) for _ in range(n)))
    out["disconnect_s"] = time.monotonic() - t0
    out["left_mid_answer"] = sum(t.first_audio is not None and t.status is None for t in left)
    out["idle_after_disconnects"] = await wait_idle(base)
    out["rss_end_kib"] = rss_kib(pid)
    out["rss_growth_mib"] = (out["rss_end_kib"] - out["rss_start_kib"]) / 1024
    return out


def table(r: dict[str, Any]) -> str:
    fa = r["first_audio_ms"]
    rows = [
        ("sessions at once", f"{r['sessions']}"),
        ("clip (speech + silence)", f"{r['clip_s']:.2f} s in 20 ms appends, real time"),
        ("answered (completed, with audio)", f"{r['answered']}/{r['sessions']}  statuses {r['statuses']}"),
        ("first audio after speech_stopped", f"p50 {fa['p50']:.0f} ms  p90 {fa['p90']:.0f} ms  max {fa['max']:.0f} ms"),
        (
            "round wall time",
            f"warm-up {r['warmup_s']:.1f} s, load {r['load_s']:.1f} s, disconnects {r['disconnect_s']:.1f} s",
        ),
        ("left mid-answer", f"{r['left_mid_answer']}/{r['sessions']}"),
        ("idle after disconnects", ", ".join(f"{k}={v:g}" for k, v in r["idle_after_disconnects"].items())),
        ("server RSS start (after warm-up)", f"{r['rss_start_kib'] / 1024:.1f} MiB"),
        ("server RSS end (sockets closed)", f"{r['rss_end_kib'] / 1024:.1f} MiB"),
        ("growth", f"{r['rss_growth_mib']:+.1f} MiB (acceptance: < 50 MB)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)



@contextlib.contextmanager
def started_server(label: str, server_args: list[str]) -> Iterator[tuple[str, int]]:
    """The embedded default on a free port with its own local store (image output off): its base
    URL and process id, stopped on the way out."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from media_bench import Server, free_port

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    store = tempfile.mkdtemp(prefix="realtime-bench-store-")
    log = Path(tempfile.mkdtemp(prefix=f"{label}-")) / "server.log"
    cmd = [str(ROOT / "bin" / "omni-serve"), "--port", str(port), "--store", f"local:{store}",
           "--no-image-output", *server_args]  # fmt: skip
    print(f"[{label}] {' '.join(cmd)} (log {log})", flush=True)
    server = Server(cmd, log, stop_timeout=60)
    server.start()
    try:
        server.wait_healthy(base, 600)
        assert server.proc is not None
        yield base, server.proc.pid
    finally:
        server.stop()

def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sessions", type=int, default=50)
    p.add_argument("--chunk-ms", type=int, default=20)
    p.add_argument("--text", default=TEXT)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--base-url", help="a running server (then --pid is its process id)")
    p.add_argument("--pid", type=int)
    p.add_argument("--server-arg", action="append", default=[], help="an extra omni-serve argument (repeatable)")
    p.add_argument("--json", type=Path, help="also write the figures here")
    args = p.parse_args(argv)
    if args.base_url:
        if args.pid is None:
            p.error("--base-url needs --pid (the server's process, for its RSS)")
        result = asyncio.run(run(args.base_url.rstrip("/"), args.pid, args))
    else:
        with started_server("realtime-load", args.server_arg) as (base, pid):
            result = asyncio.run(run(base, pid, args))
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
