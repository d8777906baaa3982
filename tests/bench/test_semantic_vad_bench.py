"""bench/semantic_vad.py's accounting on scripted probabilities (32 ms windows) and a scripted
scorer: what counts as a cut-off, and that a score's wall time delays the stop on the clip's
timeline. No audio, no server, no timing."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]


def _load_bench() -> Any:
    spec = importlib.util.spec_from_file_location("semantic_vad_bench", ROOT / "bench" / "semantic_vad.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


sv = _load_bench()
S, Q = 0.9, 0.05


class Scorer:
    """P(end) 0.5 for the whole sentence, 0 for its start; each answer takes 0.1 s."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def __call__(self, text: str) -> tuple[float, float]:
        self.asked.append(text)
        return (0.5 if text.endswith("end") else 0.0), 0.1


def _clip() -> tuple[Any, list[float]]:
    # speech 0..320 ms, a 640 ms pause (320..960), speech 960..1280, then quiet to 9600
    probs = [S] * 10 + [Q] * 20 + [S] * 10 + [Q] * 260
    clip = sv.Clip("pause", "the start", "the end", 640, np.zeros(0), 320, 960, 1280)
    return clip, probs


def test_server_vad_cuts_the_pause_and_its_latency_is_the_silence_window() -> None:
    clip, probs = _clip()
    out = sv.run(sv.new("", False), probs, clip, None)
    # quiet from 320: 500 ms of it at the end of the window ending at 832, before the end began (960)
    assert out.cut
    assert out.latency_ms == 1792 - 1280  # the second turn: quiet from 1280, stopped at 1792
    assert out.checks == 0


def test_semantic_vad_waits_through_the_pause_and_its_score_time_counts() -> None:
    clip, probs = _clip()
    scorer = Scorer()
    out = sv.run(sv.new("medium", True), probs, clip, scorer)
    assert not out.cut
    assert scorer.asked == ["the start", "the start the end"]
    # the second pause: quiet from 1280, asked at 1280 + 320 = 1600, its score due 100 ms later:
    # applied before the window that begins at 1728 (the first at or after 1700), so the stop is at 1728
    assert out.latency_ms == 1728 - 1280
    assert out.checks == 2
