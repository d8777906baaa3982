"""The compiled DiT (gpu_workers/vision_decoder/compiled_dit.py) against the eager one: the
same outputs within float tolerance (fp32) for a batch of one and of several at other token
counts, with two graphs for every block of every DiT; a decoder loaded with compile_dit runs
both of its DiTs (the main and the autoguidance twin) compiled and draws the eager images."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch._dynamo.utils import counters

from gpu_workers.models.flux_dit import FluxDiT, FluxDiTConfig, SingleStreamBlock, position_ids
from gpu_workers.tiny.checkpoints import TINY_DIT, make_tiny_vision_decoder
from gpu_workers.vision_decoder import compiled_dit
from gpu_workers.vision_decoder.decoder import VisionDecoder
from omni.shared import protocol

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest.py


def dit(seed: int, layers: int = 3) -> FluxDiT:
    torch.manual_seed(seed)
    model = FluxDiT(FluxDiTConfig.from_dict({**TINY_DIT, "num_layers": layers, "cond_channels": 16, "vec_in_dim": 16}))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.3)
    return model.eval()


def inputs(model: FluxDiT, batch: int, side: int, seed: int) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    c = model.config
    x = torch.randn(batch, side * side, c.token_in_dim, generator=g)
    timestep = torch.rand(batch, generator=g) * 1000
    return x, position_ids(side, side).float(), timestep, torch.randn(batch, c.vec_in_dim, generator=g)


def eager(model: FluxDiT) -> None:
    for block in model.blocks:
        block.halves = (SingleStreamBlock.before_attention, SingleStreamBlock.after_attention)


def test_compiled_blocks_equal_eager_within_float_tolerance_in_two_graphs() -> None:
    main, twin = dit(0), dit(1, layers=1)
    cases = [(1, 4, 0), (3, 6, 1), (2, 5, 2), (1, 7, 3)]  # (batch, latent side, seed)
    with torch.inference_mode():
        want = [m(*inputs(m, *case)) for m in (main, twin) for case in cases]
        counters.clear()
        assert compiled_dit.compile_blocks([main, twin]) == 4
        got = [m(*inputs(m, *case)) for m in (main, twin) for case in cases]
    assert compiled_dit.is_compiled(main) and compiled_dit.is_compiled(twin)
    for w, g in zip(want, got):
        assert g.shape == w.shape and g.dtype == torch.float32
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    # a batch of one and a batch of several, each half: every block of both DiTs, every size
    assert counters["stats"]["unique_graphs"] == 4
    eager(main)
    eager(twin)
    assert not compiled_dit.is_compiled(main)


def test_a_decoder_with_compile_dit_draws_the_eager_images(tmp_path: Path) -> None:
    codebook = torch.randn(64, 16, generator=torch.Generator().manual_seed(3))
    path = make_tiny_vision_decoder(tmp_path / "vd", seed=1, codebook=codebook, guidance="autoguidance")
    plain = VisionDecoder.from_dir(path)
    compiled = VisionDecoder.from_dir(path, compile_dit=True)
    assert compiled_dit.is_compiled(compiled.transformer) and not compiled_dit.is_compiled(plain.transformer)
    assert compiled_dit.is_compiled(compiled.guidance.weak)  # type: ignore[attr-defined]
    codes = [(5 * i + 1) % 64 for i in range(64)]
    jobs = [protocol.ImageJob(i, codes, 128, 128, 3, seed=i) for i in range(2)]
    for a, b in zip(plain.decode(jobs).images, compiled.decode(jobs).images):
        pa, pb = (np.asarray(Image.open(io.BytesIO(x.data)), dtype=np.int16) for x in (a, b))
        assert np.abs(pa - pb).max() <= 1  # one step of rounding at most, as float tolerance allows
    plain.close()
    compiled.close()
