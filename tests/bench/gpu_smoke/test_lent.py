"""bench/gpu_smoke/lent.py: the simulated lent machine hides what it lacks (modules and
distributions) and keeps what it has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench.gpu_smoke import lent

ROOT = Path(__file__).resolve().parents[3]


def test_the_closure_follows_requirements_and_never_admits_an_absent_package() -> None:
    dists = lent.installed()
    ok = lent.allowed(dists, ["torch", "transformers"])
    assert {"torch", "transformers", "numpy", "filelock"} <= ok  # numpy, filelock: required
    assert "pydantic" not in ok and "diffusers" not in ok
    assert lent.OURS in ok


def test_what_the_lent_machine_lacks_is_blocked_and_what_it_has_is_not() -> None:
    dists, mods = lent.blocked()
    assert {"diffusers", "jsonschema", "openai", "aiobotocore", "pytest-asyncio"} <= set(dists)
    assert {"diffusers", "jsonschema", "openai", "aiobotocore", "pytest_asyncio"} <= set(mods)
    assert not {"torch", "numpy", "transformers", "msgspec", "orjson", "av", "pytest", "omni"} & set(mods)


def test_the_site_hook_makes_them_missing_as_a_missing_package_is(tmp_path: Path) -> None:
    lent.write_site(tmp_path)
    probe = (
        "import importlib.util, importlib.metadata as md\n"
        "print(importlib.util.find_spec('diffusers') is None, importlib.util.find_spec('numpy') is not None)\n"
        "names = {d.metadata['Name'] for d in md.distributions()}\n"
        "print('omni-serve' in names, 'pytest-asyncio' in names, 'pytest' in names)\n"
        "try:\n    import jsonschema\nexcept ModuleNotFoundError as e:\n    print(e.name)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=False, cwd=ROOT, capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True", "False", "False", "True", "jsonschema"]


def test_every_conftest_imports_with_only_the_lent_packages(tmp_path: Path) -> None:
    """A conftest that fails to import ends collection of its whole folder in an error, and the
    bare-checkout skip (tests/conftest.py) cannot help it: each must import there. (The dry run
    without --quick collects tests/ whole under the same packages; this is its cheap part.)"""
    lent.write_site(tmp_path)
    modules = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "tests").rglob("conftest.py"))
    code = "import importlib\n" + "".join(f"importlib.import_module({m!r})\n" for m in modules)
    out = subprocess.run([sys.executable, "-c", code], check=False, cwd=ROOT, capture_output=True, text=True,
                         timeout=120, env={"PYTHONPATH": f"{tmp_path}:{ROOT}", "PATH": "/usr/bin:/bin"})  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(modules) > 3
