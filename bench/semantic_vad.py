#!/usr/bin/env python3
"""semantic_vad against server_vad on espeak-ng clips (issue 37, acceptance 6): how many turns
each cuts off at a mid-sentence pause, and how long each waits after a finished sentence.

The clips: SENTENCES, each an unfinished start ("I would like to book a table for") and its end
("two people tonight"), spoken by espeak-ng at 24 kHz (leading and trailing quiet trimmed):

  pause clips     300 ms of quiet, the start, a pause of 300 to 800 ms (PAUSES_MS, each sentence
                  at each), the end, then 9 s of quiet
  finished clips  the whole sentence in one breath, then 9 s of quiet
  sentence starts SENTENCE_STARTS' pause clips, whose starts are whole requests themselves ("Call
                  my mother", then "tomorrow morning"): no words tell more is coming, and semantic
                  VAD is expected to end those turns at the pause as server VAD does at long ones

The detectors are the server's own (omni/serving/realtime/turn_detection.py) on the server's
own voice activity model (Silero through omni/modalities/inputs/voice_activity.py, 24 kHz taken
to 8 kHz as the session does), window by window on the clip's timeline:

  server_vad        silence_duration_ms 500, threshold 0.5 (OpenAI's defaults, and ours)
  semantic_vad      each eagerness; at each Pause the words said so far are scored by the served
                    model (end_of_turn.py's question, asked over HTTP: /tokenize renders the
                    user message, /v1/completions reads its prompt logprobs); the score counts as
                    arriving when the request's wall time has passed on the clip's timeline
  semantic_vad, no transcript   each eagerness's unscored window (no transcription in the session)

The words said so far are the script's (the start, or the whole sentence once the end has been
spoken): an exact transcript, so this measures the turn decision, not a transcriber's errors;
in a session, the served model transcribes the speech so far first, and that time adds to each
check's.

A cut-off: a turn that stops before the sentence's end began. Latency: from the end of the
sentence's speech to the stop of the turn that holds it (the audio a client sends in real time,
so a score's wall time counts). The scorer is SmolLM2-135M-Instruct (served from its GGUF,
gpu_workers/tiny/smollm2.py), a trained chat model small enough for this CPU: on the tiny
random checkpoint any P(end) is noise.

    PYTHONPATH=. .venv/bin/python bench/semantic_vad.py            # starts a SmolLM2 server
    PYTHONPATH=. .venv/bin/python bench/semantic_vad.py --base http://127.0.0.1:8000 --model smollm2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from omni.modalities.inputs.voice_activity import WINDOW_MS, VoiceActivityModel  # noqa: E402
from omni.serving.realtime.end_of_turn import TOP, end_probability, spoken, through_user_end  # noqa: E402
from omni.serving.realtime.turn_detection import (  # noqa: E402
    EAGERNESS,
    Pause,
    SemanticTurnDetector,
    SpeechStopped,
    TurnDetector,
)
from omni.shared.media.decimator import Decimator  # noqa: E402

RATE = 24000
LEAD_MS, TAIL_MS = 300, 9000
PAUSES_MS = (300, 400, 500, 600, 700, 800)
SENTENCES = [
    ("I would like to book a table for", "two people tonight"),
    ("What is the capital of", "France"),
    ("Can you tell me how to get to", "the train station"),
    ("My favorite color is", "blue"),
    ("Could you remind me to call", "my mother tomorrow morning"),
    ("The meeting has been moved to", "next Thursday afternoon"),
    ("I need a recipe that uses", "chicken and rice"),
    ("Please turn off the lights in", "the living room"),
    ("How long does it take to drive from", "Boston to New York"),
    ("I was thinking that we could", "go to the beach this weekend"),
    ("What time does the", "pharmacy close today"),
    ("Set a timer for", "twenty minutes"),
    ("Tell me a story about", "a brave little dragon"),
    ("Send a message to Sarah saying that", "I will be late"),
    ("I am looking for a hotel near", "the airport"),
    ("Can you translate the phrase", "good morning into Spanish"),
    ("Remind me to buy", "milk and eggs"),
    ("Play some music by", "the Beatles"),
    ("How many calories are in", "a banana"),
    ("I think the best way to learn a language is", "to speak it every day"),
]
# starts that are whole requests themselves: nothing in the words says more is coming
SENTENCE_STARTS = [
    ("Call my mother", "tomorrow morning"),
    ("Turn on the lights", "in the kitchen"),
    ("Book a table", "for two people"),
    ("Tell me a joke", "about cats"),
    ("Play some music", "by the Beatles"),
]


# ---------------------------------------------------------------- clips


def speech(text: str) -> np.ndarray:
    """espeak-ng's speech of text at 24 kHz, its leading and trailing quiet trimmed."""
    from tests.e2e.audio import spoken as espeak

    x = espeak(text, RATE)
    if x is None:
        raise RuntimeError("espeak-ng is not installed")
    loud = np.flatnonzero(np.abs(x) > 0.01)
    return x[loud[0] : loud[-1] + 1]


def quiet(ms: int) -> np.ndarray:
    return np.zeros(ms * RATE // 1000, np.float32)


@dataclass
class Clip:
    kind: str  # "pause", "sentence start" (a pause clip of SENTENCE_STARTS) or "finished"
    start: str  # the words before the pause (the whole sentence for a finished clip)
    end: str  # the words after it ("" for a finished clip)
    pause_ms: int | None
    audio: np.ndarray
    start_end_ms: int  # where the start's speech ends
    end_begins_ms: int  # where the end's speech begins (the start's end for a finished clip)
    speech_end_ms: int  # where the sentence's speech ends

    def said(self, at_ms: int) -> str:
        return self.start if at_ms < self.end_begins_ms or not self.end else f"{self.start} {self.end}"


def _ms(x: np.ndarray) -> int:
    return len(x) * 1000 // RATE


def clips() -> list[Clip]:
    out = []
    for kind, sentences in (("pause", SENTENCES), ("sentence start", SENTENCE_STARTS)):
        for start, end in sentences:
            a, b = speech(start), speech(end)
            for pause in PAUSES_MS:
                audio = np.concatenate([quiet(LEAD_MS), a, quiet(pause), b, quiet(TAIL_MS)])
                a_end = LEAD_MS + _ms(a)
                out.append(Clip(kind, start, end, pause, audio, a_end, a_end + pause, a_end + pause + _ms(b)))
    for start, end in SENTENCES:
        whole = f"{start} {end}"
        x = speech(whole)
        end_ms = LEAD_MS + _ms(x)
        out.append(Clip("finished", whole, "", None, np.concatenate([quiet(LEAD_MS), x, quiet(TAIL_MS)]),
                        end_ms, end_ms, end_ms))  # fmt: skip
    return out


def probabilities(vad: VoiceActivityModel, audio: np.ndarray) -> list[float]:
    """The session's path: 24 kHz -> 8 kHz through its decimator, then Silero, 20 ms at a time."""
    stream, decimator = vad.stream(), Decimator(3)
    step = RATE // 50
    probs: list[float] = []
    for i in range(0, len(audio), step):
        probs += stream.push(decimator.push(audio[i : i + step].astype(np.float32)))
    return probs


# ---------------------------------------------------------------- the scorer, over HTTP


class Scorer:
    """end_of_turn.py's question over HTTP, each text's answer kept with its wall time (the best of
    `repeat` asks: this machine is shared)."""

    def __init__(self, base: str, model: str, repeat: int) -> None:
        self.http = httpx.Client(base_url=base, timeout=120)
        self.model = model
        self.repeat = repeat
        end = self.http.post("/tokenize", json={"model": model, "prompt": "<|im_end|>", "add_special_tokens": False})
        self.end_ids = frozenset(end.json()["tokens"])
        self.seen: dict[str, tuple[float, float]] = {}

    def __call__(self, text: str) -> tuple[float, float]:
        """(P(end), seconds) for the user's words so far."""
        if text not in self.seen:
            self.seen[text] = min((self._ask(text) for _ in range(self.repeat)), key=lambda r: r[1])
        return self.seen[text]

    def _ask(self, text: str) -> tuple[float, float]:
        messages = [{"role": "user", "content": spoken(text)}]
        t0 = time.perf_counter()
        rendered = self.http.post("/tokenize", json={"model": self.model, "messages": messages,
                                                     "add_generation_prompt": False}).json()["tokens"]  # fmt: skip
        prompt = through_user_end(rendered, self.end_ids)
        body = {"model": self.model, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": TOP}
        reply = self.http.post("/v1/completions", json=body)
        seconds = time.perf_counter() - t0
        reply.raise_for_status()
        last = reply.json()["choices"][0]["prompt_logprobs"][-1]
        token_id = prompt[-1]
        words = {int(k): v["decoded_token"] for k, v in last.items()}
        top = [(int(k), v["logprob"]) for k, v in last.items()]
        return end_probability(last[str(token_id)]["logprob"], top, self.end_ids, words.__getitem__), seconds


# ---------------------------------------------------------------- the turns


@dataclass
class Outcome:
    cut: bool  # a turn stopped before the sentence's end began
    latency_ms: int | None  # the sentence's turn: its stop after the speech ended (None: never stopped)
    checks: int = 0  # pauses scored


def run(detector: TurnDetector, probs: list[float], clip: Clip, scorer: Scorer | None) -> Outcome:
    """The detector over the clip, window by window; a Pause's score arrives once its wall time
    has passed on the clip's timeline."""
    stops: list[int] = []
    pending: list[tuple[int, int, float]] = []  # (due_ms, silence_from_ms, p_end)
    checks = 0

    def handle(events: list) -> None:  # type: ignore[type-arg]
        nonlocal checks
        for e in events:
            if isinstance(e, SpeechStopped):
                stops.append(e.audio_end_ms)
            elif isinstance(e, Pause):
                assert scorer is not None
                checks += 1
                p, seconds = scorer(clip.said(e.at_ms))
                pending.append((e.at_ms + int(seconds * 1000), e.silence_from_ms, p))

    for i, p in enumerate(probs):
        begin = i * WINDOW_MS
        for due in [x for x in pending if x[0] <= begin]:
            pending.remove(due)
            assert isinstance(detector, SemanticTurnDetector)
            handle(detector.score(due[1], due[2]))
        handle(detector.push([p], begin))
    cut = any(s < clip.end_begins_ms for s in stops) if clip.end else False
    final = [s for s in stops if s >= clip.speech_end_ms]
    return Outcome(cut, final[0] - clip.speech_end_ms if final else None, checks)


DETECTORS = [("server_vad (500 ms)", "", False)]  # (name, eagerness, scored); "": server VAD
DETECTORS += [(f"semantic_vad {e}", e, True) for e in ("high", "medium", "low")]
DETECTORS += [(f"semantic_vad {e}, no transcript", e, False) for e in ("high", "medium", "low")]


def new(eagerness: str, scored: bool) -> TurnDetector:
    if not eagerness:
        return TurnDetector(0.5, 500, WINDOW_MS)
    return SemanticTurnDetector(EAGERNESS[eagerness], 0.5, WINDOW_MS, scoring=scored)


def pct(values: list[int], q: float) -> int:
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def measure(scorer: Scorer) -> list[dict[str, object]]:
    vad = VoiceActivityModel()
    all_clips = clips()
    probs = [probabilities(vad, c.audio) for c in all_clips]
    rows = []
    for name, eagerness, scored in DETECTORS:
        outcomes = [run(new(eagerness, scored), pr, c, scorer if scored else None) for c, pr in zip(all_clips, probs)]
        paused = [o for o, c in zip(outcomes, all_clips) if c.kind == "pause"]
        starts = [o for o, c in zip(outcomes, all_clips) if c.kind == "sentence start"]
        finished = [o for o, c in zip(outcomes, all_clips) if c.kind == "finished"]
        by_pause = {ms: sum(o.cut for o, c in zip(outcomes, all_clips) if c.kind == "pause" and c.pause_ms == ms)
                    for ms in PAUSES_MS}  # fmt: skip
        lat = [o.latency_ms for o in outcomes if o.latency_ms is not None]
        rows.append({
            "detector": name,
            "cut_offs": sum(o.cut for o in paused), "pause_clips": len(paused), "cut_by_pause_ms": by_pause,
            "sentence_start_cut_offs": sum(o.cut for o in starts), "sentence_start_clips": len(starts),
            "never_stopped": sum(o.latency_ms is None for o in outcomes),
            "latency_ms_p50": statistics.median(lat) if lat else None, "latency_ms_p90": pct(lat, 0.9) if lat else None,
            "latency_ms_max": max(lat) if lat else None,
            "finished_latency_ms_p50": statistics.median([o.latency_ms for o in finished if o.latency_ms is not None]),
            "checks": sum(o.checks for o in outcomes),
        })  # fmt: skip
    return rows


def table(rows: list[dict[str, object]], scorer: Scorer) -> str:
    lines = ["| detector | cut-offs (pause clips) | by pause 300/400/500/600/700/800 ms | cut-offs (sentence starts) "
             "| latency p50 / p90 / max (all clips) | finished clips p50 |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in rows:
        by = "/".join(str(v) for v in r["cut_by_pause_ms"].values())  # type: ignore[attr-defined]
        lines.append(f"| {r['detector']} | {r['cut_offs']} / {r['pause_clips']} | {by} | "
                     f"{r['sentence_start_cut_offs']} / {r['sentence_start_clips']} | {r['latency_ms_p50']:.0f} / "
                     f"{r['latency_ms_p90']} / {r['latency_ms_max']} ms | {r['finished_latency_ms_p50']:.0f} ms |")  # fmt: skip
    secs = sorted(s for _, s in scorer.seen.values())
    lines.append(f"\nscoring: {len(secs)} distinct texts, wall time p50 {statistics.median(secs) * 1000:.0f} ms, "
                 f"max {max(secs) * 1000:.0f} ms")  # fmt: skip
    return "\n".join(lines)


@contextmanager
def smollm2_server() -> Iterator[str]:
    from gpu_workers.tiny.smollm2 import smollm2_gguf
    from tests.e2e.server import running_server

    with running_server("--model", f"smollm2={smollm2_gguf()}", "--max-model-len", "2048",
                        "--kv-cache-memory", str(64 << 20), timeout=300) as base:  # fmt: skip
        yield base


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base", help="a running server (else one serving SmolLM2 is started)")
    p.add_argument("--model", default="smollm2")
    p.add_argument("--repeat", type=int, default=2, help="asks per distinct text; the fastest one's time counts")
    p.add_argument("--json", type=Path, help="write the rows and every score here")
    p.add_argument("--scores", action="store_true", help="print P(end) of each start and whole sentence")
    args = p.parse_args(argv)
    with smollm2_server() if args.base is None else _given(args.base) as base:
        scorer = Scorer(base, args.model, args.repeat)
        for text in [s for s, _ in SENTENCES + SENTENCE_STARTS] + [f"{s} {e}" for s, e in SENTENCES + SENTENCE_STARTS]:
            scorer(text)
        if args.scores:
            for text, (pe, secs) in scorer.seen.items():
                print(f"{pe:6.3f} {secs * 1000:5.0f} ms  {text}")
        rows = measure(scorer)
    print(table(rows, scorer))
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "scores": scorer.seen}, indent=1))


@contextmanager
def _given(base: str) -> Iterator[str]:
    yield base


if __name__ == "__main__":
    main()
