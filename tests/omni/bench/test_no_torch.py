import subprocess
import sys
from pathlib import Path

import omni

_SCRIPT = """
import importlib, pkgutil, sys
import omni.bench
names = [m.name for m in pkgutil.walk_packages(omni.bench.__path__, "omni.bench.")]
for name in names:
    if name != "omni.bench.__main__":
        importlib.import_module(name)
assert "omni.bench.runner" in names, names
leaked = sorted(m for m in sys.modules if m == "torch" or m.startswith("torch."))
print("torch modules:", leaked)
sys.exit(1 if leaked else 0)
"""


def test_bench_never_imports_torch():
    root = Path(omni.__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, "-c", _SCRIPT], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
