"""The sampling values' bounds, written once.

The request Structs' msgspec Meta (omni/serving/requests/common.py and every endpoint that has
one of these fields) and the worker's validate_options (gpu_workers/sample/sampler.py) both read this
table, so the 400 and the worker's refusal draw the line at the same value. A bound is the
API's: OpenAI's range where OpenAI has the field (temperature 0 to 2, the penalties -2 to 2),
vLLM's or ours where it does not.

Keys are omni/shared/protocol/messages.py:SamplingOptions' field names, which are the API's,
but for logit_bias_values: each value of the API's logit_bias. A field the table leaves out
has an API form that is not its wire form (top_k: -1 and 0 mean "off" in the API, None on the
wire; logprobs: each endpoint spells it its own way, and --max-logprobs bounds it), so each
side checks it on its own.

Shared by the server and the workers: it imports only the standard library.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class Bound:
    """A closed (ge, le) or open (gt, lt) end on either side; None: unbounded there. An int
    bound stays an int: msgspec's Meta takes only ints for an int field."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def meta(self) -> dict[str, float]:
        """The keywords of msgspec.Meta for these bounds."""
        ends = {"ge": self.ge, "gt": self.gt, "le": self.le, "lt": self.lt}
        return {k: v for k, v in ends.items() if v is not None}

    def admits(self, value: float) -> bool:
        """NaN and the infinities never (no finite bound admits them, in msgspec either)."""
        if not math.isfinite(value):
            return False
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def __str__(self) -> str:
        """Interval notation, as the worker's refusal says it: "[0, 2]", "(0, 1]", "[0, inf)"."""
        low = f"[{self.ge:g}" if self.ge is not None else f"({self.gt:g}" if self.gt is not None else "(-inf"
        high = f"{self.le:g}]" if self.le is not None else f"{self.lt:g})" if self.lt is not None else "inf)"
        return f"{low}, {high}"


# OpenAI's bound on a logit bias, either sign.
MAX_LOGIT_BIAS = 100.0
# vLLM's default max_logprobs: the alternatives a prompt position may list.
MAX_PROMPT_LOGPROBS = 20

SAMPLING_BOUNDS: Mapping[str, Bound] = MappingProxyType(
    {
        "temperature": Bound(ge=0.0, le=2.0),
        "top_p": Bound(gt=0.0, le=1.0),
        "min_p": Bound(ge=0.0, le=1.0),
        "presence_penalty": Bound(ge=-2.0, le=2.0),
        "frequency_penalty": Bound(ge=-2.0, le=2.0),
        # Any positive value is a penalty, but float32 logits divided by a tiny one overflow to
        # inf: these bounds are far past any useful setting and keep the arithmetic finite.
        "repetition_penalty": Bound(ge=1e-3, le=1e3),
        "logit_bias_values": Bound(ge=-MAX_LOGIT_BIAS, le=MAX_LOGIT_BIAS),
        "min_tokens": Bound(ge=0),
        "prompt_logprobs": Bound(ge=0, le=MAX_PROMPT_LOGPROBS),
    }
)


def sampling_bound(name: str, **narrower: float) -> dict[str, float]:
    """msgspec.Meta's keywords for the table's bound on name; narrower replaces an end where an
    endpoint's own range lies inside the table's (transcriptions: temperature at most 1)."""
    bound = SAMPLING_BOUNDS[name]
    # an end the table refuses would let the endpoint send the worker what it refuses
    assert all(k in ("ge", "gt", "le", "lt") and bound.admits(v) for k, v in narrower.items()), (name, narrower)
    return bound.meta() | narrower
