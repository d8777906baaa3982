"""Loading one component's transformers-named weights out of a (possibly full-model) state dict."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import torch
from torch import nn


def component_weights(
    state_dict: Mapping[str, torch.Tensor], prefixes: tuple[str, ...], bare_key: re.Pattern[str]
) -> dict[str, torch.Tensor]:
    """The component's tensors under their bare names.

    A key is the component's if it starts with one of `prefixes` (e.g. "visual.",
    "model.visual.") or, already bare, matches `bare_key`; every other key (another
    component of a full checkpoint) is skipped.
    """
    ours: dict[str, torch.Tensor] = {}
    for name, tensor in state_dict.items():
        bare = next((name[len(p) :] for p in prefixes if name.startswith(p)), None)
        if bare is None and bare_key.match(name):
            bare = name
        if bare is not None:
            ours[bare] = tensor
    return ours


def load_exact(
    module: nn.Module,
    weights: Mapping[str, torch.Tensor],
    what: str,
    convert: Callable[[str, torch.Tensor], torch.Tensor] | None = None,
) -> None:
    """Load weights into module, all of them and nothing else, each of the right shape.

    `convert(name, tensor)` may reshape a checkpoint tensor first (e.g. a Conv3d patch
    embedding into the Linear that computes the same thing). Errors name `what`.
    """
    if convert is not None:
        weights = {name: convert(name, t) for name, t in weights.items()}
    expected = module.state_dict()
    missing = sorted(set(expected) - set(weights))
    unexpected = sorted(set(weights) - set(expected))
    if missing or unexpected:
        raise ValueError(f"{what} weights: missing {missing}, unexpected {unexpected}")
    for name, tensor in weights.items():
        if tensor.shape != expected[name].shape:
            raise ValueError(
                f"{what} weight {name}: shape {tuple(tensor.shape)}, "
                f"want {tuple(expected[name].shape)}"
            )
    module.load_state_dict(dict(weights), strict=True)
