"""The library decode op (attention/library_decode.py) on the CPU: its reference against SDPA over
each row's copied context; FlashInfer's CUDA-graph decode wrapper, per bucket, through a fake that
takes exactly FlashInfer 0.7.4's parameter names (read from its wheel's flashinfer/decode.py) and
computes attention from nothing but the buffers it was given, so a wrong buffer, size or plan is
a wrong answer; flash-attn's flash_attn_with_kvcache call through a fake of upstream's signature.

The hand-written fakes compute; the last tests put them behind library_fakes.py, which binds every
call to the signatures recorded from the published sources first (FlashInfer 0.7.4's decode
wrapper, flash-attn 2.8.3's flash_attn_with_kvcache, vLLM's flash_attn_varlen_func), so a renamed
parameter fails here, on the CPU."""

from __future__ import annotations

import inspect
import math
import types
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from gpu_workers.attention import library_decode
from gpu_workers.attention.backend import HeadShape
from gpu_workers.attention.library_decode import FlashAttnDecode, FlashInferDecode, ReferenceDecode, VllmFlashAttnDecode
from tests.gpu_workers.attention.library_fakes import (
    Signatures,
    fake_class,
    fake_function,
    fake_module,
    load_signatures,
    rename_parameter,
)

NB, BS, HKV, G, D = 12, 4, 2, 3, 8
SCALE = 0.3
# rows with 0 (a padding row), 3, 4 and 9 cached tokens; 11 is the scratch block
TABLES = [[11, 11, 11], [5, 11, 11], [7, 2, 11], [0, 3, 9]]
CACHED = [0, 3, 4, 9]


def _inputs() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    k_cache = torch.randn(NB, BS, HKV, D, generator=gen)
    v_cache = torch.randn(NB, BS, HKV, D, generator=gen)
    q = torch.randn(len(TABLES), HKV * G, D, generator=gen)
    return q, k_cache, v_cache


def _sdpa(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, row: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Row `row`'s attention over its copied context, and its natural-log log-sum-exp (Hq,)."""
    n = CACHED[row]
    keys = k_cache[TABLES[row]].reshape(-1, HKV, D)[:n].transpose(0, 1)  # (Hkv, n, D)
    values = v_cache[TABLES[row]].reshape(-1, HKV, D)[:n].transpose(0, 1)
    qr = q[row].view(HKV, G, D)
    out = F.scaled_dot_product_attention(qr, keys, values, scale=SCALE).reshape(HKV * G, D)
    lse = torch.logsumexp(qr @ keys.transpose(1, 2) * SCALE, -1).reshape(HKV * G)
    return out, lse


def test_the_reference_op_matches_sdpa_over_the_copied_context() -> None:
    q, k_cache, v_cache = _inputs()
    key = library_decode.register(ref := ReferenceDecode())
    out, lse = torch.ops.omni.library_paged_decode(
        q, k_cache, v_cache, torch.tensor(TABLES), torch.tensor(CACHED), SCALE, key
    )
    assert out.shape == q.shape and lse.shape == (len(TABLES), HKV * G) and lse.dtype == torch.float32
    assert torch.all(lse[0] == float("-inf")) and torch.all(out[0] == 0)  # nothing cached: nothing seen
    for row in range(1, len(TABLES)):
        want_out, want_lse = _sdpa(q, k_cache, v_cache, row)
        assert (out[row] - want_out).abs().max().item() < 1e-5
        assert (lse[row] - want_lse).abs().max().item() < 1e-5
    del ref  # registered weakly: the key goes with the kernel
    assert key not in library_decode._KERNELS


class FakeDecodeWrapper:
    """FlashInfer 0.7.4's BatchDecodeWithPagedKVCacheWrapper as far as CUDA-graph mode goes: the
    same parameter names (constructor; plan's keyword-only ones as its _plan_impl takes them; run),
    the same checks (batch size fixed by the buffers, indices within theirs), plan copying into the
    buffers, and run computing attention from those buffers alone, with a base-2 log-sum-exp."""

    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        jit_kwargs: dict[str, Any] | None = None,
    ) -> None:
        assert use_cuda_graph and kv_layout == "NHD"
        assert paged_kv_indptr_buffer is not None and paged_kv_indices_buffer is not None
        assert paged_kv_last_page_len_buffer is not None
        self.batch_size = len(paged_kv_last_page_len_buffer)
        if len(paged_kv_indptr_buffer) != self.batch_size + 1:
            raise ValueError("The size of paged_kv_indptr_buffer should be batch_size + 1")
        self.indptr, self.indices = paged_kv_indptr_buffer, paged_kv_indices_buffer
        self.last = paged_kv_last_page_len_buffer
        self.init = {"use_tensor_cores": use_tensor_cores, "backend": backend, "workspace": float_workspace_buffer}
        self.calls: list[str] = []
        self.planned: dict[str, Any] = {}

    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        *,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        window_right: int = 0,
        logits_soft_cap: float | None = None,
        q_data_type: Any = "float16",
        kv_data_type: Any = None,
        o_data_type: Any = None,
        data_type: Any = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        q_len_per_req: int = 1,
        is_causal: bool | None = None,
        use_token_head_sf: bool = False,
    ) -> None:
        assert indptr.device.type == indices.device.type == last_page_len.device.type == "cpu"  # host tables
        assert indptr.dtype == indices.dtype == last_page_len.dtype == torch.int32
        if len(last_page_len) != self.batch_size:
            raise ValueError("The batch size should be fixed in cudagraph mode")
        if len(indices) > len(self.indices):
            raise ValueError("The size of indices should be less than or equal to the allocated buffer")
        assert bool(((last_page_len >= 1) & (last_page_len <= page_size)).all())
        self.indptr.copy_(indptr)
        self.last.copy_(last_page_len)
        self.indices[: len(indices)].copy_(indices)
        self.planned = {"heads": (num_qo_heads, num_kv_heads, head_dim), "page_size": page_size,
                        "sm_scale": sm_scale, "dtypes": (q_data_type, kv_data_type)}  # fmt: skip
        self.calls.append("plan")

    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: torch.Tensor | tuple[torch.Tensor, torch.Tensor],
        *args: Any,
        q_scale: float | None = None,
        k_scale: float | None = None,
        v_scale: float | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        kv_cache_sf: Any = None,
    ) -> Any:
        assert self.planned and q.shape[0] == self.batch_size and q.is_contiguous()
        k_cache, v_cache = paged_kv_cache  # type: ignore[misc]
        hq, hkv, d = self.planned["heads"]
        assert q.shape[1:] == (hq, d) and k_cache.shape[2:] == (hkv, d)
        page = self.planned["page_size"]
        outs, lses = [], []
        for row in range(self.batch_size):  # read from the buffers only
            pages = self.indices[int(self.indptr[row]) : int(self.indptr[row + 1])]
            n = (len(pages) - 1) * page + int(self.last[row])
            keys = k_cache[pages].reshape(-1, hkv, d)[:n].transpose(0, 1).float()  # (Hkv, n, D)
            values = v_cache[pages].reshape(-1, hkv, d)[:n].transpose(0, 1).float()
            qr = q[row].view(hkv, hq // hkv, d).float()
            s = qr @ keys.transpose(1, 2) * self.planned["sm_scale"]  # (Hkv, G, n)
            outs.append((torch.softmax(s, -1) @ values).reshape(hq, d))
            lses.append(torch.logsumexp(s, -1).reshape(hq) / math.log(2.0))  # FlashInfer's base 2
        self.calls.append("run")
        o = torch.stack(outs).to(q.dtype)
        return (o, torch.stack(lses)) if return_lse else o


def fake_flashinfer() -> types.ModuleType:
    module = types.ModuleType("flashinfer")
    module.BatchDecodeWithPagedKVCacheWrapper = FakeDecodeWrapper  # type: ignore[attr-defined]
    return module


def _flashinfer_decode(buckets: list[int], max_blocks: int) -> FlashInferDecode:
    heads = HeadShape(HKV * G, HKV, D)
    cpu = torch.device("cpu")
    return FlashInferDecode(buckets, max_blocks, heads, BS, torch.float32, SCALE, cpu, fake_flashinfer())


def test_flashinfer_buffers_are_sized_per_bucket_as_views_of_one_allocation() -> None:
    fi = _flashinfer_decode([1, 2, 4, 8], max_blocks=5)
    assert list(fi.wrappers) == [1, 2, 4, 8]
    assert fi.indptr.numel() == 9 and fi.last_page_len.numel() == 8 and fi.indices.numel() == 8 * 5
    for b, w in fi.wrappers.items():
        assert (w.indptr.numel(), w.last.numel(), w.indices.numel()) == (b + 1, b, b * 5)
        # fixed addresses, shared: only one bucket runs at a time
        assert w.indptr.data_ptr() == fi.indptr.data_ptr() and w.indices.data_ptr() == fi.indices.data_ptr()
        assert w.last.data_ptr() == fi.last_page_len.data_ptr()
        assert w.init == {"use_tensor_cores": True, "backend": "fa2", "workspace": fi.workspace}
    assert fi.workspace.numel() == 128 << 20 and not fi.workspace.any()  # FlashInfer: zero at first use


def test_flashinfer_plan_writes_the_steps_pages_into_the_buckets_buffers() -> None:
    fi = _flashinfer_decode([2, 4], max_blocks=3)
    fi.plan(4, TABLES, CACHED)
    w = fi.wrappers[4]
    # pages: 1 (a padding row gets one, of the scratch block), 1, 1, 3
    assert w.indptr.tolist() == [0, 1, 2, 3, 6]
    assert w.indices[:6].tolist() == [11, 5, 7, 0, 3, 9]
    assert w.last.tolist() == [1, 3, 4, 1]
    assert w.planned == {"heads": (HKV * G, HKV, D), "page_size": BS, "sm_scale": SCALE,
                         "dtypes": (torch.float32, torch.float32)}  # fmt: skip
    assert fi.wrappers[2].calls == []
    with pytest.raises(ValueError, match="reads 4 blocks; the buffers hold 3"):
        fi.plan(4, [[1, 2, 3, 4]] * 4, [13] * 4)


def test_the_op_runs_the_planned_flashinfer_wrapper_and_returns_natural_log() -> None:
    q, k_cache, v_cache = _inputs()
    fi = _flashinfer_decode([4], max_blocks=3)
    key = library_decode.register(fi)
    fi.plan(4, TABLES, CACHED)
    table = torch.tensor(TABLES)
    out, lse = library_decode.library_paged_decode(q, k_cache, v_cache, table, torch.tensor(CACHED), SCALE, key)
    assert fi.wrappers[4].calls == ["plan", "run"]
    for row in range(1, len(TABLES)):  # row 0 pads: its output is discarded
        want_out, want_lse = _sdpa(q, k_cache, v_cache, row)
        assert (out[row] - want_out).abs().max().item() < 1e-5
        assert (lse[row] - want_lse).abs().max().item() < 1e-5


def test_flash_attn_with_kvcache_gets_the_block_table_and_cached_lengths() -> None:
    q, k_cache, v_cache = _inputs()
    seen: dict[str, Any] = {}

    def with_kvcache(
        q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, k: Any = None, v: Any = None,
        rotary_cos: Any = None, rotary_sin: Any = None, cache_seqlens: Any = None, cache_batch_idx: Any = None,
        cache_leftpad: Any = None, block_table: Any = None, softmax_scale: Any = None, causal: bool = False,
        window_size: Any = (-1, -1), softcap: float = 0.0, rotary_interleaved: bool = True,
        alibi_slopes: Any = None, num_splits: int = 0, return_softmax_lse: bool = False,
    ) -> Any:  # flash_attn 2's signature
        seen.update(q=q.shape, seqlens=cache_seqlens, table=block_table, causal=causal, lse=return_softmax_lse,
                    scale=softmax_scale)  # fmt: skip
        out, lse = library_decode.reference_attention(q[:, 0], k_cache, v_cache, block_table, cache_seqlens, SCALE)
        return out[:, None], lse[:, :, None]  # (B, 1, Hq, D), (B, Hq, 1)

    table, cached = torch.tensor(TABLES), torch.tensor(CACHED)
    out, lse = FlashAttnDecode(with_kvcache).attend(q, k_cache, v_cache, table, cached, SCALE)
    assert seen["q"] == (4, 1, HKV * G, D) and seen["causal"] and seen["lse"] and seen["scale"] == SCALE
    assert seen["seqlens"].dtype == torch.int32 and seen["seqlens"].tolist() == [1, 3, 4, 9]  # padding: one
    assert seen["table"].dtype == torch.int32 and seen["table"].tolist() == TABLES
    assert out.shape == q.shape and lse.shape == (4, HKV * G)
    want_out, want_lse = _sdpa(q, k_cache, v_cache, 3)
    assert (out[3] - want_out).abs().max().item() < 1e-5 and (lse[3] - want_lse).abs().max().item() < 1e-5


# ---- bound to the recorded signatures (library_signatures.json, issue 34 item 4) -------------


def _bound_args(fn: Any, args: dict[str, Any]) -> dict[str, Any]:
    """The recorded call's arguments that the hand-written fake's `fn` names (it keeps only what
    it computes with)."""
    names = inspect.signature(fn).parameters
    return {k: v for k, v in args.items() if k in names and k != "args"}


class _BoundWrapper(FakeDecodeWrapper):
    """FakeDecodeWrapper behind fake_class: each call is bound to FlashInfer 0.7.4's recorded
    signature first (a renamed or removed parameter is a TypeError), then computed."""

    def __init__(self, args: dict[str, Any]) -> None:  # type: ignore[override]
        FakeDecodeWrapper.__init__(self, **_bound_args(FakeDecodeWrapper.__init__, args))

    def plan(self, args: dict[str, Any]) -> None:  # type: ignore[override]
        FakeDecodeWrapper.plan(self, **_bound_args(FakeDecodeWrapper.plan, args))

    def run(self, args: dict[str, Any]) -> Any:  # type: ignore[override]
        return FakeDecodeWrapper.run(self, **_bound_args(FakeDecodeWrapper.run, args))


def _bound_flashinfer(sigs: Signatures) -> FlashInferDecode:
    wrapper = fake_class(sigs, "flashinfer", "BatchDecodeWithPagedKVCacheWrapper", _BoundWrapper)
    module = fake_module("flashinfer", BatchDecodeWithPagedKVCacheWrapper=wrapper)
    return FlashInferDecode([4], 3, HeadShape(HKV * G, HKV, D), BS, torch.float32, SCALE, torch.device("cpu"), module)


def test_the_graphs_flashinfer_calls_are_bound_to_its_recorded_signature() -> None:
    q, k_cache, v_cache = _inputs()
    fi = _bound_flashinfer(load_signatures())
    fi.plan(4, TABLES, CACHED)
    out, lse = fi.attend(q, k_cache, v_cache, torch.tensor(TABLES), torch.tensor(CACHED), SCALE)
    want_out, want_lse = _sdpa(q, k_cache, v_cache, 3)
    assert (out[3] - want_out).abs().max().item() < 1e-5 and (lse[3] - want_lse).abs().max().item() < 1e-5


@pytest.mark.parametrize(
    ("method", "old"),
    [("__init__", "use_cuda_graph"), ("__init__", "paged_kv_indices_buffer"), ("__init__", "backend"),
     ("plan", "sm_scale"), ("plan", "kv_data_type"), ("run", "return_lse"), ("run", "paged_kv_cache")],
)  # fmt: skip
def test_a_renamed_flashinfer_decode_argument_fails_the_graphs_call(method: str, old: str) -> None:
    q, k_cache, v_cache = _inputs()
    qualname = f"BatchDecodeWithPagedKVCacheWrapper.{method}"
    sigs = rename_parameter(load_signatures(), "flashinfer", qualname, old, old + "_v2")
    with pytest.raises(TypeError, match=old):
        fi = _bound_flashinfer(sigs)
        fi.plan(4, TABLES, CACHED)
        fi.attend(q, k_cache, v_cache, torch.tensor(TABLES), torch.tensor(CACHED), SCALE)


def _with_kvcache(args: dict[str, Any]) -> Any:
    out, lse = library_decode.reference_attention(
        args["q"][:, 0], args["k_cache"], args["v_cache"], args["block_table"], args["cache_seqlens"], args["softmax_scale"]
    )
    return out[:, None], lse[:, :, None]  # (B, 1, Hq, D), (B, Hq, 1)


def _varlen(args: dict[str, Any]) -> Any:
    assert args["max_seqlen_q"] == 1 and args["cu_seqlens_q"].tolist() == list(range(len(TABLES) + 1))
    out, lse = library_decode.reference_attention(
        args["q"], args["k"], args["v"], args["block_table"], args["seqused_k"], args["softmax_scale"]
    )
    return out, lse.transpose(0, 1)  # varlen's lse: (Hq, total_q)


@pytest.mark.parametrize("rename", [None, "block_table", "return_softmax_lse"])
def test_the_graphs_flash_attn_calls_are_bound_to_each_builds_signature(rename: str | None) -> None:
    """Upstream flash-attn's flash_attn_with_kvcache, and vLLM's build, which has none, through
    its flash_attn_varlen_func: both answer as SDPA does; a parameter renamed fails the call."""
    q, k_cache, v_cache = _inputs()
    table, cached = torch.tensor(TABLES), torch.tensor(CACHED)
    sigs = load_signatures()
    kernels = {
        "flash_attn_with_kvcache": lambda s: FlashAttnDecode(fake_function(s, "flash_attn", "flash_attn_with_kvcache", _with_kvcache)),
        "flash_attn_varlen_func": lambda s: VllmFlashAttnDecode(3 * BS, fake_function(s, "vllm_flash_attn", "flash_attn_varlen_func", _varlen)),
    }  # fmt: skip
    for qualname, make in kernels.items():
        library = "flash_attn" if qualname == "flash_attn_with_kvcache" else "vllm_flash_attn"
        if rename is not None:
            with pytest.raises(TypeError, match=rename):
                make(rename_parameter(sigs, library, qualname, rename, rename + "_v2")).attend(
                    q, k_cache, v_cache, table, cached, SCALE
                )
            continue
        out, lse = make(sigs).attend(q, k_cache, v_cache, table, cached, SCALE)
        assert out.shape == q.shape and lse.shape == (len(TABLES), HKV * G)
        want_out, want_lse = _sdpa(q, k_cache, v_cache, 3)
        assert (out[3] - want_out).abs().max().item() < 1e-5 and (lse[3] - want_lse).abs().max().item() < 1e-5
