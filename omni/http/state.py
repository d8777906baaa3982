"""Typed keys for everything the aiohttp application holds."""

from __future__ import annotations

from aiohttp import web

from omni.config import ServerConfig
from omni.metrics import Metrics
from omni.modalities.inputs.voice_activity import LazyVoiceActivityModel
from omni.serving.model import ModelRegistry
from omni.serving.responses.store import ResponseStore
from omni.shared.store.base import ArtifactStore

CONFIG = web.AppKey("config", ServerConfig)
METRICS = web.AppKey("metrics", Metrics)
MODELS = web.AppKey("models", ModelRegistry)
STORE = web.AppKey("store", ArtifactStore)
RESPONSES = web.AppKey("responses", ResponseStore)  # stored Responses API turns, and background runs
VAD = web.AppKey("vad", LazyVoiceActivityModel)  # server VAD for /v1/realtime, loaded on first use
