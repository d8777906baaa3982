"""The server's log lines: text for people, or one JSON object per line for log pipelines.

Every line written while a request is handled carries its id (`X-Request-Id`): the access
middleware sets `current_request_id` for the request's task, which every task it starts
inherits, and a filter copies it onto each record. Text lines show it as `[request_id]`;
JSON lines as the `request_id` key. A record's `extra` fields (the access line's status,
tokens and latencies) become keys of their own in JSON.

    {"time": "2026-12-01T17:02:11.514Z", "level": "INFO", "logger": "omni.access",
     "process": 4242, "message": "POST /v1/chat/completions 200 ...", "request_id": "...",
     "status": 200, "model": "omni-tiny", "prompt_tokens": 12, ...}
"""

from __future__ import annotations

import contextvars
import logging
import time
from typing import Any

import orjson

current_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)

# The attributes every LogRecord has; anything else on a record came from `extra`.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "request_id"}

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]%(request_tag)s: %(message)s"


class RequestIdFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        rid = getattr(record, "request_id", None)
        if rid is None:
            rid = current_request_id.get()
            setattr(record, "request_id", rid)  # noqa: B010 - LogRecord takes new attributes
        setattr(record, "request_tag", f" [{rid}]" if rid else "")  # noqa: B010
        return True


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        seconds = record.created
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{int(seconds % 1 * 1000):03d}Z"
        entry: dict[str, Any] = {
            "time": stamp,
            "level": record.levelname,
            "logger": record.name,
            "process": record.process,
            "message": record.getMessage(),
        }
        rid = getattr(record, "request_id", None)
        if rid:
            entry["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "request_tag" and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return orjson.dumps(entry, default=str).decode()


def setup_logging(level: str, fmt: str = "text") -> None:
    """The root logger's one handler, on stderr (journald reads it under systemd)."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    logging.captureWarnings(True)  # warnings.warn() becomes a record too: JSON logs stay JSON
