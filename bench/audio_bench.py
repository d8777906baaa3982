#!/usr/bin/env python3
"""Audio output end to end (issue 11, acceptance points 3 and 4): how soon the first audio byte
comes, what it waits for, whether the stream keeps up, and what batching 8 speech requests buys.

Starts `bin/omni-serve` on its embedded default model (the tiny omni checkpoint, whose
audio_decoder/ is the tiny causal unit vocoder; no --model) once per --first-units value
(`--audio-first-chunk-units`, default 3, 4, 8), each with a fresh local store on a free port,
--no-image-output (the model's vision decoder is not used here; it only slows start-up), and
its log under bench/results/logs/. On each server, one request at a time (--warmup rounds
unmeasured, then --requests rounds; each round sends every kind once, so load drifts hit all
kinds alike; request i has seed 100 + i on every server):

  speech_pcm   POST /v1/audio/speech, stream_format audio, response_format pcm
  speech_mp3   the same, mp3
  speech_sse   stream_format sse, pcm (speech.audio.delta events)
  chat_audio   streaming chat, modalities text + audio, pcm16, a logit bias on <|im_end|> so the
               random model's text ends within a few tokens; then it speaks the text
  speech_text  the speech request's prompt as a plain streaming chat (the same messages and
               template switches, ignore_eos): the LLM's time to first token and per-token time
  chat_text    the chat_audio request as plain text: its time to first token

First audio = from sending the request to the first byte of audio (an audio stream's first body
byte, the first speech.audio.delta, the first delta.audio with data). It splits as: the first
unit token (the server's ttft_ms for the request, from its access log, matched by the
X-Request-Id the bench sends; speech_text's TTFT beside it) + the first chunk's other units
(first-units - 1 decode steps, each speech_text's per-token time) + the vocoder's time for that
chunk (from /metrics, read when the first byte arrives: omni_audio_decoder_batch_seconds'
growth since the request was sent, and how many chunks that was) + the rest (routing, encoding,
HTTP). Chat first writes the text: its split is the first token, the last transcript piece
(text end), the vocoder's first chunk and the first audio.

Keeping up: a player that starts at the first byte stalls when a later piece arrives after the
audio before it has played out; counted per pcm stream (stalls, stalled seconds), with the whole
stream's audio seconds per wall second and the vocoder's mean time per chunk after the first.

Batching (on the server with --batch-first-units, default 4): --batch-size speech requests (same
input, pcm streamed, max_units --batch-units) whose seeds are chosen by probing so that every
answer is full length (the random model may end a span early), sent one at a time and all at
once, --batch-repeats times each (alternating which goes first): wall time, audio seconds per
wall second, first-byte latency, and the vocoder's batch sizes from omni_audio_decoder_batch_size
(where the server has that metric). /proc/loadavg is sampled every 2 s throughout (the machine
is shared: the report says how busy it was per phase).

    .venv/bin/python bench/audio_bench.py                                  # everything: about 5 min on 2 cores
    .venv/bin/python bench/audio_bench.py --first-units 4 --requests 2 --warmup 1 --batch-repeats 1
    .venv/bin/python bench/audio_bench.py --skip-batching --first-units 3,8

Prints markdown tables; writes bench/results/audio-<UTC time>.json (every request's record).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import httpx  # noqa: E402
from media_bench import Server, free_port, metric, parse_metrics, pct, versions  # noqa: E402  (one harness)

SCHEMA = "audio-bench/1"
MODEL = "omni-tiny"  # the embedded default's served name
RESULTS = ROOT / "bench" / "results"
SAMPLE_RATE = 24000
UNIT_SAMPLES = 960  # 25 units a second at 24 kHz
SPEECH_INPUT = "Hello there, how are you today?"
CHAT_QUESTION = "Say hello sadly."
KINDS = ("speech_text", "speech_pcm", "speech_mp3", "speech_sse", "chat_text", "chat_audio")
BATCH_METRICS = ("omni_audio_decoder_batch_seconds", "omni_audio_decoder_batch_size")


# ---- load average ---------------------------------------------------------------------------
class LoadSampler:
    """/proc/loadavg every `period` seconds, each sample tagged with the phase then running."""

    def __init__(self, period: float = 2.0) -> None:
        self.period = period
        self.phase = "start"
        self.samples: list[dict[str, Any]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._t0 = time.monotonic()

    def _run(self) -> None:
        while not self._stop.is_set():
            one, five, fifteen = (float(x) for x in Path("/proc/loadavg").read_text().split()[:3])
            self.samples.append({"t": time.monotonic() - self._t0, "phase": self.phase, "load": [one, five, fifteen]})
            self._stop.wait(self.period)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def summary(self, phase_prefix: str) -> dict[str, float] | None:
        ones = [s["load"][0] for s in self.samples if s["phase"].startswith(phase_prefix)]
        if not ones:
            return None
        return {"min": min(ones), "median": statistics.median(ones), "max": max(ones), "samples": len(ones)}


# ---- the server's vocoder figures -----------------------------------------------------------
async def vocoder_snapshot(client: httpx.AsyncClient) -> dict[str, float] | None:
    """The audio decoder's batch metrics, or None where the server has none."""
    text = (await client.get("/metrics")).text
    if "# TYPE omni_audio_decoder_batch_seconds " not in text:
        return None
    snap = parse_metrics(text)  # a series has no samples before its first batch: zeros then
    out = {f"{m}_{s}": metric(snap, f"{m}_{s}", model_name=MODEL) for m in BATCH_METRICS for s in ("sum", "count")}
    for (name, labels), value in snap.items():
        if name == "omni_audio_decoder_batch_size_bucket":
            out[f"size_le_{dict(labels)['le']}"] = value
    return out


def vocoder_diff(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any] | None:
    if before is None or after is None:
        return None
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    batches = d["omni_audio_decoder_batch_seconds_count"]
    streams = d["omni_audio_decoder_batch_size_sum"]
    # bucket counts are cumulative (le): a bucket's own count is its le's minus the one below
    les = sorted(float(k[8:]) for k in d if k.startswith("size_le_") and k != "size_le_+Inf")
    sizes: dict[str, float] = {}
    below, previous = 0.0, 0.0
    for le in les:
        cum = d[f"size_le_{le}"]
        if cum - below:  # sizes in (previous, le]: one size where the buckets are 1 apart
            sizes[f"{le:g}" if le - previous == 1 else f"{previous + 1:g}-{le:g}"] = cum - below
        below, previous = cum, le
    return {
        "batches": batches,
        "chunks": streams,
        "seconds": d["omni_audio_decoder_batch_seconds_sum"],
        "streams_per_batch": streams / batches if batches else None,
        "batch_s_mean": d["omni_audio_decoder_batch_seconds_sum"] / batches if batches else None,
        "batch_sizes": sizes,
    }


# ---- requests -------------------------------------------------------------------------------
STALL_S = 0.01  # a gap a player's buffer hides; longer ones count as stalls


def stalls(arrivals: list[tuple[float, int]]) -> tuple[int, float]:
    """(stalls, stalled seconds) of a player that starts at the first piece: arrivals are
    (seconds since the request, samples in the piece)."""
    if not arrivals:
        return 0, 0.0
    count, stalled = 0, 0.0
    t0, n0 = arrivals[0]
    play_end = t0 + n0 / SAMPLE_RATE
    for t, n in arrivals[1:]:
        if t > play_end:
            if t > play_end + STALL_S:
                count += 1
            stalled += t - play_end
            play_end = t
        play_end += n / SAMPLE_RATE
    return count, stalled


def mp3_seconds(data: bytes) -> float | None:
    import av

    try:
        with av.open(io.BytesIO(data), mode="r") as container:
            stream = container.streams.audio[0]
            samples = 0
            for frame in container.decode(stream):
                samples += frame.samples
            return samples / stream.codec_context.sample_rate
    except (av.error.FFmpegError, IndexError):
        return None


def speech_body(seed: int, max_units: int, fmt: str = "pcm", stream_format: str = "audio") -> dict[str, Any]:
    return {"model": MODEL, "voice": "alloy", "input": SPEECH_INPUT, "response_format": fmt,
            "stream_format": stream_format, "seed": seed, "max_units": max_units}  # fmt: skip


async def speech(client: httpx.AsyncClient, body: dict[str, Any], watch_vocoder: bool, rid: str) -> dict[str, Any]:
    """One streamed speech request; with watch_vocoder, /metrics is read before it is sent and
    when its first audio byte arrives (nothing else may be in flight)."""
    rec: dict[str, Any] = {"seed": body["seed"], "request_id": rid}
    before = await vocoder_snapshot(client) if watch_vocoder else None
    sse = body["stream_format"] == "sse"
    arrivals: list[tuple[float, int]] = []
    data = bytearray()
    odd = b""  # a pcm sample split between two pieces
    start = time.perf_counter()
    async with client.stream("POST", "/v1/audio/speech", json=body, headers={"X-Request-Id": rid}) as response:
        rec["status"] = response.status_code
        if response.status_code != 200:
            rec["error"] = (await response.aread()).decode(errors="replace")[:500]
            return rec
        pieces = _sse_audio(response) if sse else response.aiter_raw()
        async for piece in pieces:
            if not piece:
                continue
            now = time.perf_counter() - start
            if not arrivals and watch_vocoder:
                rec["first_audio_s"] = now
                rec["vocoder_at_first_audio"] = vocoder_diff(before, await vocoder_snapshot(client))
            data += piece
            if body["response_format"] == "pcm":
                piece, odd = odd + piece, b""
                if len(piece) % 2:
                    piece, odd = piece[:-1], piece[-1:]
                arrivals.append((now, len(piece) // 2))
            else:
                arrivals.append((now, 0))
    rec["total_s"] = time.perf_counter() - start
    rec.setdefault("first_audio_s", arrivals[0][0] if arrivals else None)
    rec["pieces"] = len(arrivals)
    rec["bytes"] = len(data)
    if body["response_format"] == "pcm":
        rec["audio_s"] = len(data) / 2 / SAMPLE_RATE
        rec["units"] = len(data) // 2 // UNIT_SAMPLES
        rec["stalls"], rec["stalled_s"] = stalls(arrivals)
    else:
        rec["audio_s"] = mp3_seconds(bytes(data))
    if watch_vocoder:
        rec["vocoder"] = vocoder_diff(before, await vocoder_snapshot(client))
    return rec


async def _sse_audio(response: httpx.Response) -> Any:
    async for line in response.aiter_lines():
        if line.startswith("data: "):
            event = json.loads(line[6:])
            if event.get("type") == "speech.audio.delta":
                yield base64.b64decode(event["audio"])
            elif event.get("type") == "error":
                raise RuntimeError(f"speech stream error: {event}")


async def chat(
    client: httpx.AsyncClient, body: dict[str, Any], rid: str, watch_vocoder: bool = False
) -> dict[str, Any]:
    """One streamed chat request: first content or transcript piece, last one, first audio (and,
    with watch_vocoder, the vocoder's figures then, as speech() reads them)."""
    rec: dict[str, Any] = {"seed": body.get("seed"), "request_id": rid}
    before = await vocoder_snapshot(client) if watch_vocoder else None
    text_times: list[float] = []
    arrivals: list[tuple[float, int]] = []
    start = time.perf_counter()
    async with client.stream("POST", "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}) as response:
        rec["status"] = response.status_code
        if response.status_code != 200:
            rec["error"] = (await response.aread()).decode(errors="replace")[:500]
            return rec
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter() - start
            chunk = json.loads(line[6:])
            if "error" in chunk:
                rec["error"] = chunk["error"]
            if chunk.get("usage"):
                rec["completion_tokens"] = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices") or ():
                delta = choice.get("delta") or {}
                audio = delta.get("audio") or {}
                if delta.get("content") or audio.get("transcript"):
                    text_times.append(now)
                if audio.get("data"):
                    if not arrivals and watch_vocoder:
                        rec["vocoder_at_first_audio"] = vocoder_diff(before, await vocoder_snapshot(client))
                    arrivals.append((now, len(base64.b64decode(audio["data"])) // 2))
                if choice.get("finish_reason"):
                    rec["finish_reason"] = choice["finish_reason"]
    rec["total_s"] = time.perf_counter() - start
    rec["ttft_s"] = text_times[0] if text_times else None
    rec["text_end_s"] = text_times[-1] if text_times else None
    rec["text_pieces"] = len(text_times)
    if len(text_times) > 1:
        rec["itl_s"] = (text_times[-1] - text_times[0]) / (len(text_times) - 1)
    if arrivals:
        rec["first_audio_s"] = arrivals[0][0]
        rec["audio_s"] = sum(n for _, n in arrivals) / SAMPLE_RATE
        rec["pieces"] = len(arrivals)
        rec["stalls"], rec["stalled_s"] = stalls(arrivals)
    if watch_vocoder:
        rec["vocoder"] = vocoder_diff(before, await vocoder_snapshot(client))
    return rec


class Requests:
    """The bodies of the latency phase's kinds."""

    def __init__(self, im_end: int, args: argparse.Namespace) -> None:
        self.bias = {str(im_end): args.end_bias}
        self.args = args

    def chat_body(self, seed: int, audio: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": MODEL, "messages": [{"role": "user", "content": CHAT_QUESTION}],
            "max_tokens": self.args.chat_tokens, "seed": seed, "logit_bias": self.bias, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip
        if audio:
            body |= {"modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"}}
        return body

    def speech_text_body(self, seed: int) -> dict[str, Any]:
        # the prompt speech builds (omni/http/handlers/speech.py), less the span's opening token
        return {
            "model": MODEL, "messages": [{"role": "user", "content": SPEECH_INPUT}],
            "chat_template_kwargs": {"enable_thinking": False, "skip_reasoning": True},
            "max_tokens": self.args.text_tokens, "ignore_eos": True, "seed": seed, "stream": True,
            "stream_options": {"include_usage": True},
        }  # fmt: skip

    async def run(self, client: httpx.AsyncClient, kind: str, seed: int, rid: str) -> dict[str, Any]:
        units = self.args.latency_units
        if kind == "speech_text":
            return await chat(client, self.speech_text_body(seed), rid)
        if kind == "speech_pcm":
            return await speech(client, speech_body(seed, units, "pcm"), True, rid)
        if kind == "speech_mp3":
            return await speech(client, speech_body(seed, units, "mp3"), True, rid)
        if kind == "speech_sse":
            return await speech(client, speech_body(seed, units, "pcm", "sse"), True, rid)
        if kind in ("chat_text", "chat_audio"):
            audio = kind == "chat_audio"
            return await chat(client, self.chat_body(seed, audio=audio), rid, watch_vocoder=audio)
        raise ValueError(kind)


# ---- phases ---------------------------------------------------------------------------------
async def latency_phase(client: httpx.AsyncClient, requests: Requests, args: argparse.Namespace,
                        load: LoadSampler, first_units: int) -> dict[str, list[dict[str, Any]]]:  # fmt: skip
    records: dict[str, list[dict[str, Any]]] = {k: [] for k in KINDS}
    for i in range(args.warmup + args.requests):
        warm = i < args.warmup
        load.phase = f"latency-{first_units}" + ("-warmup" if warm else "")
        for kind in KINDS:
            try:
                rec = await requests.run(client, kind, 100 + i, f"ab-f{first_units}-{kind}-{i}")
            except (httpx.HTTPError, RuntimeError) as e:
                rec = {"seed": 100 + i, "error": f"{type(e).__name__}: {e}"}
            if "error" in rec:
                print(f"[audio-bench]   {kind} seed {100 + i}: {rec['error']}", file=sys.stderr, flush=True)
            if not warm:
                records[kind].append(rec)
        print(f"[audio-bench] first-units {first_units}: round {i + 1}/{args.warmup + args.requests}"
              f"{' (warm-up)' if warm else ''} done, load {os.getloadavg()[0]:.2f}", flush=True)  # fmt: skip
    return records


async def probe_seeds(client: httpx.AsyncClient, args: argparse.Namespace) -> tuple[list[int], dict[str, Any]]:
    """Seeds whose speech reaches the cap (max_units): the batch's answers all as long."""
    chosen, lengths = [], {}
    for seed in range(1000, 1000 + args.max_probes):
        r = await client.post("/v1/audio/speech", json=speech_body(seed, args.batch_units) | {"stream_format": "audio"})
        r.raise_for_status()
        units = len(r.content) // 2 // UNIT_SAMPLES
        lengths[seed] = units
        if units >= args.batch_units:
            chosen.append(seed)
            if len(chosen) == args.batch_size:
                break
    if len(chosen) < args.batch_size:  # not enough full-length answers: take the longest
        chosen = sorted(lengths, key=lambda s: -lengths[s])[: args.batch_size]
    return chosen, {"probed": len(lengths), "units_by_seed": lengths, "chosen_units": [lengths[s] for s in chosen]}


async def batch_run(client: httpx.AsyncClient, seeds: list[int], units: int, concurrent: bool,
                    repeat: int) -> dict[str, Any]:  # fmt: skip
    mode = "concurrent" if concurrent else "sequential"
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    before = await vocoder_snapshot(client)
    t0 = time.perf_counter()
    if concurrent:
        recs = list(await asyncio.gather(*(speech(client, speech_body(s, units), False, f"ab-batch-{mode}-{repeat}-{s}")
                                           for s in seeds)))  # fmt: skip
    else:
        recs = [await speech(client, speech_body(s, units), False, f"ab-batch-{mode}-{repeat}-{s}") for s in seeds]
    wall = time.perf_counter() - t0
    ok = [r for r in recs if "error" not in r]
    audio = sum(r["audio_s"] for r in ok)
    first = [r["first_audio_s"] for r in ok]
    return {
        "mode": mode,
        "wall_s": wall,
        "ok": len(ok),
        "audio_s": audio,
        "audio_s_per_wall_s": audio / wall,
        "first_audio_s": {"p50": pct(first, 50), "p90": pct(first, 90), "max": max(first, default=None)},
        "total_s": {"p50": pct([r["total_s"] for r in ok], 50), "max": max((r["total_s"] for r in ok), default=None)},
        "stalls": sum(r["stalls"] for r in ok),
        "stalled_s": sum(r["stalled_s"] for r in ok),
        "units": [r.get("units") for r in recs],
        "vocoder": vocoder_diff(before, await vocoder_snapshot(client)),
        "loadavg_before_after": [load_before, Path("/proc/loadavg").read_text().split()[:3]],
        "records": recs,
    }


async def batching_phase(client: httpx.AsyncClient, args: argparse.Namespace, load: LoadSampler) -> dict[str, Any]:
    load.phase = "batch-probe"
    seeds, probe = await probe_seeds(client, args)
    print(f"[audio-bench] batching: seeds {seeds} ({probe['chosen_units']} units), {probe['probed']} probed",
          flush=True)  # fmt: skip
    runs = []
    for r in range(args.batch_repeats):
        for concurrent in ((False, True) if r % 2 == 0 else (True, False)):
            load.phase = f"batch-{'concurrent' if concurrent else 'sequential'}"
            run = await batch_run(client, seeds, args.batch_units, concurrent, r + 1)
            run["repeat"] = r + 1

            runs.append(run)
            print(f"[audio-bench] batching {run['mode']} #{r + 1}: {run['wall_s']:.1f} s wall, "
                  f"{run['audio_s_per_wall_s']:.2f} audio s per s, load {os.getloadavg()[0]:.2f}",
                  flush=True)  # fmt: skip
    return {"seeds": seeds, "probe": probe, "units": args.batch_units, "runs": runs}


# ---- one server -----------------------------------------------------------------------------
async def im_end_id(client: httpx.AsyncClient) -> int:
    r = await client.post("/tokenize", json={"model": MODEL, "prompt": "<|im_end|>", "add_special_tokens": False})
    r.raise_for_status()
    tokens = r.json()["tokens"]
    if len(tokens) != 1:
        raise RuntimeError(f"<|im_end|> is not one token: {tokens}")
    return int(tokens[0])


async def on_server(base: str, first_units: int, args: argparse.Namespace, load: LoadSampler) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(base_url=base, timeout=args.request_timeout, limits=limits) as client:
        requests = Requests(await im_end_id(client), args)
        out: dict[str, Any] = {}
        if args.requests:
            out["latency"] = await latency_phase(client, requests, args, load, first_units)
        if not args.skip_batching and first_units == args.batch_first_units:
            out["batching"] = await batching_phase(client, args, load)
        return out


def run_server(first_units: int, args: argparse.Namespace, load: LoadSampler, stamp: str) -> dict[str, Any]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    store = Path(tempfile.mkdtemp(prefix="audio-bench-store-"))
    log_path = RESULTS / "logs" / f"audio-{stamp}-first{first_units}.server.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    cmd = [str(ROOT / "bin" / "omni-serve"), "--port", str(port), "--store", f"local:{store}",
           "--audio-first-chunk-units", str(first_units), *args.server_arg]  # fmt: skip
    if not args.with_image_output:
        cmd.append("--no-image-output")
    server = Server(cmd, log_path, stop_timeout=60)
    out: dict[str, Any] = {"first_units": first_units, "command": cmd, "server_log": str(log_path)}
    load.phase = f"startup-{first_units}"
    print(f"[audio-bench] {' '.join(cmd)}", flush=True)
    server.start()
    try:
        out["startup_s"] = server.wait_healthy(base, args.start_timeout)
        print(f"[audio-bench] healthy after {out['startup_s']:.0f} s", flush=True)
        out |= asyncio.run(on_server(base, first_units, args, load))
    except Exception as e:  # noqa: BLE001  (recorded; the server still stops, the next one starts)
        out["error"] = f"{type(e).__name__}: {e}"
        print(f"[audio-bench] error: {out['error']} (server log {log_path})", file=sys.stderr, flush=True)
    finally:
        out["stopped_by"] = server.stop()
        shutil.rmtree(store, ignore_errors=True)
    add_server_times(out, log_path)
    return out


_ACCESS = re.compile(r"ttft_ms=([0-9.]+) latency_ms=([0-9.]+) request_id=(\S+)")


def add_server_times(out: dict[str, Any], log_path: Path) -> None:
    """Each record's server-side times from the access log: ttft_ms (its first token: for speech
    the first unit, for chat audio the first text token) and latency_ms."""
    times = {}
    for line in log_path.read_text(errors="replace").splitlines():
        m = _ACCESS.search(line)
        if m:
            times[m.group(3)] = (float(m.group(1)) / 1000, float(m.group(2)) / 1000)
    recs = [r for rs in (out.get("latency") or {}).values() for r in rs]
    recs += [r for run in (out.get("batching") or {}).get("runs", []) for r in run["records"]]
    for r in recs:
        if r.get("request_id") in times:
            r["server_ttft_s"], r["server_latency_s"] = times[r["request_id"]]
            if "text_pieces" in r and r["text_end_s"] is None:  # no text: it ended at its first token
                r["text_end_s"] = r["server_ttft_s"]


# ---- report ---------------------------------------------------------------------------------
def _vals(recs: list[dict[str, Any]], key: str) -> list[float]:
    return [r[key] for r in recs if "error" not in r and r.get(key) is not None]


def _first_vocoder(recs: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """(vocoder seconds of the first audio's chunks, chunks decoded by the first audio byte)."""
    secs, chunks = [], []
    for r in recs:
        v = r.get("vocoder_at_first_audio")
        if v and v["batches"]:
            secs.append(v["seconds"])
            chunks.append(v["batches"])
    return secs, chunks


def _later_chunk_s(recs: list[dict[str, Any]]) -> list[float]:
    """The vocoder's mean time per chunk after the first audio, per request."""
    out = []
    for r in recs:
        v, f = r.get("vocoder"), r.get("vocoder_at_first_audio")
        if v and f and v["batches"] > f["batches"]:
            out.append((v["seconds"] - f["seconds"]) / (v["batches"] - f["batches"]))
    return out


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f}"


def _p(values: list[float]) -> str:
    return f"{_ms(pct(values, 50))} / {_ms(pct(values, 90))}" if values else "-"


def summarize(server: dict[str, Any]) -> dict[str, Any]:
    lat = server.get("latency") or {}
    out: dict[str, Any] = {"first_units": server["first_units"]}
    for kind, recs in lat.items():
        s: dict[str, Any] = {"n": len(_vals(recs, "total_s")), "errors": sum("error" in r for r in recs)}
        for key in ("first_audio_s", "ttft_s", "server_ttft_s", "itl_s", "text_end_s", "text_pieces", "total_s",
                    "audio_s", "stalls", "stalled_s"):  # fmt: skip
            vals = _vals(recs, key)
            if vals:
                s[key] = {"p50": pct(vals, 50), "p90": pct(vals, 90), "n": len(vals)}
        secs, chunks = _first_vocoder(recs)
        if secs:
            s["vocoder_first_s"] = {"p50": pct(secs, 50), "p90": pct(secs, 90)}
            s["chunks_by_first_audio"] = {"p50": pct(chunks, 50), "max": max(chunks)}
        later = _later_chunk_s(recs)
        if later:
            s["vocoder_later_chunk_s"] = {"p50": pct(later, 50), "p90": pct(later, 90)}
        ok = [r for r in recs if "error" not in r and r.get("audio_s")]
        if ok:
            s["audio_s_per_wall_s"] = pct([r["audio_s"] / r["total_s"] for r in ok], 50)
        out[kind] = s
    return out


def tables(servers: list[dict[str, Any]], summaries: list[dict[str, Any]], load: LoadSampler) -> str:
    lines = ["First audio byte, ms (median / p90), one request at a time:", "",
             "| first-chunk units | speech pcm | speech mp3 | speech sse (pcm) | chat audio (pcm16) | load (1 min) |",
             "|---:|---:|---:|---:|---:|---|"]  # fmt: skip
    for s in summaries:
        f = s["first_units"]
        latency = next(x for x in servers if x["first_units"] == f).get("latency", {})
        cells = [_p(_vals(latency.get(k, []), "first_audio_s")) for k in ("speech_pcm", "speech_mp3", "speech_sse",
                                                                         "chat_audio")]  # fmt: skip
        ld = load.summary(f"latency-{f}")
        lines.append(f"| {f} | " + " | ".join(cells) + f" | {_load(ld)} |")
    lines += ["", "First audio, split (medians, ms): the first unit token (the server's ttft_ms for this request; "
              "the same prompt as a plain text stream, speech_text, for comparison), the first chunk's other units "
              "(units - 1 decode steps at speech_text's per-token time), the vocoder (/metrics at the first byte), "
              "the rest (encoding, routing, HTTP):", "",
              "| first-chunk units | kind | text TTFT | first unit | per-token | + (units - 1) steps | vocoder "
              "| chunks by first byte | rest | = first audio (measured) |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s in summaries:
        f = s["first_units"]
        text = s.get("speech_text", {})
        ttft, itl = _g(text, "ttft_s"), _g(text, "itl_s")
        steps = (f - 1) * itl if itl is not None else None
        for kind in ("speech_pcm", "speech_mp3", "speech_sse"):
            k = s.get(kind, {})
            unit, voc, first = _g(k, "server_ttft_s"), _g(k, "vocoder_first_s"), _g(k, "first_audio_s")
            rest = None
            if first is not None and unit is not None and steps is not None and voc is not None:
                rest = first - unit - steps - voc
            chunks = (k.get("chunks_by_first_audio") or {}).get("p50")
            lines.append(f"| {f} | {kind} | {_ms(ttft)} | {_ms(unit)} | {_ms(itl)} | {_ms(steps)} | {_ms(voc)} | "
                         f"{'-' if chunks is None else f'{chunks:g}'} | {_ms(rest)} | {_ms(first)} |")  # fmt: skip
    lines += ["", "Chat with audio, split (medians, ms): the text first (its transcript), then a continuation "
              "speaks it. First tokens from the server's ttft_ms; the text's end is its last transcript piece (its "
              "first token where the text is empty):", "",
              "| first-chunk units | chat_text first token | chat_audio first token | text pieces | text end "
              "| vocoder, first chunk | first audio | first audio - text end |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s in summaries:
        ct, ca = s.get("chat_text", {}), s.get("chat_audio", {})
        end, fa = _g(ca, "text_end_s"), _g(ca, "first_audio_s")
        gap = fa - end if fa is not None and end is not None else None
        lines.append(f"| {s['first_units']} | {_ms(_g(ct, 'server_ttft_s'))} | {_ms(_g(ca, 'server_ttft_s'))} | "
                     f"{_f(_g(ca, 'text_pieces'), '.0f')} | {_ms(end)} | {_ms(_g(ca, 'vocoder_first_s'))} | "
                     f"{_ms(fa)} | {_ms(gap)} |")  # fmt: skip
    lines += ["", "Keeping up (pcm streams; medians):", "",
              "| first-chunk units | kind | audio (s) | total (s) | audio s per wall s | stalls (p50/p90) | "
              "stalled s (p90) | vocoder ms per later chunk (25 units = 1 s) |",
              "|---:|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for s in summaries:
        for kind in ("speech_pcm", "speech_sse", "chat_audio"):
            k = s.get(kind, {})
            st = k.get("stalls") or {}
            later = _g(k, "vocoder_later_chunk_s")
            lines.append(
                f"| {s['first_units']} | {kind} | {_f(_g(k, 'audio_s'))} | {_f(_g(k, 'total_s'))} | "
                f"{_f(k.get('audio_s_per_wall_s'))} | {_f(st.get('p50'), '.0f')}/{_f(st.get('p90'), '.0f')} | "
                f"{_f((k.get('stalled_s') or {}).get('p90'))} | {_ms(later)} |"
            )
    batching = next((x["batching"] for x in servers if "batching" in x), None)
    if batching:
        lines += ["", f"Batching: {len(batching['seeds'])} speech requests, pcm streamed, max_units "
                  f"{batching['units']} (answers of {batching['probe']['chosen_units']} units):", "",
                  "| mode | repeat | wall (s) | audio (s) | audio s per wall s | first byte p50 / p90 (ms) | "
                  "stalls | vocoder batches | streams per batch | batch sizes | vocoder ms per batch | "
                  "load before / after |",
                  "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]  # fmt: skip
        for r in batching["runs"]:
            v = r["vocoder"] or {}
            sizes = ", ".join(f"{k}: {n:g}" for k, n in (v.get("batch_sizes") or {}).items()) or "-"
            fa = r["first_audio_s"]
            lines.append(
                f"| {r['mode']} | {r['repeat']} | {r['wall_s']:.1f} | {r['audio_s']:.1f} | "
                f"{r['audio_s_per_wall_s']:.2f} | {_ms(fa['p50'])} / {_ms(fa['p90'])} | {r['stalls']} | "
                f"{_f(v.get('batches'), '.0f')} | {_f(v.get('streams_per_batch'))} | {sizes} | "
                f"{_ms(v.get('batch_s_mean'))} | {' / '.join(x[0] for x in r['loadavg_before_after'])} |"
            )
        b = batching_summary(batching)
        if b:
            lines += ["", f"Concurrent against sequential (medians over repeats): wall {b['wall_ratio']:.2f}x, "
                      f"throughput {b['throughput_ratio']:.2f}x, first byte p50 {b['first_audio_ratio']:.2f}x."]
    return "\n".join(lines)


def batching_summary(batching: dict[str, Any]) -> dict[str, float] | None:
    by_mode: dict[str, dict[str, list[float]]] = {}
    for r in batching["runs"]:
        m = by_mode.setdefault(r["mode"], {"wall": [], "throughput": [], "first": []})
        m["wall"].append(r["wall_s"])
        m["throughput"].append(r["audio_s_per_wall_s"])
        if r["first_audio_s"]["p50"] is not None:
            m["first"].append(r["first_audio_s"]["p50"])
    seq, conc = by_mode.get("sequential"), by_mode.get("concurrent")
    if not seq or not conc or not seq["first"] or not conc["first"]:
        return None
    med = statistics.median
    return {
        "wall_ratio": med(conc["wall"]) / med(seq["wall"]),
        "throughput_ratio": med(conc["throughput"]) / med(seq["throughput"]),
        "first_audio_ratio": med(conc["first"]) / med(seq["first"]),
    }


def _g(s: dict[str, Any], key: str) -> float | None:
    return (s.get(key) or {}).get("p50")


def _f(x: float | None, spec: str = ".2f") -> str:
    return "-" if x is None else format(x, spec)


def _load(ld: dict[str, float] | None) -> str:
    return "-" if ld is None else f"{ld['min']:.1f}-{ld['max']:.1f} (median {ld['median']:.1f})"


# ---- main -----------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--first-units", default="3,4,8", help="--audio-first-chunk-units values, one server each")
    p.add_argument("--requests", type=int, default=10, help="measured rounds (one request of every kind each)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured rounds first")
    p.add_argument("--latency-units", type=int, default=50, help="max_units of the latency phase's speech")
    p.add_argument("--chat-tokens", type=int, default=60, help="max_tokens of the chat requests (text + units)")
    p.add_argument("--text-tokens", type=int, default=12, help="max_tokens of speech_text (TTFT, per-token time)")
    p.add_argument("--end-bias", type=float, default=6.0, help="logit bias on <|im_end|> in the chat requests")
    p.add_argument("--skip-batching", action="store_true")
    p.add_argument("--batch-first-units", type=int, default=4, help="the server the batching phase runs on")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--batch-units", type=int, default=100, help="max_units of each batched speech request")
    p.add_argument("--batch-repeats", type=int, default=2, help="sequential and concurrent runs each")
    p.add_argument("--max-probes", type=int, default=96, help="seeds tried to find full-length answers")
    p.add_argument("--with-image-output", action="store_true", help="do not pass --no-image-output")
    p.add_argument("--server-arg", action="append", default=[], help="one more omni-serve argument: --server-arg=--x=y")
    p.add_argument("--request-timeout", type=float, default=300.0)
    p.add_argument("--start-timeout", type=float, default=600.0)
    p.add_argument("--out", type=Path, help="JSON path (default bench/results/audio-<UTC time>.json)")
    args = p.parse_args(argv)
    args.first_units = [int(x) for x in args.first_units.split(",") if x]
    if min(args.first_units) < 3:
        p.error("--first-units must be at least 3 (the server's least)")
    return args


def _raise_on_sigterm(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _raise_on_sigterm)  # so each server's finally stops it
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    load = LoadSampler()
    load.start()
    t0 = time.perf_counter()
    servers = []
    order = sorted(args.first_units, key=lambda f: f == args.batch_first_units)  # the batching server last
    try:
        for f in order:
            servers.append(run_server(f, args, load, stamp))
    finally:
        load.stop()
    servers.sort(key=lambda s: s["first_units"])
    summaries = [summarize(s) for s in servers]
    report = {
        "schema": SCHEMA, "time_utc": stamp,
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "versions": versions(), "cpu": _cpu_name(), "total_s": time.perf_counter() - t0,
        "loadavg": {"by_phase": {ph: load.summary(ph) for ph in sorted({s["phase"] for s in load.samples})},
                    "samples": load.samples},
        "summaries": summaries,
        "batching_summary": next((batching_summary(x["batching"]) for x in servers if "batching" in x), None),
        "servers": servers,
    }  # fmt: skip
    text = tables(servers, summaries, load)
    report["tables"] = text
    out = args.out or RESULTS / f"audio-{stamp}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print("\n" + text + "\n")
    print(f"load average (1 min) over the run: {_load(load.summary(''))}; total {report['total_s']:.0f} s")
    print(f"wrote {out}")
    return 1 if any("error" in s for s in servers) else 0


def _cpu_name() -> str | None:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


if __name__ == "__main__":
    sys.exit(main())
