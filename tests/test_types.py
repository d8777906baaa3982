"""The packages stay mypy-clean (STYLE.md: modern hints, mypy-clean), and their imports sorted."""

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
        # --show-traceback: a crash of mypy's own (an INTERNAL ERROR) says where, not only that
        [sys.executable, "-m", "mypy", "--show-traceback", "scheduler", "omni", "gpu_workers"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_imports_are_sorted() -> None:
    # One order for every import block (pyproject.toml's [tool.ruff]): a moved module's imports
    # read like the rest. `ruff check --select I --fix` sorts them.
    assert importlib.util.find_spec("ruff") is not None, "ruff is missing: pip install -e '.[test]'"
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "I", "omni", "gpu_workers", "scheduler", "tests", "bench"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
