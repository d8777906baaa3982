"""The image decoder's code grid, from either layout's files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from omni.modalities.outputs.image import read_code_grid


def test_code_grid_of_our_layout_and_the_published_folder(tmp_path: Path) -> None:
    ours = tmp_path / "vision_decoder"
    ours.mkdir()
    (ours / "config.json").write_text(json.dumps({"code_grid": [8, 6]}))
    assert read_code_grid(ours) == (8, 6)

    published = tmp_path / "decoder" / "vision"
    (published / "token_embedder").mkdir(parents=True)
    (published / "model_index.json").write_text("{}")
    (published / "token_embedder" / "config.json").write_text(json.dumps({"token_length": 729}))
    assert read_code_grid(published) == (27, 27)
    (published / "token_embedder" / "config.json").write_text(json.dumps({"token_length": 730}))
    with pytest.raises(ValueError, match="not a square"):
        read_code_grid(published)
