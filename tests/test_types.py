"""The packages stay mypy-clean (STYLE.md: modern hints, mypy-clean)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_mypy_is_clean() -> None:
    # mypy is in the `test` extra: where the extras are installed this runs, never skips.
    assert importlib.util.find_spec("mypy") is not None, "mypy is missing: pip install -e '.[test]'"
    result = subprocess.run(
        [sys.executable, "-m", "mypy", "scheduler", "omni", "gpu_workers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr
