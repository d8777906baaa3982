"""Log lines as text or JSON, each carrying the id of the request it was written for."""

from __future__ import annotations

import asyncio
import io
import logging

import orjson
import pytest

from omni.shared.log_format import JsonFormatter, RequestIdFilter, current_request_id, setup_logging


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RequestIdFilter())
    handler.setFormatter(formatter)
    logger = logging.getLogger(f"test.log_format.{id(out)}")
    logger.propagate = False
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    return logger, out


def test_json_lines_parse_and_carry_the_request_id_of_their_task() -> None:
    logger, out = _capture(JsonFormatter())

    async def handle(rid: str) -> None:
        current_request_id.set(rid)
        await asyncio.sleep(0)
        await asyncio.create_task(asyncio.to_thread(lambda: None))  # a child task inherits the id
        logger.info("handled %s", rid, extra={"status": 200, "model": "m"})

    async def main() -> None:
        await asyncio.gather(handle("a-1"), handle("b-2"))
        logger.warning("no request here")
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("failed")

    asyncio.run(main())
    lines = [orjson.loads(line) for line in out.getvalue().splitlines()]
    handled = {e["request_id"]: e for e in lines if e["message"].startswith("handled")}
    assert set(handled) == {"a-1", "b-2"}
    assert handled["a-1"]["message"] == "handled a-1" and handled["a-1"]["status"] == 200
    assert handled["a-1"]["model"] == "m" and handled["a-1"]["level"] == "INFO"
    assert {"time", "logger", "process"} <= set(handled["a-1"])
    bare = next(e for e in lines if e["message"] == "no request here")
    assert "request_id" not in bare and bare["level"] == "WARNING"
    failed = next(e for e in lines if e["message"] == "failed")
    assert "ValueError: boom" in failed["exception"]


def test_text_lines_tag_the_request_id() -> None:
    from omni.shared.log_format import TEXT_FORMAT

    logger, out = _capture(logging.Formatter(TEXT_FORMAT))
    token = current_request_id.set("r-9")
    try:
        logger.info("inside")
    finally:
        current_request_id.reset(token)
    logger.info("outside")
    inside, outside = out.getvalue().splitlines()
    assert inside.endswith("[r-9]: inside")
    assert outside.endswith("]: outside") and "[r-9]" not in outside


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_setup_logging_installs_one_handler(fmt: str) -> None:
    root = logging.getLogger()
    saved = list(root.handlers), root.level
    try:
        setup_logging("debug", fmt)
        assert len(root.handlers) == 1 and root.level == logging.DEBUG
        assert isinstance(root.handlers[0].formatter, JsonFormatter) == (fmt == "json")
    finally:
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])
