"""Model listing, health, version and metrics endpoints."""

from __future__ import annotations

import functools
import importlib.metadata
from pathlib import Path

import tomllib
from aiohttp import web

from omni.http.sse import json_response
from omni.http.state import METRICS, MODELS
from omni.serving.bodies import Health, Model, ModelList, Version
from omni.serving.model import ServedModel


def _model_card(model: ServedModel) -> Model:
    return Model(
        id=model.name,
        object="model",
        created=model.created,
        owned_by="omni-serve",
        max_model_len=model.pool.max_model_len or None,
    )


async def list_models(request: web.Request) -> web.Response:
    models = [_model_card(m) for m in request.app[MODELS]]
    return await json_response(ModelList(object="list", data=models))


async def get_model(request: web.Request) -> web.Response:
    model = request.app[MODELS].get(request.match_info["model"])
    return await json_response(_model_card(model))


async def health(request: web.Request) -> web.Response:
    """200 only when every model's worker is up and ready to take requests."""
    registry = request.app[MODELS]
    if registry.all_ready:
        return await json_response(Health(status="ok"))
    waiting = [m.name for m in registry if not m.ready]
    return await json_response(Health(status="starting", not_ready=waiting), status=503)


async def version(request: web.Request) -> web.Response:
    return await json_response(Version(package_version()))


@functools.cache
def package_version() -> str:
    """The installed distribution's version; from a source tree that is not installed, the
    version pyproject.toml gives."""
    try:
        return importlib.metadata.version("omni-serve")
    except importlib.metadata.PackageNotFoundError:
        pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return str(tomllib.loads(pyproject.read_text())["project"]["version"])


async def metrics(request: web.Request) -> web.Response:
    body, content_type = request.app[METRICS].render()
    response = web.Response(body=body)
    response.headers["Content-Type"] = content_type
    return response
