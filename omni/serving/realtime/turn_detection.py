"""Turn detection: speech probabilities (one per voice activity window) -> speech started and
stopped, on the session's input audio timeline (ms since its first appended sample).

Server VAD (TurnDetector): speech starts at the first window whose probability reaches the
threshold; it stops once the probability has stayed below threshold - HYSTERESIS (Silero's own
"neg_threshold") for silence_duration_ms, at the end of that window: the stop includes the
silence, as OpenAI's audio_end_ms does. Windows in between that do not fall that low keep the
speech going.

Semantic VAD (SemanticTurnDetector): the same speech and silence, but how much silence ends the
turn depends on what was said. After check_ms of silence it asks (a Pause event) how likely the
user's turn is to end there; the session scores what was said so far (end_of_turn.py) and gives
the answer back (score()). A likely end stops the turn at once; an unlikely one waits for
max_ms of silence (OpenAI's "max timeouts": 8, 4 and 2 s for low, medium and high eagerness).
A pause that cannot be scored (no transcript) ends after unscored_ms, a fixed window per
eagerness. Speech that resumes before the score comes makes it moot: the next pause asks again.

    speech ....|  silence ------------------------------------------------------->
               |-- check_ms --|  Pause(silence_from)
                              |  score >= threshold: SpeechStopped now (or when it arrives)
               |-------------------------------- max_ms --|  SpeechStopped, whatever the score
"""

from __future__ import annotations

from dataclasses import dataclass

from omni.serving.realtime import client_events as ev

HYSTERESIS = 0.15
SEMANTIC_PADDING_MS = 300  # semantic_vad's audio kept before the speech (server_vad's default)


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int


@dataclass(frozen=True, slots=True)
class Pause:
    """Semantic VAD's question: the speech has been quiet since silence_from_ms, now at_ms;
    does the user's turn end here? The answer goes back through score(silence_from_ms, ...)."""

    silence_from_ms: int
    at_ms: int


TurnEvent = SpeechStarted | SpeechStopped | Pause


@dataclass(frozen=True, slots=True)
class Eagerness:
    check_ms: int  # silence after which what was said is scored
    threshold: float  # P(end of turn) from which the pause ends the turn at once
    max_ms: int  # silence that ends the turn whatever was said
    unscored_ms: int  # silence that ends a turn that cannot be scored


# max_ms are OpenAI's. threshold: SmolLM2-135M-Instruct gives the unfinished starts of
# bench/semantic_vad.py's sentences P(end) < 1e-5 and the finished sentences 0.03 to 0.92, so
# a likely end is one of a few per cent (docs/REALTIME.md); the unscored windows lie between
# server VAD's 500 ms and the longer pauses of unhurried speech.
EAGERNESS = {
    "high": Eagerness(check_ms=200, threshold=0.01, max_ms=2000, unscored_ms=600),
    "medium": Eagerness(check_ms=300, threshold=0.02, max_ms=4000, unscored_ms=1000),
    "low": Eagerness(check_ms=500, threshold=0.05, max_ms=8000, unscored_ms=1500),
}
EAGERNESS["auto"] = EAGERNESS["medium"]


class TurnDetector:
    def __init__(self, threshold: float, silence_duration_ms: int, window_ms: int) -> None:
        self.threshold = threshold
        self.silence_duration_ms = silence_duration_ms
        self.window_ms = window_ms
        self.speaking = False
        self._silence_from: int | None = None  # ms: where the current run of quiet windows began
        self._end_ms = 0  # where the last window pushed ends

    def push(self, probabilities: list[float], start_ms: int) -> list[TurnEvent]:
        """start_ms: where the first probability's window begins."""
        out: list[TurnEvent] = []
        for i, p in enumerate(probabilities):
            begin = start_ms + i * self.window_ms
            end = self._end_ms = begin + self.window_ms
            if not self.speaking:
                if p >= self.threshold:
                    self.speaking, self._silence_from = True, None
                    out.append(SpeechStarted(begin))
                continue
            if p >= self.threshold - HYSTERESIS:
                self._silence_from = None
                continue
            if self._silence_from is None:
                self._silence_from = begin
            out += self._quiet(end, end - self._silence_from)
        return out

    def _quiet(self, end: int, silence: int) -> list[TurnEvent]:
        """A quiet window ended at end, silence ms into the pause, the speech still on."""
        return [self._stop(end)] if silence >= self.silence_duration_ms else []

    def _stop(self, end: int) -> SpeechStopped:
        self.speaking, self._silence_from = False, None
        return SpeechStopped(end)

    def reset(self) -> None:
        self.speaking, self._silence_from = False, None


class SemanticTurnDetector(TurnDetector):
    def __init__(self, eagerness: Eagerness, threshold: float, window_ms: int, *, scoring: bool) -> None:
        """scoring: whether Pause events will be answered (the session can transcribe); without,
        each pause ends after eagerness.unscored_ms."""
        super().__init__(threshold, eagerness.max_ms, window_ms)
        self.eagerness = eagerness
        self.scoring = scoring
        # the current pause (its silence_from) and the silence it needs, None while its score is awaited
        self._pause: tuple[int, int | None] | None = None

    def _quiet(self, end: int, silence: int) -> list[TurnEvent]:
        e, out = self.eagerness, list[TurnEvent]()
        assert self._silence_from is not None
        pause = self._pause if self._pause is not None and self._pause[0] == self._silence_from else None
        if pause is None and silence >= e.check_ms:
            pause = self._pause = (self._silence_from, None if self.scoring else e.unscored_ms)
            if self.scoring:
                out.append(Pause(self._silence_from, end))
        needed = e.max_ms if pause is None or pause[1] is None else pause[1]
        if silence >= needed:
            out.append(self._stop(end))
        return out

    def score(self, silence_from_ms: int, p_end: float | None) -> list[TurnEvent]:
        """The answer to Pause(silence_from_ms): the turn stops now (at the end of the last window
        pushed) if p_end is likely enough and the pause still goes on; else it waits. None: no
        score could be had; the pause ends as an unscored one."""
        if not self.speaking or self._silence_from != silence_from_ms:
            return []  # the speech resumed, or the turn already ended
        e = self.eagerness
        if p_end is None:
            needed = e.unscored_ms
        else:
            needed = e.check_ms if p_end >= e.threshold else e.max_ms
        self._pause = (silence_from_ms, needed)
        return [self._stop(self._end_ms)] if self._end_ms - silence_from_ms >= needed else []

    def reset(self) -> None:
        super().reset()
        self._pause = None


def new_detector(vad: ev.TurnDetection, window_ms: int, *, scoring: bool) -> TurnDetector:
    """The session's detector for its turn_detection; scoring: semantic_vad's pauses can be scored."""
    if isinstance(vad, ev.ServerVad):
        return TurnDetector(vad.threshold, vad.silence_duration_ms, window_ms)
    return SemanticTurnDetector(EAGERNESS[vad.eagerness], 0.5, window_ms, scoring=scoring)


def padding_ms(vad: ev.TurnDetection) -> int:
    """The audio a turn keeps from before its speech started."""
    return vad.prefix_padding_ms if isinstance(vad, ev.ServerVad) else SEMANTIC_PADDING_MS
