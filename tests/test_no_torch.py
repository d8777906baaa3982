"""The server process never imports torch (STYLE.md): every module of scheduler/ and omni/,
and the gpu_workers modules the server names (the worker entry point) import without it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_SCRIPT = """
import importlib, pkgutil, sys
import {package}
names = [m.name for m in pkgutil.walk_packages({package}.__path__, "{package}.")
         if not m.name.endswith(".__main__")]  # a __main__ runs its program on import
names += {extra}
for name in names:
    importlib.import_module(name)
assert len(names) > 3, names
leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("torch modules:", leaked)
sys.exit(1 if leaked else 0)
"""


@pytest.mark.parametrize(
    "package, extra",
    [
        ("scheduler", []),
        ("omni", ["gpu_workers.worker", "gpu_workers.runner", "gpu_workers.distributed"]),
    ],
)
def test_package_never_imports_torch(package: str, extra: list[str]) -> None:
    script = _SCRIPT.format(package=package, extra=extra)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stdout + result.stderr
