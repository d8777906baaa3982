"""The LLM registry: a config.json dict finds its architecture by model_type (or, naming no
model_type, by its `architectures`), its config class reads it, and its model class is the one
registered; CausalLM.forward is layer_inputs, every layer with its own cache, then finish."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

from gpu_workers.models import registry
from gpu_workers.models.llama import LlamaFamilyConfig, LlamaForCausalLM
from gpu_workers.models.registry import CausalLM, model_class, read_config, register_architecture

TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
}
SUPPORTED = "supported: llama, qwen2, granite, hyperclovax"


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "granite"])
def test_a_config_is_read_by_its_model_types_config_class(model_type: str) -> None:
    config = read_config({"model_type": model_type, **TINY})
    assert type(config) is LlamaFamilyConfig
    assert (config.model_type, config.num_layers, config.head_dim, config.qkv_bias) == (
        model_type, 2, 8, model_type == "qwen2",
    )  # fmt: skip
    assert model_class(config) is LlamaForCausalLM


def test_a_config_naming_only_its_architecture_is_read_as_that_model_type() -> None:
    config = read_config({"architectures": ["Qwen2ForCausalLM"], **TINY})
    assert (config.model_type, config.qkv_bias) == ("qwen2", True)


@pytest.mark.parametrize(
    ("config", "error"),
    [
        ({"model_type": "gpt2", **TINY}, f"unsupported model_type 'gpt2'; {SUPPORTED}$"),
        ({"architectures": ["GPT2LMHeadModel"], **TINY}, f"unsupported model_type None; {SUPPORTED}$"),
        # a model_type of its own is not overridden by an architecture name we know
        ({"model_type": "mistral", "architectures": ["LlamaForCausalLM"]}, "unsupported model_type 'mistral'"),
        ({"model_type": "llama", "hidden_act": "gelu", **TINY}, "hidden_act 'gelu' is not supported"),
        ([1, 2], "config must be a dict, got list"),
    ],
)
def test_what_is_not_served_is_refused_naming_what_is(config: Any, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        read_config(config)


class _Doubling(nn.Module):
    """A layer whose output shows what it was given: h * scale + offset, and the cache it saw."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[Any] = []

    def forward(
        self, h: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, cache: Any, meta: Any
    ) -> torch.Tensor:
        self.seen.append((cache, meta))
        return h * scale + offset


class _Toy(CausalLM):
    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_Doubling(), _Doubling()])

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return input_ids.float()[:, None]  # (T, 1)

    def layer_inputs(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        return h + 1, (torch.full_like(h, 2.0), positions.float()[:, None])

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        return -h


def test_forward_is_layer_inputs_then_each_layer_with_its_cache_then_finish() -> None:
    toy = _Toy()
    out = toy(torch.tensor([1, 3]), torch.tensor([0, 10]), ["c0", "c1"], "meta")
    # ids 1, 3 -> +1 -> 2, 4; layer: *2 + pos twice -> (2*2+0)*2+0 = 8, (4*2+10)*2+10 = 46; negated
    assert out[:, 0].tolist() == [-8.0, -46.0]
    assert [layer.seen for layer in toy.layers] == [[("c0", "meta")], [("c1", "meta")]]
    embeds = torch.tensor([[5.0], [7.0]])
    stateless = toy(torch.tensor([0, 0]), torch.tensor([1, 1]), None, None, inputs_embeds=embeds)
    # 6, 8 -> (6*2+1)*2+1 = 27, (8*2+1)*2+1 = 35
    assert stateless[:, 0].tolist() == [-27.0, -35.0]
    assert toy.layers[1].seen[-1] == (None, None)


def test_a_family_registers_its_names_once(monkeypatch: pytest.MonkeyPatch) -> None:
    read_config({"model_type": "llama", **TINY})  # the built-in families are registered
    monkeypatch.setattr(registry, "_BY_MODEL_TYPE", dict(registry._BY_MODEL_TYPE))
    monkeypatch.setattr(registry, "_BY_NAME", dict(registry._BY_NAME))

    def from_hf(config: dict[str, Any]) -> Any:
        return LlamaFamilyConfig.from_hf({**config, "model_type": "llama"})

    @register_architecture({"toy": "ToyForCausalLM"}, from_hf)
    class ToyLM(_Toy):
        pass

    assert model_class(read_config({"model_type": "toy", **TINY})) is LlamaForCausalLM  # from_hf said llama
    assert registry._find({"architectures": ["ToyForCausalLM"]}) == ("toy", registry._BY_NAME["ToyForCausalLM"])
    assert registry._BY_MODEL_TYPE["toy"].model is ToyLM
    with pytest.raises(ValueError, match="llama is already served by LlamaForCausalLM"):
        register_architecture({"llama": "OtherForCausalLM"}, from_hf)(type("Other", (_Toy,), {}))
