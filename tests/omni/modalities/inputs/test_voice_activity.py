"""The server's Silero VAD (onnxruntime on the package's ONNX model, our own state handling)
against silero-vad's own TorchScript model run by torch (its reference implementation, the
model init_jit_model loads), window by window on espeak-ng speech at 8 kHz: the same speech
probability to 1e-3 (measured worst difference 2.0e-6). silero_vad's utils import torchaudio
at module level for its file I/O only; the test stubs it (never install torchaudio: it replaces
torch)."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from omni.modalities.inputs.voice_activity import SAMPLE_RATE, WINDOW, VoiceActivityModel, model_path
from tests.e2e.audio import spoken

torch = pytest.importorskip("torch")


def _jit_model():  # type: ignore[no-untyped-def]
    sys.modules.setdefault("torchaudio", types.ModuleType("torchaudio"))  # imported, never used here
    from silero_vad.utils_vad import init_jit_model

    return init_jit_model(str(model_path().with_name("silero_vad.jit")))


@pytest.fixture(scope="module")
def speech() -> np.ndarray:
    samples = spoken("Hello there, this is a short test of voice activity.", SAMPLE_RATE, silence_s=1.0)
    if samples is None:
        pytest.skip("espeak-ng is not installed (bin/setup test installs it)")
    return np.concatenate([np.zeros(SAMPLE_RATE // 2, dtype=np.float32), samples])


def test_probabilities_match_silero_torchscript(speech: np.ndarray) -> None:
    reference = _jit_model()
    reference.reset_states()
    whole = len(speech) // WINDOW * WINDOW
    expected = [float(reference(torch.from_numpy(speech[i : i + WINDOW]), SAMPLE_RATE).item()) for i in range(0, whole, WINDOW)]
    stream = VoiceActivityModel().stream()
    rng = np.random.default_rng(0)
    got: list[float] = []
    cuts = np.sort(rng.choice(len(speech), size=40, replace=False))  # pieces of any size: windows are whole
    for piece in np.split(speech, cuts):
        got += stream.push(piece)
    assert len(got) == len(expected)
    worst = float(np.max(np.abs(np.array(got) - np.array(expected))))
    print(f"worst probability difference: {worst:.2e}")
    assert worst < 1e-3, worst
    # it hears the speech: silence before and after, speech between
    assert max(got[:10]) < 0.3 and max(got) > 0.8 and max(got[-20:]) < 0.3
