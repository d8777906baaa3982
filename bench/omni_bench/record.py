"""What was measured for one request."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

# ok: the stream ended normally; error: HTTP error, error event or broken connection;
# cancelled: still running when --timeout stopped the run (neither success nor failure).
Outcome = Literal["ok", "error", "cancelled"]


@dataclass(slots=True)
class RequestRecord:
    index: int  # dispatch order within its phase (measured or warm-up)
    conversation_id: int
    turn: int
    max_tokens: int
    group: int | None = None
    outcome: Outcome = "cancelled"
    start_s: float = 0.0  # when it was sent, seconds after the phase began
    ttft_s: float | None = None  # first token-bearing delta
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between token-bearing chunks
    num_prompt_tokens: int | None = None
    num_completion_tokens: int | None = None
    num_cached_tokens: int | None = None  # usage.prompt_tokens_details.cached_tokens
    num_chunks: int = 0  # token-bearing chunks seen
    usage_reported: bool = False
    finish_reason: str | None = None
    http_status: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "ok"

    @property
    def num_output_tokens(self) -> int:
        """usage.completion_tokens, or the chunk count when the server sent no usage."""
        return self.num_completion_tokens if self.num_completion_tokens is not None else self.num_chunks

    @property
    def tpot_s(self) -> float | None:
        """(e2e - ttft) / (output tokens - 1): undefined below two tokens."""
        if self.ttft_s is None or self.e2e_s is None or self.num_output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.num_output_tokens - 1)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "tpot_s": self.tpot_s}
