"""A GGUF file's LLM: its config, and its tensors under HF names, dequantized.

The tensors are turned back into a HF checkpoint's as transformers' GGUF loader turns them
(modeling_gguf_pytorch_utils.load_gguf_checkpoint): llama.cpp's names (`blk.N.attn_q.weight`)
mapped to HF's through the gguf package's own name table, each block-quantized tensor unpacked
to float32 by `gguf.dequantize`, and transformers' per-architecture tensor processor applied.
For llama that undoes the converter's permutation of the q and k rows (llama.cpp rotates
adjacent pairs, HF the two halves of each head). The caller casts to the serving dtype.

A tensor the file has that the model does not read is returned under its GGUF name, so the
loader refuses it (a llama 3 file's rope_freqs.weight, for one: transformers' config would drop
its RoPE scaling too).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from gpu_workers.models.registry import read_config
from omni.shared.gguf_file import GgufFile


class GgufWeights:
    def __init__(self, path: Path) -> None:
        self.file = GgufFile(path)
        self.hf_config = self.file.hf_config()
        try:
            self.config = read_config(self.hf_config)
        except ValueError as e:
            raise ValueError(f"{path} (GGUF): {e}") from None

    def tensors(self, hf_names: list[str]) -> Iterator[tuple[str, Callable[[], torch.Tensor]]]:
        """(HF name, its tensor's reader) per tensor of the file; hf_names: the ones the model
        reads (they name the file's tensors through gguf's map, as transformers maps them)."""
        to_hf, processor = self._names(hf_names)
        for tensor in self.file.reader.tensors:
            yield to_hf.get(tensor.name, tensor.name), partial(_dequantized, tensor, processor)

    def blocks(self, hf_names: list[str]) -> dict[str, tuple[str, torch.Tensor]]:
        """HF name -> (kind, raw rows) for each tensor the file holds in one of `kinds` (Q8_0,
        Q4_0, Q4_1): raw (N, K / 32 * block bytes) uint8, a copy of the file's blocks with the rows
        in the order the dequantized tensor has them (transformers' processor permutes llama's q
        and k rows: the same permutation, found by passing it the row indices)."""
        import gguf

        kinds = {gguf.GGMLQuantizationType.Q8_0: "q8_0", gguf.GGMLQuantizationType.Q4_0: "q4_0",
                 gguf.GGMLQuantizationType.Q4_1: "q4_1"}  # fmt: skip
        to_hf, processor = self._names(hf_names)
        out = {}
        for tensor in self.file.reader.tensors:
            kind = kinds.get(tensor.tensor_type)
            hf_name = to_hf.get(tensor.name)
            if kind is None or hf_name is None:
                continue
            rows = np.asarray(tensor.data)  # (N, row bytes) uint8, the mapped file
            index = np.arange(rows.shape[0], dtype=np.float32)[:, None]
            order = np.asarray(processor.process(weights=index, name=tensor.name).weights)[:, 0].astype(np.int64)
            out[hf_name] = (kind, torch.from_numpy(np.ascontiguousarray(rows[order])))
        return out

    def _names(self, hf_names: list[str]) -> tuple[dict[str, str], Any]:
        import gguf
        from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

        arch = self.file.architecture
        arch_id = next((k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch), None)
        if arch_id is None:
            raise ValueError(f"{self.file.path}: GGUF architecture {arch!r} is unknown to the gguf package")
        name_map = gguf.get_tensor_name_map(arch_id, self.config.num_layers)
        to_hf: dict[str, str] = {}
        for hf_name in hf_names:
            module, _, suffix = hf_name.rpartition(".")
            gguf_name = name_map.get_name(module)
            if gguf_name is not None:
                to_hf[f"{gguf_name}.{suffix}"] = hf_name
        return to_hf, TENSOR_PROCESSORS.get(arch, TensorProcessor)(config=self.hf_config)


def _dequantized(tensor: Any, processor: Any) -> torch.Tensor:
    import gguf

    weights = gguf.dequantize(tensor.data, tensor.tensor_type)  # float32, torch's dimension order
    weights = processor.process(weights=weights, name=tensor.name).weights
    return torch.from_numpy(np.array(weights, dtype=np.float32))  # a copy: the file is mapped read-only
