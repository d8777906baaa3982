import subprocess
import sys
from pathlib import Path

import scheduler

_SCRIPT = """
import importlib, pkgutil, sys
import scheduler
names = [m.name for m in pkgutil.walk_packages(scheduler.__path__, "scheduler.")]
for name in names:
    importlib.import_module(name)
assert "scheduler.scheduler" in names and "scheduler.block_manager" in names, names
leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("torch modules:", leaked)
sys.exit(1 if leaked else 0)
"""


def test_scheduler_never_imports_torch():
    root = Path(scheduler.__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
