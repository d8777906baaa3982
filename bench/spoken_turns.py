#!/usr/bin/env python3
"""Audio whenever audio is asked for, on the default that `bin/omni-serve` serves (issue 37,
acceptance 4): the published-layout tiny checkpoint, which speaks the reference's dialect.

Starts `bin/omni-serve` (no --model; image output off) on a free port, or uses --base-url, then,
as a new user would ask, with no logit bias:

  realtime   one session of --turns turns (output_modalities ["audio"], server VAD, each turn
             the espeak-ng clip in real time; --input text sends each turn as an input_text item
             and response.create instead), max_output_tokens --max-output-tokens
  chat       --requests chat completions, modalities ["text", "audio"], max_tokens --max-tokens,
             seeds 0..N-1, reasoning skipped (chat_template_kwargs skip_reasoning, as a voice
             client asks)

Per turn or request: the status, the seconds of audio, the output tokens, any error. A turn
without audio is a failure (printed as such); the acceptance is N of N with audio.

    PYTHONPATH=. .venv/bin/python bench/spoken_turns.py                  # 20 turns, 20 requests
    PYTHONPATH=. .venv/bin/python bench/spoken_turns.py --turns 3 --requests 3
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realtime_load import MODEL, TEXT, Turn, clip_pcm16, connect, dithered, read_turn, speak, started_server

SAMPLE_RATE = 24000


async def realtime_turns(base: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    pcm = clip_pcm16(args.text) if args.input == "audio" else b""
    vad = {"type": "server_vad", "silence_duration_ms": 400} if args.input == "audio" else None
    rows: list[dict[str, Any]] = []
    async with connect(base, args.model) as conn:
        await conn.send({"type": "session.update", "session": {
            "type": "realtime", "output_modalities": ["audio"], "max_output_tokens": args.max_output_tokens,
            "audio": {"input": {"turn_detection": vad}}}})  # fmt: skip
        for i in range(args.turns):
            if args.input == "audio":
                turn = await speak(conn, dithered(pcm, i))
            else:
                await conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                 "content": [{"type": "input_text", "text": f"{args.text} ({i})"}]}})  # fmt: skip
                await conn.send({"type": "response.create"})
                turn = await asyncio.wait_for(read_turn(conn, Turn()), 300)
            usage = turn.usage or {}
            rows.append({"turn": i + 1, "status": turn.status, "audio_s": turn.audio_samples / SAMPLE_RATE,
                         "output_tokens": usage.get("output_tokens"), "input_tokens": usage.get("input_tokens"),
                         "errors": [e.get("message") for e in turn.errors]})  # fmt: skip
            print(f"[spoken-turns] realtime turn {i + 1}: {rows[-1]}", flush=True)
    return rows


def chat_request(base: str, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    body = {
        "model": args.model, "messages": [{"role": "user", "content": args.text}],
        "modalities": ["text", "audio"], "audio": {"voice": "alloy", "format": "pcm16"},
        "max_tokens": args.max_tokens, "seed": seed, "chat_template_kwargs": {"skip_reasoning": True},
    }  # fmt: skip
    req = urllib.request.Request(f"{base}/v1/chat/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            out = json.load(r)
    except urllib.error.HTTPError as e:
        return {"seed": seed, "status": e.code, "audio_s": 0.0, "errors": [e.read().decode()[:200]]}
    choice = out["choices"][0]
    audio = choice["message"].get("audio")
    samples = len(base64.b64decode(audio["data"])) // 2 if audio else 0
    return {"seed": seed, "status": choice["finish_reason"], "audio_s": samples / SAMPLE_RATE,
            "output_tokens": out["usage"]["completion_tokens"], "errors": []}  # fmt: skip


def summary(label: str, rows: list[dict[str, Any]]) -> str:
    spoken = [r["audio_s"] for r in rows if r["audio_s"] > 0]
    line = f"{label}: {len(spoken)} of {len(rows)} with audio"
    if spoken:
        line += (f"; audio per answer min {min(spoken):.2f} s, median {float(np.median(spoken)):.2f} s, "
                 f"max {max(spoken):.2f} s")  # fmt: skip
    silent = [r for r in rows if r["audio_s"] == 0]
    if silent:
        line += f"; without audio: {silent}"
    return line


def run(base: str, args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    result: dict[str, list[dict[str, Any]]] = {"realtime": [], "chat": []}
    if args.turns:
        result["realtime"] = asyncio.run(realtime_turns(base, args))
    for seed in range(args.requests):
        result["chat"].append(chat_request(base, args, seed))
        print(f"[spoken-turns] chat seed {seed}: {result['chat'][-1]}", flush=True)
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=20, help="realtime turns, one session")
    p.add_argument("--requests", type=int, default=20, help="chat requests, one seed each")
    p.add_argument("--input", choices=("audio", "text"), default="audio", help="each realtime turn spoken (VAD) or typed")
    p.add_argument("--max-output-tokens", type=int, default=200, help="the realtime session's")
    p.add_argument("--max-tokens", type=int, default=150, help="each chat request's")
    p.add_argument("--text", default=TEXT)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--base-url", help="a running server instead of starting one")
    p.add_argument("--server-arg", action="append", default=[], help="an extra omni-serve argument (repeatable)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    if args.base_url:
        result = run(args.base_url.rstrip("/"), args)
    else:
        with started_server("spoken-turns", args.server_arg) as (base, _):
            result = run(base, args)
    print(summary(f"realtime ({args.input} turns, one session)", result["realtime"]))
    print(summary("chat (modalities text+audio, reasoning skipped)", result["chat"]))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
