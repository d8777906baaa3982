"""config.json fields declared once: read_json_config reads them, to_json_config writes them back."""

from __future__ import annotations

import dataclasses

import pytest

from omni.shared.settings import json_key, read_json_config, to_json_config


def _positive(key: str, raw: object) -> int:
    if not isinstance(raw, int) or isinstance(raw, bool) or raw <= 0:
        raise ValueError(f"{key} must be a positive integer, got {raw!r}")
    return raw


@dataclasses.dataclass(frozen=True)
class Block:
    width: int = json_key(read=_positive)
    depth: int = json_key(2, key="num_layers", read=_positive)
    kernels: tuple[int, ...] = json_key((3, 7), read=lambda key, raw: tuple(raw))


def test_reads_keys_defaults_and_renames() -> None:
    assert read_json_config(Block, {"width": 4}, what="block") == Block(width=4, depth=2, kernels=(3, 7))
    assert read_json_config(Block, {"width": 4, "num_layers": 5, "kernels": [1]}, what="block") == Block(4, 5, (1,))


def test_round_trip() -> None:
    block = Block(width=8, depth=3, kernels=(5,))
    raw = to_json_config(block, model_type="block")
    assert raw == {"model_type": "block", "width": 8, "num_layers": 3, "kernels": [5]}
    assert read_json_config(Block, raw, what="block", ignore=frozenset({"model_type"})) == block


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({}, "width must be a positive integer, got None"),  # required: its reader refuses None by name
        ({"width": 0}, "width must be a positive integer, got 0"),
        ({"width": 4, "num_layer": 5}, "block: unknown keys ['num_layer']"),  # a misspelt key is not dropped
        ([1, 2], "block must be a dict, got list"),
    ],
)
def test_refused(raw: object, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_json_config(Block, raw, what="block")  # type: ignore[arg-type]


def test_unknown_keys_pass_when_not_strict() -> None:
    assert read_json_config(Block, {"width": 4, "extra": 1}, what="block", strict=False) == Block(width=4)
