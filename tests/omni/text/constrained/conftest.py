from pathlib import Path

import pytest

from omni.text.constrained.compiler import GrammarCompiler
from omni.text.tokenizer import TextTokenizer


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_dir(tiny_tokenizer_dir)


@pytest.fixture
def compiler(tokenizer: TextTokenizer) -> GrammarCompiler:
    return GrammarCompiler(tokenizer)
