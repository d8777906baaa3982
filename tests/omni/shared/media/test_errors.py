"""MediaError: the media layer's one error, the client's; the server answers it as a 400 that
names the part it came from."""

from __future__ import annotations

import orjson
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from omni.http.errors import error_middleware
from omni.shared.media.errors import MediaError


def test_it_is_a_value_error_carrying_the_part() -> None:
    error = MediaError("The image could not be decoded.", param="messages[0].content[1]")
    assert isinstance(error, ValueError)
    assert (str(error), error.message, error.param) == ("The image could not be decoded.", error.message, "messages[0].content[1]")


async def test_the_server_answers_it_as_a_400_naming_the_part() -> None:
    async def handler(request: web.Request) -> web.StreamResponse:
        raise MediaError("Unsupported audio format 'ogg'.", param="messages[1].content[0]")

    response = await error_middleware(make_mocked_request("POST", "/v1/chat/completions"), handler)
    assert response.status == 400
    body = orjson.loads(response.body)  # type: ignore[attr-defined]
    assert body["error"]["message"] == "Unsupported audio format 'ogg'."
    assert body["error"]["param"] == "messages[1].content[0]"
