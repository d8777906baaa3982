import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from omni import errors
from omni.errors import APIError
from omni.http.body import read_json
from omni.http.errors import error_middleware
from omni.serving.errors import api_error
from omni.shared.media.errors import MediaError
from tests.omni.serving.test_errors import CASES, IDS


async def _raise_api_error(request: web.Request) -> web.Response:
    raise errors.model_not_found("nope")


async def _crash(request: web.Request) -> web.Response:
    raise RuntimeError("secret detail")


async def _echo(request: web.Request) -> web.Response:
    return web.json_response(await read_json(request))


async def _unavailable(request: web.Request) -> web.Response:
    raise errors.service_unavailable("The server is starting.", retry_after_s=5)


async def _bad_media(request: web.Request) -> web.Response:
    raise MediaError("could not decode image in messages[0].content[1]", param="messages[0].content[1]")


async def _redirect(request: web.Request) -> web.Response:
    raise web.HTTPFound("/elsewhere")


def make_app() -> web.Application:
    app = web.Application(middlewares=[error_middleware], client_max_size=64)
    app.router.add_get("/model", _raise_api_error)
    app.router.add_get("/crash", _crash)
    app.router.add_post("/echo", _echo)
    app.router.add_get("/unavailable", _unavailable)
    app.router.add_get("/redirect", _redirect)
    app.router.add_get("/media", _bad_media)
    return app


def test_api_error_shape() -> None:
    e = errors.bad_request("bad temperature", param="temperature", code="invalid_value")
    assert e.status == 400
    assert e.to_dict() == {
        "error": {
            "message": "bad temperature",
            "type": "invalid_request_error",
            "param": "temperature",
            "code": "invalid_value",
        }
    }
    assert errors.internal_error().to_dict()["error"]["type"] == "server_error"
    assert errors.payload_too_large("big").status == 413
    assert errors.unauthorized().status == 401
    assert APIError(418, "teapot").type == "invalid_request_error"


async def test_middleware() -> None:
    async with TestClient(TestServer(make_app())) as client:
        r = await client.get("/model")
        assert r.status == 404
        assert r.content_type == "application/json"
        assert await r.json() == {
            "error": {
                "message": "The model `nope` does not exist.",
                "type": "invalid_request_error",
                "param": "model",
                "code": "model_not_found",
            }
        }

        r = await client.get("/no/such/route")
        assert r.status == 404
        assert (await r.json())["error"] == {
            "message": "Unknown route: GET /no/such/route",
            "type": "invalid_request_error",
            "param": None,
            "code": "not_found",
        }

        r = await client.get("/echo")
        assert r.status == 405
        assert r.headers["Allow"] == "POST"
        assert (await r.json())["error"]["message"] == "Method GET is not allowed for /echo"

        r = await client.post("/echo", data=b'{"a": "' + b"x" * 100 + b'"}')
        assert r.status == 413
        body = await r.json()
        assert body["error"]["code"] == "payload_too_large"
        assert "64" in body["error"]["message"]

        r = await client.post("/echo", data=b'{"a": 1}')
        assert r.status == 200
        assert await r.json() == {"a": 1}

        r = await client.post("/echo", data=b"{not json")
        assert r.status == 400
        assert (await r.json())["error"]["message"].startswith("The request body is not valid JSON")

        r = await client.post("/echo", data=b"[1, 2]")
        assert r.status == 400
        assert (await r.json())["error"]["message"] == "The request body must be a JSON object."

        r = await client.get("/crash")
        assert r.status == 500
        assert r.content_type == "application/json"
        assert await r.json() == {
            "error": {
                "message": "The server had an error while processing your request.",
                "type": "server_error",
                "param": None,
                "code": None,
            }
        }

        r = await client.get("/unavailable")
        assert r.status == 503
        assert r.headers["Retry-After"] == "5"
        assert (await r.json())["error"]["code"] == "service_unavailable"

        r = await client.get("/redirect", allow_redirects=False)
        assert r.status == 302
        assert r.headers["Location"] == "/elsewhere"


async def test_media_error_is_a_400_naming_the_part() -> None:
    async with TestClient(TestServer(make_app())) as client:
        r = await client.get("/media")
        assert r.status == 400
        assert await r.json() == {
            "error": {
                "message": "could not decode image in messages[0].content[1]",
                "type": "invalid_request_error",
                "param": "messages[0].content[1]",
                "code": None,
            }
        }


@pytest.mark.parametrize("exc", [c[0] for c in CASES], ids=IDS)
async def test_the_middleware_answers_as_the_one_mapping_does(exc: BaseException) -> None:
    """What a realtime response's error event says too (omni/serving/errors.py)."""

    async def _raise(request: web.Request) -> web.Response:
        raise exc

    app = web.Application(middlewares=[error_middleware])
    app.router.add_get("/raise", _raise)
    expected = api_error(exc)
    assert expected is not None
    async with TestClient(TestServer(app)) as client:
        r = await client.get("/raise")
        assert r.status == expected.status
        assert (await r.json())["error"] == {
            "message": expected.message, "type": expected.type, "param": expected.param, "code": expected.code
        }
        assert all(r.headers[k] == v for k, v in expected.headers.items())
