"""A client gone before its response is written ends the request quietly; the same error on a
live connection is still a server error."""

from __future__ import annotations

import logging
from unittest import mock

import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from omni.http.app import client_gone_middleware
from omni.http.errors import error_middleware


def request(closing: bool) -> web.Request:
    transport = mock.Mock()
    transport.is_closing.return_value = closing
    return make_mocked_request("POST", "/v1/chat/completions", transport=transport)


async def reset(_: web.Request) -> web.StreamResponse:
    raise ConnectionResetError("Cannot write to closing transport")


async def both(req: web.Request) -> web.StreamResponse:
    """error_middleware outside client_gone_middleware, as create_app orders them."""

    async def inner(r: web.Request) -> web.StreamResponse:
        return await client_gone_middleware(r, reset)

    return await error_middleware(req, inner)


async def test_a_reset_from_a_gone_client_is_quiet(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        response = await both(request(closing=True))
    assert response.status == 499
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_a_reset_on_a_live_connection_is_a_500(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        response = await both(request(closing=False))
    assert response.status == 500
    assert any("unhandled error" in r.getMessage() for r in caplog.records)
