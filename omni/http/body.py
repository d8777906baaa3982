"""Reading a request's body off the connection: JSON bodies read in chunks, decoded (and
parsed) in a worker thread when large, and the multipart forms (transcriptions, image edits), each bounded
by --body-timeout; and the request headers every endpoint shares. The HTTP layer's only door to
a body: handlers read here, then hand the parsed request to its endpoint's lifecycle in omni/serving/."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import orjson
from aiohttp import BodyPartReader, web
from aiohttp.http_exceptions import HttpProcessingError

from omni.errors import APIError, bad_request
from omni.http.json_body import TooManyItems, decode_json, empty_in_steps
from omni.http.state import CONFIG
from omni.serving.requests.fields import Json, body_too_slow, merge_extra_body
from omni.serving.requests.image_edits import FILE_PARTS as IMAGE_FILE_PARTS
from omni.serving.requests.image_edits import ImageEditForm
from omni.serving.requests.transcriptions import TranscriptionForm

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
# A multipart form's bounds besides the file's: a text value (the transcription prompt's 4096
# characters are at most 16 KiB), and the number of parts.
MAX_FIELD_BYTES = 64 * 1024
MAX_PARTS = 64

T = TypeVar("T")


def body_timeout(request: web.Request) -> float | None:
    """--body-timeout: how long a body may take to arrive."""
    config = request.app.get(CONFIG)  # an app built without create_app (tests) has none
    return None if config is None else config.body_timeout


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


# ----------------------------------------------------------------------------- multipart


async def read_transcription_form(
    request: web.Request, *, max_file_bytes: int, timeout: float | None = None
) -> TranscriptionForm:
    """The multipart body's parts (omni/serving/requests/transcriptions.py reads their values).
    Not multipart, or malformed, is a 400; a file over max_file_bytes a 413 naming `file`; a
    body over client_max_size a 413; one that has not arrived within timeout seconds a 408, and
    the connection is closed."""
    fields, files = await _read_form(request, {"file": max_file_bytes}, "the audio as a file part named 'file'", timeout)
    audio = files.get("file", [])
    if len(audio) > 1:
        raise bad_request("'file' is given twice; send one audio file.", param="file")
    return TranscriptionForm(fields, audio[0] if audio else None)


async def read_image_edit_form(
    request: web.Request, *, max_file_bytes: int, timeout: float | None = None
) -> ImageEditForm:
    """The images API's edit form (omni/serving/requests/image_edits.py reads its values): as
    read_transcription_form, each image (`image`, `image[]`) and the mask bounded by
    max_file_bytes."""
    limits = {name: max_file_bytes for name in IMAGE_FILE_PARTS}
    fields, files = await _read_form(request, limits, "the image as a file part named 'image'", timeout)
    return ImageEditForm(fields, files)


async def _read_form(
    request: web.Request, file_bytes: Mapping[str, int], what: str, timeout: float | None
) -> tuple[dict[str, list[str]], dict[str, list[bytes]]]:
    if request.content_type != "multipart/form-data":
        raise bad_request(
            f"The request body must be multipart/form-data ({what}), not {request.content_type or 'empty'}.",
            code="invalid_content_type",
        )
    limit = request.client_max_size
    declared = request.content_length
    if limit and declared is not None and declared > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=declared)
    try:
        async with asyncio.timeout(timeout):
            return await _read_parts(request, file_bytes)
    except TimeoutError:
        raise body_too_slow(timeout) from None
    # aiohttp's multipart parser: its own errors (a bad part header is an HttpProcessingError) and
    # the ones it lets through from a body that is not what its boundary says
    except (HttpProcessingError, ValueError, RuntimeError, AssertionError, LookupError) as e:
        raise bad_request(f"The multipart body is malformed: {getattr(e, 'message', None) or e}") from None


async def _read_parts(
    request: web.Request, file_bytes: Mapping[str, int]
) -> tuple[dict[str, list[str]], dict[str, list[bytes]]]:
    """The text parts' values and the file parts' bytes (file_bytes: the files' names and their
    bounds), each by its name without a trailing `[]`, in the order sent."""
    reader = await request.multipart()
    fields: dict[str, list[str]] = {}
    files: dict[str, list[bytes]] = {}
    total = 0  # every part's bytes, against client_max_size (the reader counts none of them)
    num_parts = 0
    while (part := await reader.next()) is not None:
        num_parts += 1
        if num_parts > MAX_PARTS:
            raise bad_request(f"The body has more than {MAX_PARTS} parts.")
        if not isinstance(part, BodyPartReader):
            raise bad_request("A part of the body is itself multipart; send each field as one part.")
        if not part.name:
            raise bad_request("A part of the body has no name (Content-Disposition: form-data; name=...).")
        name = part.name.removesuffix("[]")
        is_file = name in file_bytes
        max_bytes = file_bytes[name] if is_file else MAX_FIELD_BYTES
        data = bytearray()
        while chunk := await part.read_chunk(_READ_CHUNK_BYTES):
            data += chunk
            total += len(chunk)
            if request.client_max_size and total > request.client_max_size:
                raise web.HTTPRequestEntityTooLarge(max_size=request.client_max_size, actual_size=total)
            if len(data) > max_bytes:
                raise _too_large(name, max_bytes, is_file)
        if is_file:
            files.setdefault(name, []).append(bytes(data))
            continue
        try:
            value = data.decode(part.get_charset("utf-8"))
        except UnicodeDecodeError:
            raise bad_request(f"The value of '{name}' is not valid text in its charset.", param=name) from None
        fields.setdefault(name, []).append(value)
    return fields, files


def _too_large(name: str, max_bytes: int, is_file: bool) -> APIError:
    what = "(--max-media-bytes)" if is_file else "(the bound of a form field)"
    return APIError(
        413, f"'{name}' is larger than {max_bytes} bytes {what}.", param=name, code="payload_too_large"
    )


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
