"""The browser playground (`--ui`, on by default): GET /playground serves the page, GET
/playground/{name} its scripts and style, and GET / redirects to the page. The files are
package data (omni/http/playground/): static, no CDN, no build step. docs/PLAYGROUND.md.

The page calls the API with relative URLs under a <base href> that the server writes in: the
root path (`--root-path`, behind a proxy) is where the browser sees the API, whichever form of
the path the proxy passed on. The page, its files and / are served without the API key (a
browser's navigation cannot send one); every call the page makes carries the key it was given.
"""

from __future__ import annotations

import functools
import html
import json
from collections.abc import Iterable
from importlib import resources
from pathlib import Path

from aiohttp import web

from omni.errors import not_found
from omni.http.state import CONFIG, MODELS
from omni.serving.model import ServedModel

PLAYGROUND_PATH = "/playground"
ASSET_ROUTE = PLAYGROUND_PATH + "/{name}"
# Every file the page may load, by name, and its type: nothing else under the folder is served.
ASSETS = {
    "app.js": "text/javascript",
    "api.js": "text/javascript",
    "chat.js": "text/javascript",
    "images.js": "text/javascript",
    "voice.js": "text/javascript",
    "player.js": "text/javascript",
    "capture-worklet.js": "text/javascript",
    "style.css": "text/css",
}
_ROOT_MARK = "__ROOT_PATH__"
_MODELS_MARK = "__MODEL_HINTS__"
# What the page may load and reach: its own files and API, and images or audio from anywhere
# (an S3 store's signed URLs are on another host). A CDN script would be refused.
_CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src * data: blob:; "
    "media-src * data: blob:; connect-src 'self' ws: wss:; object-src 'none'; base-uri 'self'"
)
_HEADERS = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff", "Content-Security-Policy": _CSP}


@functools.cache
def _read(name: str) -> bytes:
    return (resources.files("omni.http") / "playground" / name).read_bytes()


def page_html(root_path: str, hints: dict[str, str] | None = None) -> str:
    """index.html with its <base href> at the root path ("" -> "/", "/omni" -> "/omni/") and the
    model each tab opens on (model_hints) in a <meta>, which the page reads."""
    text = _read("index.html").decode().replace(_ROOT_MARK, html.escape(root_path, quote=True))
    return text.replace(_MODELS_MARK, html.escape(json.dumps(hints or {}), quote=True))


def model_hints(models: Iterable[ServedModel]) -> dict[str, str]:
    """The model each tab opens on. Chat: the first served model with trained weights, so a
    first question gets an answer, not noise (a bare omni-serve serves the random embedded
    default and SmolLM2 beside it); images and voice: the first that makes more than text (and,
    for voice, hears). Each falls back to the first model; the listing's order is the served one."""
    served = list(models)
    if not served:
        return {}
    first = served[0].name

    def pick(able: list[ServedModel]) -> str:
        return able[0].name if able else first

    return {
        "chat": pick([m for m in served if not random_weights(m.pool.config.model_dir)]),
        "images": pick([m for m in served if m.outputs]),
        "voice": pick([m for m in served if m.outputs and m.media is not None]),
    }


@functools.cache
def random_weights(model_dir: Path) -> bool:
    """Whether the checkpoint says its weights are random (config.json's random_weights, which the
    embedded default has: gpu_workers/tiny/published.py make_embedded_default)."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text())
    except (OSError, ValueError):  # a GGUF file, or no readable config: nothing says so
        return False
    return isinstance(config, dict) and config.get("random_weights") is True


async def page(request: web.Request) -> web.Response:
    registry = request.app[MODELS]
    text = page_html(request.app[CONFIG].root_path, model_hints(registry))
    return web.Response(text=text, content_type="text/html", charset="utf-8", headers=_HEADERS)


async def asset(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in ASSETS:
        raise not_found(f"The playground has no file `{name}`.")
    return web.Response(body=_read(name), content_type=ASSETS[name], charset="utf-8", headers=_HEADERS)


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPFound(request.app[CONFIG].root_path + PLAYGROUND_PATH)
