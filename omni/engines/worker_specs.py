"""A model's EngineConfig as each of its worker processes gets it: the one place specs are
built, so every kind reads the same settings the same way."""

from __future__ import annotations

from omni.shared import protocol
from omni.config import EngineConfig


def store_settings(config: EngineConfig) -> protocol.StoreSettings:
    return protocol.StoreSettings(config.store, config.store_endpoint_url, config.store_region)


def llm_worker_spec(config: EngineConfig, worker_id: int, device: str) -> protocol.LLMWorkerSpec:
    """Only an omni model's LLM workers open the artifact store: a text-only LLM never reads it."""
    return protocol.LLMWorkerSpec(
        worker_id=worker_id,
        device=device,
        dtype=config.dtype,
        num_threads=config.num_threads,
        seed=config.seed,
        model_dir=str(config.model_dir),
        block_size=config.block_size,
        num_kv_blocks=config.num_kv_blocks,
        kv_cache_memory_bytes=config.kv_cache_memory_bytes,
        gpu_memory_utilization=config.gpu_memory_utilization,
        max_model_len=config.max_model_len,
        attention_backend=config.attention_backend,
        store=store_settings(config) if config.encoder_dir is not None else None,
    )


def encoder_worker_spec(config: EngineConfig, device: str) -> protocol.EncoderWorkerSpec:
    assert config.encoder_dir is not None, "a text-only model has no encoder worker"
    return protocol.EncoderWorkerSpec(
        worker_id=0,
        device=device,
        dtype=config.dtype,
        num_threads=config.num_threads,
        seed=config.seed,
        model_dir=str(config.encoder_dir),
        store=store_settings(config),
        media_limits=config.media_limits,
    )


def encoder_device(config: EngineConfig) -> str:
    """--encoder-device, else the first LLM worker's device."""
    return config.encoder_device or (config.devices[0] if config.devices else config.device)


def vision_decoder_devices(config: EngineConfig) -> tuple[str, ...]:
    """--vision-decoder-devices, else one rank on the encoder's device."""
    return config.vision_decoder_devices or (encoder_device(config),)


def audio_decoder_worker_spec(config: EngineConfig) -> protocol.AudioDecoderWorkerSpec:
    """--audio-decoder-device, else the encoder's device."""
    assert config.audio_decoder_dir is not None, "the model has no audio decoder"
    return protocol.AudioDecoderWorkerSpec(
        worker_id=0,
        device=config.audio_decoder_device or encoder_device(config),
        dtype=config.dtype,
        num_threads=config.num_threads,
        seed=config.seed,
        model_dir=str(config.audio_decoder_dir),
    )


def vision_decoder_worker_spec(config: EngineConfig) -> protocol.VisionDecoderWorkerSpec:
    assert config.vision_decoder_dir is not None, "the model has no vision decoder"
    devices = vision_decoder_devices(config)
    return protocol.VisionDecoderWorkerSpec(
        worker_id=0,
        device=devices[0],
        dtype=config.dtype,
        num_threads=config.num_threads,
        seed=config.seed,
        world_size=len(devices),
        model_dir=str(config.vision_decoder_dir),
        rank_devices=list(devices) if len(devices) > 1 else [],
    )
