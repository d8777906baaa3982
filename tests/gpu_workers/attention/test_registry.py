"""Attention backends by name and by "auto": which one each device, cache and installed
package gets, and a name or a package that cannot serve refused with the reason."""

from __future__ import annotations

import pytest
import torch

from gpu_workers.attention.backend import HeadShape
from gpu_workers.attention.registry import (
    ATTENTION_BACKENDS,
    CUDA_AUTO_ORDER,
    auto_backend_name,
    create_attention_backend,
)
from gpu_workers.attention.torch_sdpa import TorchSDPABackend
from tests.gpu_workers.attention.test_backends import CPU, CUDA, HEADS


def test_every_backend_is_registered_under_its_own_name() -> None:
    assert list(ATTENTION_BACKENDS) == ["torch_sdpa", "vllm_flash_attn", "flash_attn", "flashinfer", "flex_paged"]
    assert all(cls.name == name for name, cls in ATTENTION_BACKENDS.items())


def test_an_unknown_name_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=(
        "^unknown attention backend 'sdpa'; known: auto, torch_sdpa, vllm_flash_attn, flash_attn, flashinfer, flex_paged$"
    )):  # fmt: skip
        create_attention_backend("sdpa", block_size=16, device=CPU, dtype=torch.float32)


def test_a_named_backend_is_built_for_the_block_size_and_device() -> None:
    backend = create_attention_backend(
        "torch_sdpa", block_size=8, device=CPU, dtype=torch.bfloat16, heads=HeadShape(4, 2, 8)
    )
    assert type(backend) is TorchSDPABackend and (backend.block_size, backend.device) == (8, CPU)


def test_auto_on_cpu() -> None:
    """torch SDPA, which starts at once (flex_paged is chosen by name: it compiles at start)."""
    backend = create_attention_backend("auto", block_size=16, device=torch.device("cpu"), dtype=torch.float32)
    assert type(backend) is TorchSDPABackend


def test_a_kernel_whose_package_is_missing_is_not_selectable() -> None:
    """None of the CUDA kernel packages is installed here: named, each is refused with the
    reason; auto on CUDA then falls back to torch SDPA."""
    for name in ("vllm_flash_attn", "flash_attn", "flashinfer"):
        cls = ATTENTION_BACKENDS[name]
        if cls.importable() is None:
            pytest.skip(f"{name} is installed")
        block = 256 if name == "flash_attn" else 16
        with pytest.raises(ValueError, match=f"{name!r} is not available here: .*cannot be imported"):
            create_attention_backend(name, block_size=block, device=CUDA, dtype=torch.bfloat16, heads=HEADS)
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "torch_sdpa"


def test_auto_on_cuda_takes_the_first_kernel_that_is_installed_and_fits(monkeypatch: pytest.MonkeyPatch) -> None:
    installed: set[str] = set()
    for cls in CUDA_AUTO_ORDER:
        monkeypatch.setattr(cls, "importable", classmethod(lambda c: None if c.name in installed else "absent"))
    installed.update({"flash_attn", "flashinfer"})
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "flashinfer"  # FA2 needs 256-token blocks
    assert auto_backend_name(256, CUDA, torch.bfloat16, HEADS) == "flash_attn"
    assert auto_backend_name(16, CUDA, torch.bfloat16, HeadShape(8, 8, 96)) == "torch_sdpa"  # no kernel's head_dim
    installed.add("vllm_flash_attn")
    assert auto_backend_name(16, CUDA, torch.bfloat16, HEADS) == "vllm_flash_attn"
    assert auto_backend_name(16, CUDA, torch.float32, HEADS) == "torch_sdpa"
    assert auto_backend_name(16, CPU, torch.bfloat16, HEADS) == "torch_sdpa"
