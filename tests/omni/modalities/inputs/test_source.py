import asyncio
import base64
import ipaddress
from collections.abc import AsyncIterator

import aiohappyeyeballs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from omni.modalities.inputs import source
from omni.modalities.inputs.source import decode_base64, is_public_address, load_media_bytes
from omni.shared.media.errors import MediaError
from omni.shared.media.limits import MediaLimits

PARAM = "messages[0].content[1].image_url.url"
REMOTE = MediaLimits(allow_remote=True)
BODY = b"\x89PNG fake image bytes" * 10


async def _error(url: str, limits: MediaLimits = REMOTE) -> MediaError:
    with pytest.raises(MediaError) as e:
        await load_media_bytes(url, limits, PARAM)
    assert e.value.param == PARAM
    return e.value


# --- data: URLs ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "prefix",
    ["data:image/png;base64,", "DATA:image/png;base64,", "data:audio/wav;rate=16000;base64,"],
)
async def test_data_url(prefix: str) -> None:
    url = prefix + base64.b64encode(BODY).decode()
    assert await load_media_bytes(url, MediaLimits(), PARAM) == BODY


@pytest.mark.parametrize(
    "url",
    [
        "data:image/png;base64",  # no comma
        "data:image/png," + base64.b64encode(BODY).decode(),  # not base64-encoded
        "data:;base64," + base64.b64encode(BODY).decode(),  # no mime type
        "data:png;base64," + base64.b64encode(BODY).decode(),  # not a mime type
        "data:image/png;base64,not*base64!",
        "data:image/png;base64,abc",  # bad padding
    ],
)
async def test_malformed_data_url(url: str) -> None:
    error = await _error(url, MediaLimits())
    assert PARAM in error.message


async def test_data_url_byte_limit() -> None:
    url = "data:image/png;base64," + base64.b64encode(BODY).decode()
    error = await _error(url, MediaLimits(max_bytes=len(BODY) - 1))
    assert "max_bytes" in error.message
    assert await load_media_bytes(url, MediaLimits(max_bytes=len(BODY)), PARAM) == BODY


def test_decode_base64_limit_refuses_before_decoding() -> None:
    with pytest.raises(MediaError) as e:
        decode_base64("A" * 4_000, MediaLimits(max_bytes=100), "input_audio.data")
    assert e.value.param == "input_audio.data"


# --- remote URLs: policy and address filter (no connection is ever made) -------------------


@pytest.fixture
def no_connections(monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a connection was attempted")

    monkeypatch.setattr(aiohappyeyeballs, "start_connection", refuse)


async def test_remote_disabled_by_default(no_connections: None) -> None:
    error = await _error("https://example.com/cat.png", MediaLimits())
    assert "--allow-remote-media" in error.message


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://example.com/a.png", "cat.png", ""])
async def test_unsupported_schemes(url: str, no_connections: None) -> None:
    await _error(url)


@pytest.mark.parametrize(
    "host",
    [
        "127.0.0.1", "localhost", "[::1]", "10.0.0.1", "172.16.5.4", "192.168.1.1",
        "169.254.169.254", "[fe80::1]", "224.0.0.1", "[ff02::1]", "0.0.0.0", "240.0.0.1",
        "[::ffff:127.0.0.1]", "[fc00::1]",
    ],
)
async def test_non_public_addresses_refused(host: str, no_connections: None) -> None:
    error = await _error(f"http://{host}:8080/a.png")
    assert "non-public address" in error.message


@pytest.mark.parametrize(
    ("address", "public"),
    [("8.8.8.8", True), ("2606:4700:4700::1111", True), ("100.64.0.1", False),
     ("192.0.2.1", False), ("::", False)],
)
def test_is_public_address(address: str, public: bool) -> None:
    assert is_public_address(ipaddress.ip_address(address)) is public


# --- remote URLs: fetching from a loopback test server, treated as public here -------------


@pytest.fixture
async def server(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[TestServer]:
    loopback = {ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1")}
    monkeypatch.setattr(source, "is_public_address", lambda ip: ip in loopback)

    async def ok(request: web.Request) -> web.Response:
        return web.Response(body=BODY)

    async def chunked(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        for _ in range(10):
            await resp.write(BODY)
        return resp

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(5)
        return web.Response(body=BODY)

    def redirect(location: str):  # type: ignore[no-untyped-def]
        async def handler(request: web.Request) -> web.Response:
            raise web.HTTPFound(location)

        return handler

    app = web.Application()
    app.router.add_get("/ok", ok)
    app.router.add_get("/chunked", chunked)
    app.router.add_get("/slow", slow)
    app.router.add_get("/to-ok", redirect("/ok"))
    app.router.add_get("/to-private", redirect("http://10.0.0.1/secret"))
    app.router.add_get("/loop", redirect("/loop"))
    srv = TestServer(app, host="127.0.0.1")
    await srv.start_server()
    yield srv
    await srv.close()


def _url(server: TestServer, path: str, host: str = "127.0.0.1") -> str:
    return f"http://{host}:{server.port}{path}"


async def test_fetch(server: TestServer) -> None:
    assert await load_media_bytes(_url(server, "/ok"), REMOTE, PARAM) == BODY


async def test_fetch_by_host_name_goes_through_the_checking_resolver(server: TestServer) -> None:
    assert await load_media_bytes(_url(server, "/ok", "localhost"), REMOTE, PARAM) == BODY


async def test_redirect_followed(server: TestServer) -> None:
    assert await load_media_bytes(_url(server, "/to-ok"), REMOTE, PARAM) == BODY


async def test_redirect_to_private_address_refused(server: TestServer) -> None:
    assert "non-public address 10.0.0.1" in (await _error(_url(server, "/to-private"))).message


async def test_too_many_redirects(server: TestServer) -> None:
    assert "Too many redirects" in (await _error(_url(server, "/loop"))).message


async def test_http_error_status(server: TestServer) -> None:
    assert "HTTP 404" in (await _error(_url(server, "/missing"))).message


@pytest.mark.parametrize("path", ["/ok", "/chunked"])  # Content-Length, then counted chunks
async def test_remote_byte_limit(server: TestServer, path: str) -> None:
    limits = MediaLimits(allow_remote=True, max_bytes=len(BODY) - 1)
    assert "max_bytes" in (await _error(_url(server, path), limits)).message


async def test_remote_timeout(server: TestServer) -> None:
    limits = MediaLimits(allow_remote=True, remote_fetch_timeout_s=0.2)
    assert "longer than 0.2 s" in (await _error(_url(server, "/slow"), limits)).message
