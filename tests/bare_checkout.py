"""A bare checkout: the tree on PYTHONPATH with the project not installed, as on the lent GPU
machine (bench/gpu_smoke.sh), which has its image's packages and none of the test extra.

There a test module that needs a package the machine lacks is skipped, naming the package, so
collecting the CUDA tests never ends in errors (issue 34). Where the project is installed
(bin/setup, CI) nothing is skipped for a missing package: the import fails loudly as before, so
a broken set-up cannot make its checks vanish. tests/conftest.py applies this to every module;
require() is for the packages a module looks up itself.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re

import pytest

FIRST_PARTY = frozenset({"omni", "gpu_workers", "scheduler", "tests", "bench"})
_NO_MODULE = re.compile(r"No module named '([\w.]+)'")


def project_installed() -> bool:
    try:
        importlib.metadata.distribution("omni-serve")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def missing_package(exc: BaseException) -> str | None:
    """The third-party top-level module whose absence caused exc (through its causes), if any."""
    name = None
    seen: set[int] = set()
    e: BaseException | None = exc
    while name is None and e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, ModuleNotFoundError) and e.name:
            name = e.name
        e = e.__cause__ or e.__context__
    if name is None:  # a collection error carries the import's traceback as text
        m = _NO_MODULE.search(str(exc))
        name = m.group(1) if m else None
    top = name.partition(".")[0] if name else None
    return None if top is None or top in FIRST_PARTY else top


def require(module: str, why: str) -> None:
    """At a test module's top: skip it in a bare checkout when `module` is missing; fail where
    the project is installed."""
    if importlib.util.find_spec(module) is not None:
        return
    if project_installed():
        pytest.fail(f"{module} is missing: {why}", pytrace=False)
    pytest.skip(f"{module} is not installed (a bare checkout; {why})", allow_module_level=True)
