"""tests/bare_checkout.py: which missing package a collection error names, and require()'s
two answers (skip in a bare checkout, fail where the project is installed)."""

from __future__ import annotations

import pytest

from tests import bare_checkout


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
