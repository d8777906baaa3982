"""Server VAD's turns from scripted probabilities (32 ms windows): exact start and stop times."""

from __future__ import annotations

from omni.serving.realtime.turn_detection import (
    EAGERNESS,
    Eagerness,
    Pause,
    SemanticTurnDetector,
    SpeechStarted,
    SpeechStopped,
    TurnDetector,
)


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


# ---------------------------------------------------------------- semantic VAD

E = Eagerness(check_ms=64, threshold=0.5, max_ms=320, unscored_ms=128)
SPEECH, QUIET = 0.9, 0.1


def _semantic(scoring: bool = True) -> SemanticTurnDetector:
    return SemanticTurnDetector(E, 0.5, 32, scoring=scoring)


def test_a_pause_asks_once_after_check_ms_and_a_likely_end_stops_the_turn_then() -> None:
    d = _semantic()
    # speech in windows 0-1; quiet from window 2 (64 ms): 64 ms of it at the end of window 3 (128 ms)
    assert d.push([SPEECH, SPEECH, QUIET, QUIET], 0) == [SpeechStarted(0), Pause(64, 128)]
    assert d.push([QUIET], 128) == []  # asked once: the score is awaited
    assert d.score(64, 0.7) == [SpeechStopped(160)]  # where the audio stands when the score comes
    assert not d.speaking


def test_an_unlikely_end_waits_for_max_ms_of_silence() -> None:
    d = _semantic()
    d.push([SPEECH, QUIET, QUIET], 0)  # quiet from 32 ms; asked at 96
    assert d.score(32, 0.2) == []
    # 320 ms of silence from 32 ms: at the end of the window ending at 352 ms (window 10)
    assert d.push([QUIET] * 7, 96) == []
    assert d.push([QUIET], 320) == [SpeechStopped(352)]


def test_a_score_that_comes_late_stops_the_turn_where_the_audio_stands() -> None:
    """The score comes while the silence goes on: the stop is at the last window pushed, however far."""
    d = _semantic()
    events = d.push([SPEECH] + [QUIET] * 5, 0)  # quiet from 32; asked at 96; now at 192
    assert events == [SpeechStarted(0), Pause(32, 96)]
    assert d.score(32, 0.9) == [SpeechStopped(192)]


def test_without_a_score_the_silence_ends_the_turn_at_max_ms() -> None:
    d = _semantic()
    events = d.push([SPEECH] + [QUIET] * 10, 0)  # quiet from 32: 320 ms of it at 352
    assert events == [SpeechStarted(0), Pause(32, 96), SpeechStopped(352)]
    assert d.score(32, 0.9) == []  # too late: the turn ended


def test_speech_that_resumes_makes_the_score_moot_and_the_next_pause_asks_again() -> None:
    d = _semantic()
    assert d.push([SPEECH, QUIET, QUIET, SPEECH], 0) == [SpeechStarted(0), Pause(32, 96)]
    assert d.score(32, 0.9) == []  # the user went on speaking at 96
    assert d.push([QUIET, QUIET, QUIET], 128) == [Pause(128, 192)]
    assert d.score(128, 0.9) == [SpeechStopped(224)]


def test_a_dip_between_the_thresholds_is_no_pause() -> None:
    d = _semantic()
    assert d.push([SPEECH, 0.4, 0.4, 0.4, 0.4], 0) == [SpeechStarted(0)]


def test_a_failed_score_ends_the_pause_as_an_unscored_one() -> None:
    d = _semantic()
    d.push([SPEECH, QUIET, QUIET], 0)  # quiet from 32; asked at 96
    assert d.score(32, None) == []
    assert d.push([QUIET], 96) == []  # 96 ms of silence
    assert d.push([QUIET], 128) == [SpeechStopped(160)]  # 128 ms: unscored_ms


def test_without_a_transcript_each_pause_ends_after_unscored_ms_and_nothing_is_asked() -> None:
    d = _semantic(scoring=False)
    probs = [SPEECH, QUIET, QUIET, QUIET, SPEECH, QUIET, QUIET, QUIET, QUIET, QUIET]
    # a 96 ms pause (32..128) goes on; the next, quiet from 160, ends at 160 + 128 = 288
    assert d.push(probs, 0) == [SpeechStarted(0), SpeechStopped(288)]


def test_semantic_pieces_give_what_the_whole_gives() -> None:
    probs = [QUIET, SPEECH, SPEECH, QUIET, QUIET, QUIET, SPEECH, QUIET] + [QUIET] * 12
    whole = _semantic().push(probs, 0)
    d = _semantic()
    parts = d.push(probs[:4], 0) + d.push(probs[4:9], 128) + d.push(probs[9:], 288)
    assert parts == whole == [SpeechStarted(32), Pause(96, 160), Pause(224, 288), SpeechStopped(544)]


def test_eagerness_orders_patience_and_auto_is_medium() -> None:
    assert EAGERNESS["auto"] == EAGERNESS["medium"]
    assert [EAGERNESS[k].max_ms for k in ("low", "medium", "high")] == [8000, 4000, 2000]  # OpenAI's
    for key in ("check_ms", "threshold", "unscored_ms"):
        low, medium, high = (getattr(EAGERNESS[k], key) for k in ("low", "medium", "high"))
        assert low >= medium >= high, key
