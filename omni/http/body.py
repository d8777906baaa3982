"""Reading a request's body off the connection: JSON bodies read in chunks, decoded (and
parsed) in a worker thread when large, bounded by --body-timeout; and the request headers every
endpoint shares. The HTTP layer's only door to a body: handlers read here, then hand the parsed
request to omni/serving/lifecycle.py."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from typing import Any, TypeVar

import orjson
from aiohttp import web

from omni.errors import bad_request
from omni.http.json_body import TooManyItems, decode_json, empty_in_steps
from omni.serving.requests.fields import Json, body_too_slow, merge_extra_body

# Bodies larger than this are decoded, and parsed, in a worker thread: json_body.decode_json
# decodes them a window at a time (orjson holds the GIL for each of its calls, about 2.5 ms a
# megabyte of strings and 11 of small values on a small box), and parsing one is Python over
# every value it holds, seconds for hundreds of thousands of messages, which the loop shares
# through the GIL's switch interval instead of waiting out.
_DECODE_IN_THREAD_BYTES = 1 << 20
# What the body's stream buffers before readany() hands it over: each chunk is one short copy
# into the body's buffer (aiohttp's own read() raises this to the whole body, then copies the
# body it joined into bytes: 60 MB in one call).
_READ_CHUNK_BYTES = 256 * 1024

T = TypeVar("T")


async def read_json(request: web.Request, *, timeout: float | None = None) -> dict[str, Json]:
    """The request body as a JSON object. A body over client_max_size is a 413 (aiohttp's
    error); one that has not arrived within timeout seconds is a 408, and the connection is
    closed."""
    return await read_parsed(request, _as_is, timeout=timeout)


async def read_parsed(
    request: web.Request, parse: Callable[[dict[str, Json]], T], *, timeout: float | None = None
) -> T:
    """parse(the body as read_json reads it): in one worker thread with the decoding when the
    body is large, on the loop otherwise."""
    try:
        async with asyncio.timeout(timeout):
            raw = await _read_body(request)
    except TimeoutError:
        raise body_too_slow(timeout) from None
    if len(raw) > _DECODE_IN_THREAD_BYTES:
        return await asyncio.to_thread(_decode_and_parse, raw, parse, decode_json)
    return _decode_and_parse(raw, parse, orjson.loads)


def _as_is(body: dict[str, Json]) -> dict[str, Json]:
    return body


def _decode_and_parse(
    raw: bytearray, parse: Callable[[dict[str, Json]], T], decode: Callable[[bytearray], Any]
) -> T:
    try:
        data = decode(raw)
    except orjson.JSONDecodeError as e:
        raise bad_request(f"The request body is not valid JSON: {e}") from None
    except TooManyItems as e:
        raise bad_request(f"The request body is too large: {e}.", code="array_above_max_length") from None
    if not isinstance(data, dict):
        raise bad_request("The request body must be a JSON object.")
    try:
        return parse(merge_extra_body(data))
    except BaseException:
        # Refused: nothing else holds the body, which the error's traceback would otherwise
        # free, wherever it ends, in one C call (8 million ids: ~250 ms with the GIL held).
        empty_in_steps(data)
        raise




async def _read_body(request: web.Request) -> bytearray:
    """The body in one buffer, grown chunk by chunk, so that no step copies the whole body:
    a large buffer grows in place (realloc remaps its pages), and preallocating it from
    Content-Length would zero-fill it all at once."""
    limit = request.client_max_size
    declared = request.content_length
    if limit and declared is not None and declared > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=declared)
    body = bytearray()
    stream = request.content
    stream.set_read_chunk_size(_READ_CHUNK_BYTES)
    while chunk := await stream.readany():
        body += chunk
        if limit and len(body) > limit:  # a compressed body inflates past Content-Length
            raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body))
    return body


# ----------------------------------------------------------------------------- headers

# A header, not a body field: it means the same on every endpoint, and neither OpenAI's nor
# vLLM's body has a field for it (the OpenAI client's own timeout never reaches the server).
REQUEST_TIMEOUT_HEADER = "X-Request-Timeout"


def request_timeout(request: web.Request) -> float | None:
    """The deadline the client asks for, in seconds from its prompt being ready; the server's
    --request-timeout caps it (ModelPool.admit)."""
    text = request.headers.get(REQUEST_TIMEOUT_HEADER)
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0.0):
        raise bad_request(
            f"The {REQUEST_TIMEOUT_HEADER} header must be a positive number of seconds, got {text!r}.",
            code="invalid_header",
        )
    return value
