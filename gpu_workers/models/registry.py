"""The LLM architectures the LLM worker serves, found from a checkpoint's config.json.

    config.json  {"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], ...}
        -> the Architecture registered for that model_type (or, for a config that gives no
           model_type, for a name in its `architectures`)
        -> its config class (`from_hf` reads and checks the dict) and its model class

A model class is a CausalLM: its parameters are named as the HF checkpoint's, but for the
fused ones STACKED_PARAMS lists, and its forward is three parts the compiled decode step
(gpu_workers/llm/decode_graph.py) also runs, with each layer compiled:

    h, shared = model.layer_inputs(model.embed(ids), positions)   # (T, H), what every layer reads
    h = layer(h, *shared, kv_cache, attn_metadata)                # for each of model.layers
    hidden = model.finish(h)                                      # (T, H), final-normed

A new family is a module of models/ with a CausalLM subclass decorated with
@register_architecture, listed in _BUILTIN_MODULES. The loader, the GGUF reader and the runner
go through this registry and name no model.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar

import torch
from torch import nn

from gpu_workers.attention.backend import KVCache

# Where the built-in architectures are registered: imported the first time one is looked up,
# as gpu_workers/runner.py imports its runners (so a model module may import this one).
_BUILTIN_MODULES = ("gpu_workers.models.llama",)


class CausalLMConfig(Protocol):
    """What the loader, the runner and the attention backends read of any LLM's config."""

    @property
    def model_type(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def hidden_size(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def num_heads(self) -> int: ...
    @property
    def num_kv_heads(self) -> int: ...
    @property
    def head_dim(self) -> int: ...
    @property
    def attention_scale(self) -> float: ...
    @property
    def max_position_embeddings(self) -> int: ...
    @property
    def tie_word_embeddings(self) -> bool: ...


class MergedLinear(nn.Linear):
    """A Linear whose output rows are several checkpoint tensors stacked (q|k|v, gate|up)."""

    def __init__(self, in_features: int, shard_sizes: tuple[int, ...], bias: bool) -> None:
        super().__init__(in_features, sum(shard_sizes), bias=bias)
        self.shard_sizes = shard_sizes


class CausalLM(nn.Module):
    """A causal LM over a packed batch (input_ids (T,), positions (T,)); see the module's doc."""

    # checkpoint module name -> (our fused MergedLinear, shard index): the loader writes each
    # checkpoint tensor into its rows of the fused module
    STACKED_PARAMS: ClassVar[dict[str, tuple[str, int]]] = {}
    # Linears left in the serving dtype under int8, by the last part of their name
    # (gpu_workers/models/int8_linear.py says which roles, and why)
    INT8_KEEP: ClassVar[tuple[str, ...]] = ()

    config: CausalLMConfig
    layers: nn.ModuleList

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Raw embedding rows (T, H); callers splice injected media rows into these."""
        raise NotImplementedError

    def layer_inputs(self, h: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
        """The first layer's input from the embedding rows, and the tensors every layer reads
        besides it (RoPE's cos and sin, say), in the order a layer takes them."""
        raise NotImplementedError

    def finish(self, h: torch.Tensor) -> torch.Tensor:
        """The last layer's output (T, H) -> the hidden states compute_logits reads."""
        raise NotImplementedError

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden (N, H) -> float32 logits (N, V)."""
        raise NotImplementedError

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[KVCache] | None,
        attn_metadata: Any,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Final-normed hidden states (T, H) for the packed tokens.

        inputs_embeds (T, H), when given, replaces embed(input_ids) (callers splice encoder
        outputs into the rows they want). kv_caches: one per layer, or None for a stateless
        prefill of whole sequences."""
        h, shared = self.layer_inputs(self.embed(input_ids) if inputs_embeds is None else inputs_embeds, positions)
        native = None if kv_caches is None else self.native_layers(h, shared, kv_caches, attn_metadata)
        if native is not None:
            return self.finish(native)
        for i, layer in enumerate(self.layers):
            h = layer(h, *shared, None if kv_caches is None else kv_caches[i], attn_metadata)
        return self.finish(h)

    def native_rows(self, dtype: torch.dtype) -> int:
        """The most rows a step of activations in `dtype` may have for native_layers to take it
        (0: it takes none); the runner's compiled decode step leaves such steps to it."""
        return 0

    def native_layers(
        self, h: torch.Tensor, shared: tuple[torch.Tensor, ...], kv_caches: list[KVCache], attn_metadata: Any
    ) -> torch.Tensor | None:
        """Every layer's output for this step in one native call, where the model has one for it
        (models/llama.py: decode steps of a few rows on the CPU); None: the layers run one by one."""
        return None


@dataclass(frozen=True, slots=True)
class Architecture:
    names: dict[str, str]  # model_type -> the architecture config.json names for it
    from_hf: Callable[[dict[str, Any]], CausalLMConfig]  # reads and checks a config.json dict
    model: type[CausalLM]


M = TypeVar("M", bound=type[CausalLM])
_BY_MODEL_TYPE: dict[str, Architecture] = {}
_BY_NAME: dict[str, Architecture] = {}


def register_architecture(
    names: dict[str, str], from_hf: Callable[[dict[str, Any]], CausalLMConfig]
) -> Callable[[M], M]:
    """Class decorator: the model class serves these model_types (and their architecture names)."""

    def register(cls: M) -> M:
        arch = Architecture(dict(names), from_hf, cls)
        for model_type, name in names.items():
            for table, key in ((_BY_MODEL_TYPE, model_type), (_BY_NAME, name)):
                owner = table.get(key)
                if owner is not None and owner.model is not cls:
                    raise ValueError(f"{key} is already served by {owner.model.__name__}")
                table[key] = arch
        return cls

    return register


def _tables() -> tuple[dict[str, Architecture], dict[str, Architecture]]:
    for module in _BUILTIN_MODULES:  # registered on first import; later a sys.modules lookup
        importlib.import_module(module)
    return _BY_MODEL_TYPE, _BY_NAME


def _find(config: dict[str, Any]) -> tuple[str, Architecture]:
    """The model_type and architecture of a config.json dict: by its model_type, else by a name
    in its `architectures` (a config that names only its class); ValueError naming what is served."""
    by_type, by_name = _tables()
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type in by_type:
        return model_type, by_type[model_type]
    names = config.get("architectures")
    for name in names if isinstance(names, list) else []:
        arch = by_name.get(name) if isinstance(name, str) else None
        if arch is not None and model_type is None:
            return next(t for t, n in arch.names.items() if n == name), arch
    raise ValueError(f"unsupported model_type {model_type!r}; supported: {', '.join(by_type)}")


def read_config(config: Any) -> CausalLMConfig:
    """config.json's dict -> its architecture's config; ValueError when unsupported or malformed."""
    if not isinstance(config, dict):
        raise ValueError(f"config must be a dict, got {type(config).__name__}")  # noqa: TRY004
    model_type, arch = _find(config)
    return arch.from_hf({**config, "model_type": model_type})


def model_class(config: CausalLMConfig) -> type[CausalLM]:
    return _tables()[0][config.model_type].model
