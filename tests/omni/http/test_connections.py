"""The connection guard leans on three private fields of aiohttp's RequestHandler: this fails
first if an aiohttp upgrade removes them (the header deadline would then never fire)."""

from __future__ import annotations

from aiohttp.web_protocol import RequestHandler

from omni.http.connections import _raw_response


def test_the_request_handler_fields_the_guard_reads_exist() -> None:
    slots = {name for cls in RequestHandler.__mro__ for name in getattr(cls, "__slots__", ())}
    assert {"_request_count", "_waiter", "_messages", "_manager"} <= slots


def test_a_raw_response_is_whole_http_with_an_openai_error() -> None:
    raw = _raw_response(408, "Request Timeout", "slow", "request_timeout")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    assert f"Content-Length: {len(body)}".encode() in head
    assert body == b'{"error":{"message":"slow","type":"invalid_request_error","param":null,"code":"request_timeout"}}'
