"""The aiohttp application factory: state, routes, and the resources it owns."""

from __future__ import annotations

import asyncio
import hmac
import logging
from collections.abc import AsyncIterator

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from omni.config import ServerConfig
from omni.errors import unauthorized
from omni.http import openapi
from omni.http.access_log import add_request_id_header, request_id_middleware
from omni.http.cors import install_cors
from omni.http.errors import error_middleware
from omni.http.handlers import (
    artifacts,
    chat,
    completions,
    images,
    playground,
    realtime,
    responses,
    speech,
    system,
    tokenize,
    transcriptions,
)
from omni.http.metrics_middleware import http_metrics_middleware
from omni.http.state import CONFIG, METRICS, MODELS, RESPONSES, STORE, VAD
from omni.http.stats_line import log_stats_forever
from omni.metrics import Metrics
from omni.modalities.inputs.voice_activity import LazyVoiceActivityModel
from omni.serving import assembly
from omni.serving.model import ModelRegistry
from omni.serving.requests.image_edits import IMAGE_EDITS_PATH
from omni.serving.requests.responses import RESPONSES_PATH
from omni.serving.requests.speech import SPEECH_PATH
from omni.serving.requests.transcriptions import TRANSCRIPTIONS_PATH
from omni.serving.responses.store import ResponseStore
from omni.shared.store.spec import StoreSpec

log = logging.getLogger("omni.http.app")

# Finishes when every engine has a ready worker; raises if one could not start.
STARTUP = web.AppKey("startup", asyncio.Task)

_OPEN_PATHS = frozenset({"/health", "/ready", "/ping", "/version", "/metrics", "/openapi.json"})  # the API's shape is no secret
_OPEN_PREFIXES = (artifacts.ARTIFACT_PATH,)
# The playground's page and files (--ui): a browser's navigation sends no key; the page's calls do.
_UI_PATHS = frozenset({"/", playground.PLAYGROUND_PATH})
_UI_PREFIXES = (playground.PLAYGROUND_PATH + "/",)


# nginx's status for "the client closed the connection first": nobody reads it, but a
# response must be returned for aiohttp to finish the request quietly.
_CLIENT_GONE = 499


@web.middleware
async def client_gone_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A client that leaves before its response is written is no server error.

    Writing the headers (or an event) to a connection the client has reset raises
    ConnectionResetError, before the handler's cancellation (handler_cancellation) arrives.
    Left to error_middleware, that would be logged as an unhandled error with its traceback;
    here it ends the request quietly. The same error on a live connection (a store, a fetch)
    is a real failure, and passes on."""
    try:
        return await handler(request)
    except ConnectionResetError:
        transport = request.transport
        if transport is not None and not transport.is_closing():
            raise
        log.debug("%s %s: the client left before its response was written", request.method, request.path)
        return web.Response(status=_CLIENT_GONE)


def _auth_middleware(api_key: str, root_path: str, *, ui: bool = False) -> Middleware:
    expected = f"Bearer {api_key}".encode()
    open_paths = _OPEN_PATHS | _UI_PATHS if ui else _OPEN_PATHS
    open_prefixes = _OPEN_PREFIXES + _UI_PREFIXES if ui else _OPEN_PREFIXES

    @web.middleware
    async def auth(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if root_path and (path == root_path or path.startswith(root_path + "/")):
            path = path[len(root_path) :] or "/"
        if path not in open_paths and not path.startswith(open_prefixes):
            given = request.headers.get("Authorization", "").encode()
            if not hmac.compare_digest(given, expected) and not _subprotocol_key(request, api_key):
                raise unauthorized("Incorrect API key provided.")
        return await handler(request)

    return auth


def _subprotocol_key(request: web.Request, api_key: str) -> bool:
    """A browser's WebSocket cannot set headers: OpenAI's clients send the key as the subprotocol
    `openai-insecure-api-key.<key>` (GET /v1/realtime), which is taken as the header would be."""
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return False
    expected = f"{realtime.KEY_PROTOCOL}{api_key}".encode()
    offered = request.headers.get("Sec-WebSocket-Protocol", "")
    return any(hmac.compare_digest(p.strip().encode(), expected) for p in offered.split(","))


async def _models_ctx(app: web.Application) -> AsyncIterator[None]:
    """The served models (omni/serving/assembly.py builds them and starts their workers)."""
    async with assembly.models(app[CONFIG].models, app[MODELS], app[STORE], app[METRICS]) as startup:
        app[STARTUP] = startup
        yield


async def _stats_ctx(app: web.Application) -> AsyncIterator[None]:
    interval = app[CONFIG].log_stats_interval
    task = None
    if interval is not None:
        task = asyncio.create_task(log_stats_forever(app[METRICS].registry, interval), name="stats-line")
    try:
        yield
    finally:
        if task is not None:
            task.cancel()


async def _store_ctx(app: web.Application) -> AsyncIterator[None]:
    config = app[CONFIG]
    settings = config.store
    spec = StoreSpec.parse(settings.location)
    store = spec.open(
        url_base=settings.url_base or config.base_url,
        secret=settings.secret,
        endpoint_url=settings.endpoint_url,
        region=settings.region,
    )
    await store.start()
    app[STORE] = store
    try:
        yield
    finally:
        await store.close()


async def _responses_ctx(app: web.Application) -> AsyncIterator[None]:
    """Stored responses (written through to the artifact store); background runs are cancelled
    before the models stop."""
    app[RESPONSES] = store = ResponseStore(artifacts=app[STORE])
    try:
        yield
    finally:
        await store.close()


def create_app(config: ServerConfig) -> web.Application:
    # Outermost first: errors become OpenAI error objects, unless the client is gone.
    metrics = Metrics()
    # The HTTP metrics outermost: they see the status the client gets (errors already JSON).
    middlewares: list[Middleware] = [
        http_metrics_middleware(metrics, root_path=config.root_path),
        request_id_middleware,
        error_middleware,
        client_gone_middleware,
    ]
    if config.api_key:
        middlewares.append(_auth_middleware(config.api_key, config.root_path, ui=config.ui))
    app = web.Application(client_max_size=config.max_request_bytes, middlewares=middlewares)
    app.on_response_prepare.append(add_request_id_header)
    if config.cors is not None:
        install_cors(app, config.cors)  # outermost: preflights are answered before auth
    app[CONFIG] = config
    app[METRICS] = metrics
    app[MODELS] = ModelRegistry()
    app[VAD] = LazyVoiceActivityModel()
    app.cleanup_ctx.append(_store_ctx)
    app.cleanup_ctx.append(_models_ctx)
    app.cleanup_ctx.append(_responses_ctx)
    app.cleanup_ctx.append(_stats_ctx)
    add_routes(app, config.root_path)
    if config.ui:
        add_playground_routes(app, config.root_path)
    return app


def add_routes(app: web.Application, root_path: str = "") -> None:
    """Every route of the API (tests that build an app of their own take them from here).

    With a root path ("/omni", behind a proxy) each route answers under it too: a proxy that
    strips the prefix and one that passes it through both work."""
    _add_routes(app, "")
    if root_path:
        _add_routes(app, root_path)


def _add_routes(app: web.Application, prefix: str) -> None:
    router = _PrefixedRouter(app.router, prefix)
    router.add_post("/v1/chat/completions", chat.create_chat_completion)
    router.add_post("/v1/completions", completions.create_completion)
    router.add_post("/v1/images/generations", images.create_image)
    router.add_post(IMAGE_EDITS_PATH, images.create_image_edit)
    router.add_post(RESPONSES_PATH, responses.create_response)
    router.add_get(RESPONSES_PATH + "/{response_id}", responses.get_response)
    router.add_delete(RESPONSES_PATH + "/{response_id}", responses.delete_response)
    router.add_post(RESPONSES_PATH + "/{response_id}/cancel", responses.cancel_response)
    router.add_post(SPEECH_PATH, speech.create_speech)
    router.add_post(TRANSCRIPTIONS_PATH, transcriptions.create_transcription)
    router.add_get(realtime.REALTIME_PATH, realtime.realtime)
    router.add_get("/v1/models", system.list_models)
    router.add_get("/v1/models/{model}", system.get_model)
    router.add_get("/health", system.health)
    router.add_get("/ready", system.health)
    router.add_get("/ping", system.health)  # vLLM's name for it, GET and POST
    router.add_post("/ping", system.health)
    router.add_get("/version", system.version)
    router.add_post(tokenize.TOKENIZE_PATH, tokenize.tokenize)
    router.add_post(tokenize.DETOKENIZE_PATH, tokenize.detokenize)
    router.add_get("/metrics", system.metrics)
    router.add_get(openapi.OPENAPI_PATH, openapi.openapi_handler)
    # Signed URLs of the local store; the signature is the authorization (no bearer key).
    router.add_get(artifacts.ARTIFACT_ROUTE, artifacts.get_artifact)


def add_playground_routes(app: web.Application, root_path: str = "") -> None:
    """The browser playground (--ui), at /playground, with / redirecting to it; under a root
    path too, as add_routes does (the root path's own URL, "/omni", redirects as well)."""
    for prefix in ("", root_path) if root_path else ("",):
        app.router.add_get(prefix + "/", playground.home)
        app.router.add_get(prefix + playground.PLAYGROUND_PATH, playground.page)
        app.router.add_get(prefix + playground.PLAYGROUND_PATH + "/", playground.page)
        app.router.add_get(prefix + playground.ASSET_ROUTE, playground.asset)
    if root_path:
        app.router.add_get(root_path, playground.home)


class _PrefixedRouter:
    """add_get/add_post under a path prefix."""

    def __init__(self, router: web.UrlDispatcher, prefix: str) -> None:
        self._router = router
        self._prefix = prefix

    def add_get(self, path: str, handler: Handler) -> None:
        self._router.add_get(self._prefix + path, handler)

    def add_post(self, path: str, handler: Handler) -> None:
        self._router.add_post(self._prefix + path, handler)

    def add_delete(self, path: str, handler: Handler) -> None:
        self._router.add_delete(self._prefix + path, handler)
