"""bench/gpu_smoke.sh --dry-run --quick (issue 34 acceptance 1 and 2), as CI runs it: the bundle's
size (measured where .gpu/ is built, else its recorded sizes, nothing downloaded), the phase
plan against the budget, the scripts' syntax, the imports and the CUDA test files' collection
under the lent machine's packages (simulated by bench/gpu_smoke/lent.py). `--dry-run` without
--quick collects tests/ whole (about a minute here)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_dry_run_passes_and_its_last_line_states_size_and_plan() -> None:
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("SMOKE_BUILD", None)
    out = subprocess.run(["bash", "bench/gpu_smoke.sh", "--dry-run", "--quick"], check=False, cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    last = out.stdout.strip().splitlines()[-1]
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert last.startswith("dry run ok: bundle ") and "under the 64 MiB carry limit" in last
    assert "phases planned" in last and "budget" in last
    assert "no errors" in last
