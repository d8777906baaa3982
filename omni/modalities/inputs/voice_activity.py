"""Voice activity: Silero VAD (the silero-vad package's ONNX model, shipped in its wheel) run
with onnxruntime, which needs no torch: the server process never imports torch, and a 32 ms
window costs well under a millisecond of CPU, so it runs on a thread beside the event loop
rather than on a worker (a round trip per window would cost more than the model).

    VoiceActivityModel   one ONNX session per server, shared by every stream (thread-safe run)
    VoiceActivity        one audio stream's recurrent state: 8 kHz samples in, a speech
                         probability per 32 ms window out

The package is installed without its dependencies (bin/setup): they name torch and torchaudio
for its own loaders, which this module does not use; the model file is found through the
package's metadata, so nothing of it is imported.
"""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import numpy as np

SAMPLE_RATE = 8000  # Silero's 8 kHz mode: the Realtime API's audio divides to it (24 kHz / 3, G.711 as is)
WINDOW = 256  # samples a probability covers: 32 ms
CONTEXT = 32  # the previous window's last samples, prepended to each (as silero's own wrapper does)
WINDOW_MS = 1000 * WINDOW // SAMPLE_RATE
MODEL_FILE = "silero_vad/data/silero_vad.onnx"


def model_path() -> Path:
    """The ONNX model inside the installed silero-vad package."""
    try:
        dist = importlib.metadata.distribution("silero-vad")
    except importlib.metadata.PackageNotFoundError:
        raise RuntimeError("server VAD needs the silero-vad package (bin/setup installs it)") from None
    return Path(str(dist.locate_file(MODEL_FILE)))


class VoiceActivityModel:
    def __init__(self, path: Path | None = None) -> None:
        import onnxruntime  # only a server that serves realtime sessions loads it

        opts = onnxruntime.SessionOptions()
        opts.inter_op_num_threads = 1  # one small matrix chain per window: threads cost more than they give
        opts.intra_op_num_threads = 1
        self.session = onnxruntime.InferenceSession(
            str(path or model_path()), providers=["CPUExecutionProvider"], sess_options=opts
        )

    def stream(self) -> VoiceActivity:
        return VoiceActivity(self)


class VoiceActivity:
    """push() takes 8 kHz float32 samples and gives a probability for each whole window they
    complete; the rest waits for the next push. Not thread-safe: one caller at a time."""

    def __init__(self, model: VoiceActivityModel) -> None:
        self.model = model
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(CONTEXT, dtype=np.float32)
        self._pending = np.zeros(0, dtype=np.float32)
        self._sr = np.array(SAMPLE_RATE, dtype=np.int64)

    def push(self, samples: np.ndarray) -> list[float]:
        x = np.concatenate([self._pending, samples.astype(np.float32)])
        whole = len(x) // WINDOW * WINDOW
        self._pending = x[whole:]
        out = []
        for start in range(0, whole, WINDOW):
            window = x[start : start + WINDOW]
            inputs = {"input": np.concatenate([self._context, window])[None, :], "state": self._state, "sr": self._sr}
            prob, self._state = self.model.session.run(None, inputs)
            self._context = window[-CONTEXT:]
            out.append(float(prob.reshape(-1)[0]))
        return out


class LazyVoiceActivityModel:
    """The server's one model, loaded on the first realtime session that needs it (onnxruntime
    and the model file cost a fraction of a second, paid only by servers that take sessions);
    None, with a warning once, where silero-vad or onnxruntime is not installed."""

    def __init__(self) -> None:
        self._model: VoiceActivityModel | None = None
        self._failed = False

    def get(self) -> VoiceActivityModel | None:
        if self._model is None and not self._failed:
            try:
                self._model = VoiceActivityModel()
            except (ImportError, RuntimeError, OSError) as exc:
                import logging

                logging.getLogger("omni.modalities.inputs.voice_activity").warning(
                    "server VAD is unavailable (%s): realtime sessions start with turn_detection null", exc
                )
                self._failed = True
        return self._model
