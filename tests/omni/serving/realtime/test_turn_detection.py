"""Server VAD's turns from scripted probabilities (32 ms windows): exact start and stop times."""

from __future__ import annotations

from omni.serving.realtime.turn_detection import SpeechStarted, SpeechStopped, TurnDetector


def test_speech_then_silence_gives_a_start_and_a_stop_that_includes_the_silence() -> None:
    d = TurnDetector(0.5, silence_duration_ms=96, window_ms=32)
    probs = [0.1, 0.2, 0.9, 0.95, 0.2, 0.1, 0.1, 0.1]
    # windows: 0..32 .. 224..256; speech at window 2 (64 ms); quiet from window 4 (128 ms), for
    # 96 ms at the end of window 6 (224 ms)
    assert d.push(probs, 0) == [SpeechStarted(64), SpeechStopped(224)]
    assert not d.speaking


def test_a_dip_between_the_thresholds_keeps_the_speech_going() -> None:
    d = TurnDetector(0.5, silence_duration_ms=64, window_ms=32)
    assert d.push([0.9, 0.4, 0.4, 0.4, 0.9], 1000) == [SpeechStarted(1000)]  # 0.4 >= 0.5 - 0.15
    assert d.speaking


def test_pieces_give_what_the_whole_gives() -> None:
    probs = [0.0, 0.9, 0.9, 0.1, 0.6, 0.1, 0.1, 0.1, 0.8, 0.1, 0.1, 0.1, 0.1]
    whole = TurnDetector(0.5, 96, 32).push(probs, 0)
    d = TurnDetector(0.5, 96, 32)
    parts = d.push(probs[:3], 0) + d.push(probs[3:7], 96) + d.push(probs[7:], 224)
    assert parts == whole == [SpeechStarted(32), SpeechStopped(256), SpeechStarted(256), SpeechStopped(384)]


def test_reset_forgets_the_speech() -> None:
    d = TurnDetector(0.5, 96, 32)
    d.push([0.9], 0)
    d.reset()
    assert not d.speaking and d.push([0.1] * 5, 32) == []
