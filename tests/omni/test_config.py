"""The frozen configuration: what a config built in code gets (the CPU, no CORS), where the
LLM workers go, where the server says it answers, and the flag declarations each section makes
(the placement choices are the scheduler's policies; a size is typed as one)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from omni.config import (
    AdmissionConfig,
    AudioDecoderConfig,
    ChatFormatConfig,
    CorsPolicy,
    EncoderConfig,
    LLMConfig,
    ModelConfig,
    ServerConfig,
    StoreConfig,
    VisionDecoderConfig,
    WorkerConfig,
)
from omni.shared.settings import flag_settings
from scheduler.placement import POLICIES

SECTIONS = (
    WorkerConfig, LLMConfig, AdmissionConfig, EncoderConfig, VisionDecoderConfig, AudioDecoderConfig,
    ChatFormatConfig, StoreConfig, CorsPolicy, ServerConfig,
)  # fmt: skip


def test_llm_workers_go_round_robin_over_the_devices_or_all_on_one() -> None:
    assert LLMConfig().worker_devices == ("cpu",)  # a config built in code runs on the CPU
    assert LLMConfig(device="cuda:3").worker_devices == ("cuda:3",)
    assert LLMConfig(device="cuda:3", devices=("cuda:0", "cuda:1")).worker_devices == ("cuda:0", "cuda:1")


def test_the_base_url_is_where_a_client_on_this_host_reaches_the_server() -> None:
    assert ServerConfig().base_url == "http://127.0.0.1:8000"
    tls = ServerConfig(host="0.0.0.0", port=8443, ssl_certfile="cert.pem", root_path="/omni")
    assert tls.base_url == "https://0.0.0.0:8443/omni"


def test_a_config_is_frozen() -> None:
    model = ModelConfig(name="m", model_dir=Path("/m"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        model.name = "other"  # type: ignore[misc]
    assert (model.encoder_dir, model.vision_decoder_dir, model.audio_decoder_dir) == (None, None, None)  # text only
    assert ServerConfig().cors is None  # same-origin only unless a policy is given


def test_the_placement_choices_are_the_schedulers_policies() -> None:
    placement = next(f for f in dataclasses.fields(LLMConfig) if f.name == "placement")
    settings = flag_settings(placement)
    assert settings is not None and set(settings["choices"]) == set(POLICIES)
    assert LLMConfig().placement in POLICIES


@pytest.mark.parametrize("section", SECTIONS, ids=lambda s: s.__name__)
def test_every_flags_default_is_one_of_its_choices(section: type) -> None:
    instance = section()
    for f in dataclasses.fields(section):
        settings = flag_settings(f)
        if settings is None:
            continue
        choices = settings["choices"]
        value = getattr(instance, f.name)
        if choices is not None and value is not None:
            assert value in choices, f"{section.__name__}.{f.name}: default {value!r} not among {choices}"
