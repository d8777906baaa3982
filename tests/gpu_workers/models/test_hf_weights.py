"""One component's weights out of a full checkpoint's state dict, and loading them exactly:
all of them, nothing else, each of the right shape, with errors that name the component."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from gpu_workers.models.hf_weights import component_weights, load_exact


def test_a_component_s_tensors_are_found_under_its_prefixes_or_already_bare() -> None:
    t = {name: torch.tensor([float(i)]) for i, name in enumerate(
        ["visual.blocks.0.w", "model.visual.merger.w", "blocks.1.w", "model.layers.0.w", "lm_head.weight"]
    )}  # fmt: skip
    ours = component_weights(t, ("visual.", "model.visual."), re.compile(r"(blocks|merger)\."))
    assert {k: v.item() for k, v in ours.items()} == {"blocks.0.w": 0.0, "merger.w": 1.0, "blocks.1.w": 2.0}


def _module() -> nn.Module:
    return nn.Sequential(nn.Linear(2, 3), nn.Linear(3, 1, bias=False))


def _weights() -> dict[str, torch.Tensor]:
    return {"0.weight": torch.ones(3, 2), "0.bias": torch.full((3,), 2.0), "1.weight": torch.full((1, 3), 3.0)}


def test_load_exact_writes_every_weight() -> None:
    module = _module()
    load_exact(module, _weights(), "toy")
    assert module(torch.tensor([[1.0, 1.0]])).tolist() == [[36.0]]  # (2 + 2) * 3 rows * 3


def test_load_exact_converts_before_it_checks() -> None:
    module = _module()
    weights = _weights() | {"0.weight": torch.ones(6)}  # stored flat, as a checkpoint might

    def convert(name: str, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.view(3, 2) if name == "0.weight" else tensor

    load_exact(module, weights, "toy", convert)
    assert module[0].weight.tolist() == [[1.0, 1.0]] * 3


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"drop": "0.bias"}, r"toy weights: missing \['0.bias'\], unexpected \[\]"),
        ({"add": "2.weight"}, r"toy weights: missing \[\], unexpected \['2.weight'\]"),
        ({"reshape": "1.weight"}, r"toy weight 1.weight: shape \(3, 1\), want \(1, 3\)"),
    ],
)
def test_load_exact_refuses_a_missing_an_unexpected_or_a_misshapen_weight(change: dict[str, str], error: str) -> None:
    weights = _weights()
    if "drop" in change:
        del weights[change["drop"]]
    if "add" in change:
        weights[change["add"]] = torch.zeros(1)
    if "reshape" in change:
        weights[change["reshape"]] = weights[change["reshape"]].T.contiguous()
    module = _module()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    with pytest.raises(ValueError, match=error):
        load_exact(module, weights, "toy")
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # nothing written
