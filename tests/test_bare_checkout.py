"""tests/bare_checkout.py: which missing package a collection error names, and require()'s
two answers (skip in a bare checkout, fail where the project is installed)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu_smoke import lent
from tests import bare_checkout

ROOT = Path(__file__).resolve().parents[1]


def _chained(name: str) -> BaseException:
    try:
        try:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        except ImportError as e:
            raise RuntimeError("collection failed") from e
    except RuntimeError as outer:
        return outer


def test_the_missing_package_is_read_from_the_cause_or_the_message() -> None:
    assert bare_checkout.missing_package(_chained("diffusers.models")) == "diffusers"
    assert bare_checkout.missing_package(RuntimeError("E   ModuleNotFoundError: No module named 'httpx'")) == "httpx"
    assert bare_checkout.missing_package(_chained("gpu_workers.nope")) is None  # ours: a real error
    assert bare_checkout.missing_package(RuntimeError("boom")) is None


def test_require_skips_in_a_bare_checkout_and_fails_where_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    bare_checkout.require("pytest", "present: nothing happens")
    monkeypatch.setattr(bare_checkout, "project_installed", lambda: False)
    with pytest.raises(pytest.skip.Exception, match="no_such_package_x"):
        bare_checkout.require("no_such_package_x", "why")
    monkeypatch.setattr(bare_checkout, "project_installed", lambda: True)
    with pytest.raises(pytest.fail.Exception, match="no_such_package_x is missing: why"):
        bare_checkout.require("no_such_package_x", "why")


def test_collection_in_a_bare_checkout_skips_the_modules_whose_packages_are_missing(tmp_path: Path) -> None:
    """End to end, under the lent GPU machine's packages (bench/gpu_smoke/lent.py: bigvgan and
    jsonschema missing, the project not installed): each module is a skip naming its package."""
    lent.write_site(tmp_path)
    files = ["tests/gpu_workers/models/test_unit_bigvgan.py", "tests/omni/text/constrained/test_compiler.py"]
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-rs", "-p", "no:cacheprovider", *files],
                         check=False, cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 5, out.stdout[-3000:]  # 5: nothing collected, and no error
    assert "needs bigvgan, which is not installed" in out.stdout and "needs jsonschema" in out.stdout
    assert "error" not in out.stdout.lower()
