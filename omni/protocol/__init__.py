"""The process protocol: messages, worker specs and their msgpack wire format.

A shared layer: the server and every worker import it; it imports neither torch nor aiohttp
(a test enforces it).
"""

from omni.protocol.messages import (
    CachedRequest,
    EncodeBatch,
    EncodedItem,
    EncodeItem,
    EncodeResult,
    EncoderReady,
    FailedRequest,
    ForwardTiming,
    LLMReady,
    MediaRef,
    NewRequest,
    PromptLogprobs,
    SampledToken,
    SamplingOptions,
    Shutdown,
    Step,
    StepResult,
    TokenMask,
    TopLogprob,
    WorkerError,
)
from omni.protocol.specs import EncoderWorkerSpec, LLMWorkerSpec, StoreSettings, WorkerSpec
from omni.protocol.wire import decode, encode, message, message_types, register

__all__ = [
    "CachedRequest",
    "EncodeBatch",
    "EncodeItem",
    "EncodeResult",
    "EncodedItem",
    "EncoderReady",
    "EncoderWorkerSpec",
    "FailedRequest",
    "ForwardTiming",
    "LLMReady",
    "LLMWorkerSpec",
    "MediaRef",
    "NewRequest",
    "PromptLogprobs",
    "SampledToken",
    "SamplingOptions",
    "Shutdown",
    "Step",
    "StepResult",
    "StoreSettings",
    "TokenMask",
    "TopLogprob",
    "WorkerError",
    "WorkerSpec",
    "decode",
    "encode",
    "message",
    "message_types",
    "register",
]
