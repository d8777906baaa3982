"""The endpoints' lifecycle tests serve one text model, "m", on an AdmittingPool that answers
REPLY (tests/omni/serving/text_model.py). A test module may define its own of these fixtures."""

from __future__ import annotations

from pathlib import Path
from typing import cast

import pytest

from omni.engines.pool import ModelPool
from omni.serving.model import ModelRegistry, ServedModel
from omni.text.tokenizer import TextTokenizer
from tests.omni.serving.text_model import REPLY, AdmittingPool


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def pool(tokenizer: TextTokenizer) -> AdmittingPool:
    return AdmittingPool(tokenizer.encode(REPLY, add_special_tokens=False))


@pytest.fixture
def models(tokenizer: TextTokenizer, pool: AdmittingPool) -> ModelRegistry:
    registry = ModelRegistry()
    registry.add(ServedModel("m", tokenizer, cast(ModelPool, pool), created=0))
    return registry
