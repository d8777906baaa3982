#!/usr/bin/env python3
"""First-audio latency of the Realtime API (issue 25, acceptance 1b): the time from server VAD's
input_audio_buffer.speech_stopped to the response's first response.output_audio.delta, over
--turns turns of one conversation, on the embedded default (the tiny omni checkpoint) on this CPU.
Target: p90 under 500 ms. Run it on a quiet machine: nothing else may use the CPU meanwhile.

Starts `bin/omni-serve` (no --model, --no-image-output) on a free port, or uses --base-url: the
embedded default, the published-layout checkpoint that speaks the reference's dialect. --no-bias
asks as a voice client does (no bias: first audio then waits for the random text to end).
Sessions of --turns-per-session turns each (server VAD, silence_duration_ms --silence-ms, input transcription on unless
--no-transcription, a logit bias on <|im_end|> so the random model's text ends within a few
tokens and then it speaks; later turns find the earlier ones in the prefix cache); --warmup turns unmeasured, then --turns turns. Each turn sends the
espeak-ng clip (about 2.2 s and 0.8 s of silence, its own +-2 LSB dither so no turn's audio is
a cache hit) in --chunk-ms appends paced in real time and waits for response.done.

Per turn, from speech_stopped as the client received it: response.created, the first transcript
delta, the last transcript delta before the audio (the text's end: the spoken answer is the
text, spoken after it), the first audio delta; and the server's own figure for the same span
(omni_realtime_first_audio_seconds' growth, measured from the moment it detected the stop).
Prints the per-turn table, p50/p90, and an ASCII bar chart for docs/REALTIME.md.

Then --barge-ins times (acceptance 1e: within 250 ms): a long spoken answer (no bias) is under
way (its first audio delta received) when the clip is sent in real time; from speech_started to
response.done (status cancelled), as the client receives them.

    PYTHONPATH=. .venv/bin/python bench/realtime_latency.py
    PYTHONPATH=. .venv/bin/python bench/realtime_latency.py --turns 3 --warmup 1     # a quick check
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from realtime_load import (
    MODEL,
    TEXT,
    Turn,
    clip_pcm16,
    configure,
    connect,
    dithered,
    im_end_bias,
    read_metrics,
    read_turn,
    send_audio,
    speak,
    started_server,
)

FIRST_AUDIO_SUM = "omni_realtime_first_audio_seconds_sum"


def _ms(t: float | None, t0: float | None) -> float | None:
    return None if t is None or t0 is None else (t - t0) * 1000


async def run(base: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    pcm = clip_pcm16(args.text)
    bias = {} if args.no_bias else im_end_bias(base, args.model)
    rows: list[dict[str, Any]] = []
    total = args.warmup + args.turns
    for first in range(0, total, args.turns_per_session):
        rows += await session(base, args, pcm, bias, range(first, min(first + args.turns_per_session, total)))
    if args.barge_ins:
        rows.append({"barge_in_ms": await barge_ins(base, args, pcm)})
    return rows


async def session(base: str, args: argparse.Namespace, pcm: bytes, bias: dict[str, float], turns: range) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    async with connect(base, args.model) as conn:
        await configure(conn, bias, silence_ms=args.silence_ms, transcribe=not args.no_transcription,
                        max_output_tokens=args.max_output_tokens)  # fmt: skip
        for i in turns:
            before = (await asyncio.to_thread(read_metrics, base)).get(FIRST_AUDIO_SUM, 0.0)
            turn: Turn = await speak(conn, dithered(pcm, i), chunk_ms=args.chunk_ms)
            await asyncio.sleep(0.3)  # the transcription's events, and the metric, settle
            after = (await asyncio.to_thread(read_metrics, base)).get(FIRST_AUDIO_SUM, 0.0)
            if i < args.warmup:
                continue
            t0 = turn.speech_stopped
            usage = turn.usage or {}
            rows.append({
                "turn": i - args.warmup + 1, "status": turn.status, "errors": turn.errors,
                "first_audio_ms": _ms(turn.first_audio, t0), "created_ms": _ms(turn.created, t0),
                "first_text_ms": _ms(turn.first_text, t0), "text_end_ms": _ms(turn.text_end, t0),
                "server_first_audio_ms": (after - before) * 1000,
                "input_tokens": usage.get("input_tokens"),
                "cached_tokens": (usage.get("input_token_details") or {}).get("cached_tokens"),
                "audio_s": turn.audio_samples / 24000,
            })  # fmt: skip
    return rows


async def barge_ins(base: str, args: argparse.Namespace, pcm: bytes) -> list[float]:
    """ms from speech_started to the cancelled response.done, per barge-in."""
    out: list[float] = []
    async with connect(base, args.model) as conn:
        await configure(conn, {}, silence_ms=args.silence_ms, create_response=False, interrupt_response=True)
        for i in range(args.barge_ins):
            await conn.send({"type": "conversation.item.create", "item": {"type": "message", "role": "user",
                                                                         "content": [{"type": "input_text", "text": "Talk."}]}})  # fmt: skip
            await conn.send({"type": "response.create", "response": {"max_output_tokens": 1500}})
            turn = Turn()
            await read_turn(conn, turn, until="response.output_audio.delta")
            sender = asyncio.create_task(send_audio(conn, dithered(pcm, 1000 + i), chunk_ms=args.chunk_ms))
            await asyncio.wait_for(read_turn(conn, turn), 300)
            await sender
            if "input_audio_buffer.committed" not in turn.kinds:  # the user's turn, kept; no response follows
                await asyncio.wait_for(read_turn(conn, turn, until="input_audio_buffer.committed"), 300)
            if turn.status == "cancelled" and turn.speech_started is not None and turn.done is not None:
                out.append((turn.done - turn.speech_started) * 1000)
            else:
                print(f"[realtime-latency] barge-in {i}: status {turn.status}, speech started: {turn.speech_started}")
    return out


def _f(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def report(rows: list[dict[str, Any]]) -> str:
    lines = ["turn  status     first audio  created  first text  text end  server  prompt (cached)  audio s",
             "                  ms after speech_stopped (client)          ms"]  # fmt: skip
    cuts = [r["barge_in_ms"] for r in rows if "barge_in_ms" in r]
    rows = [r for r in rows if "turn" in r]
    for r in rows:
        lines.append(
            f"{r['turn']:>4}  {r['status']!s:<9}  {_f(r['first_audio_ms']):>11}  {_f(r['created_ms']):>7}  "
            f"{_f(r['first_text_ms']):>10}  {_f(r['text_end_ms']):>8}  {_f(r['server_first_audio_ms']):>6}  "
            f"{r['input_tokens']!s:>6} ({r['cached_tokens']!s:>5})  {r['audio_s']:7.2f}"
        )
    firsts = [r["first_audio_ms"] for r in rows if r["first_audio_ms"] is not None]
    if firsts:
        lines.append(f"\nfirst audio after speech_stopped over {len(firsts)} turns: "
                     f"p50 {np.percentile(firsts, 50):.0f} ms, p90 {np.percentile(firsts, 90):.0f} ms, "
                     f"max {max(firsts):.0f} ms (target: p90 < 500 ms)")  # fmt: skip
        scale = max(max(firsts), 500) / 50
        lines.append("\n```")
        for r in rows:
            ms = r["first_audio_ms"]
            bar = "#" * round(ms / scale) if ms is not None else "(none)"
            lines.append(f"turn {r['turn']:>2} {_f(ms):>5} ms |{bar}")
        lines.append(f"{'':>14} 500 ms at column {round(500 / scale)}")
        lines.append("```")
    if cuts and cuts[0]:
        lines.append(f"\nbarge-in, speech_started to response.done cancelled: {', '.join(f'{x:.1f}' for x in cuts[0])} ms "
                     f"(max {max(cuts[0]):.1f} ms; target: 250 ms)")  # fmt: skip
    bad = [r for r in rows if r["status"] != "completed" or r["errors"]]
    if bad:
        lines.append(f"\n{len(bad)} turns not completed or with errors: {[(r['turn'], r['status'], r['errors']) for r in bad]}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--turns", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--turns-per-session", type=int, default=5,
                   help="turns of one conversation; then a new session (each turn adds its audio to the prompt)")
    p.add_argument("--silence-ms", type=int, default=400, help="server VAD's silence_duration_ms")
    p.add_argument("--max-output-tokens", type=int, default=200)
    p.add_argument("--chunk-ms", type=int, default=20)
    p.add_argument("--barge-ins", type=int, default=5, help="barge-ins timed after the turns (0: none)")
    p.add_argument("--no-transcription", action="store_true", help="leave input_audio_transcription off")
    p.add_argument("--no-bias", action="store_true",
                   help="no logit bias on <|im_end|>, as a voice client asks: the text runs to its share of "
                        "--max-output-tokens (or ends) before the speech")  # fmt: skip
    p.add_argument("--text", default=TEXT)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--base-url", help="a running server instead of starting one")
    p.add_argument("--server-arg", action="append", default=[], help="an extra omni-serve argument (repeatable)")
    p.add_argument("--json", type=Path, help="also write the rows here")
    args = p.parse_args(argv)
    if args.base_url:
        rows = asyncio.run(run(args.base_url.rstrip("/"), args))
    else:
        with started_server("realtime-latency", args.server_arg) as (base, _):
            rows = asyncio.run(run(base, args))
    print(report(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
