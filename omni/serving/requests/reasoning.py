"""Reasoning effort: chat's `reasoning_effort` and the Responses API's `reasoning.effort`, one
value set and one rule for both (the Responses API builds a chat request and sets chat's field).

The effort reaches the chat template as the variable `reasoning_effort`, as vLLM passes it, and
sets the two switches of a template's reasoning block: the reference dialect's `skip_reasoning`
and Qwen3's `enable_thinking`. none and minimal skip the block; any other effort keeps it, also
where the checkpoint's generation defaults skip it (the embedded tiny default's do,
generation_config.json's default_chat_template_kwargs). The model has no finer control than
that: low, medium and high reason as the model does (thinking_token_budget caps reasoning). A
template with no reasoning block reads none of these variables, and the effort changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Literal, TypeAlias

from omni.serving.requests.fields import Json

# OpenAI's ReasoningEffort, shared by both of its APIs (openai-python's types/shared).
ReasoningEffort: TypeAlias = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]

# The template variables that close the reasoning block before the reply, or keep it: the
# reference template's switch, and Qwen3's (the bare LLM's template reads either).
SKIP_REASONING: Mapping[str, Json] = MappingProxyType({"skip_reasoning": True, "enable_thinking": False})
KEEP_REASONING: Mapping[str, Json] = MappingProxyType({"skip_reasoning": False, "enable_thinking": True})


def skips_reasoning(effort: ReasoningEffort | None) -> bool:
    return effort in ("none", "minimal")


def effort_template_kwargs(effort: ReasoningEffort | None) -> dict[str, Json]:
    """The template variables an effort sets (none when no effort is asked for)."""
    if effort is None:
        return {}
    return {"reasoning_effort": effort, **(SKIP_REASONING if skips_reasoning(effort) else KEEP_REASONING)}
