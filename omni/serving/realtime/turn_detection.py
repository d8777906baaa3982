"""Server VAD's turns: speech probabilities (one per voice activity window) -> speech started
and stopped, on the session's input audio timeline (ms since its first appended sample).

Speech starts at the first window whose probability reaches the threshold; it stops once the
probability has stayed below threshold - HYSTERESIS (Silero's own "neg_threshold") for
silence_duration_ms, at the end of that window: the stop includes the silence, as OpenAI's
audio_end_ms does. Windows in between that do not fall that low keep the speech going.
"""

from __future__ import annotations

from dataclasses import dataclass

HYSTERESIS = 0.15


@dataclass(frozen=True, slots=True)
class SpeechStarted:
    audio_start_ms: int


@dataclass(frozen=True, slots=True)
class SpeechStopped:
    audio_end_ms: int


class TurnDetector:
    def __init__(self, threshold: float, silence_duration_ms: int, window_ms: int) -> None:
        self.threshold = threshold
        self.silence_duration_ms = silence_duration_ms
        self.window_ms = window_ms
        self.speaking = False
        self._silence_from: int | None = None  # ms: where the current run of quiet windows began

    def push(self, probabilities: list[float], start_ms: int) -> list[SpeechStarted | SpeechStopped]:
        """start_ms: where the first probability's window begins."""
        out: list[SpeechStarted | SpeechStopped] = []
        for i, p in enumerate(probabilities):
            begin = start_ms + i * self.window_ms
            end = begin + self.window_ms
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
            if end - self._silence_from >= self.silence_duration_ms:
                self.speaking, self._silence_from = False, None
                out.append(SpeechStopped(end))
        return out

    def reset(self) -> None:
        self.speaking, self._silence_from = False, None
