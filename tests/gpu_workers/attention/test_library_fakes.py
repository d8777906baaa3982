"""The recorded library signatures and the fakes built from them: what the reader takes from a
source file, and what a fake refuses (as the library would)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

from tests.gpu_workers.attention.library_fakes import fake_class, fake_function, load_signatures, signature
from tests.gpu_workers.attention.read_library_signatures import WANTED, read

SOURCE = '''
from typing import overload

class Wrapper:
    def __init__(self, workspace, kv_layout="NHD", *, backend: str = "auto") -> None: ...
    @overload
    def run(self, q, stub_only=1): ...
    def run(self, q, cache, *args, out=None, return_lse: bool = False): ...
    def plan(self, indptr, page_size, *deprecated, **kwargs): ...
    def _plan_impl(self, indptr, page_size, *, sm_scale=None, window_left: int = -1): ...

def varlen(q, k, /, v, scale=None, fa_version=DEFAULT_FA_VERSION): ...
'''


def names(params: list[dict[str, Any]]) -> list[tuple[str, str, str | None]]:
    return [(p["name"], p["kind"], p["default"]) for p in params]


def test_the_reader_takes_the_implementation_the_keywords_and_the_forwarded_plan() -> None:
    assert names(read(SOURCE, "Wrapper.run", "def")) == [
        ("self", "POSITIONAL_OR_KEYWORD", None), ("q", "POSITIONAL_OR_KEYWORD", None),
        ("cache", "POSITIONAL_OR_KEYWORD", None), ("args", "VAR_POSITIONAL", None),
        ("out", "KEYWORD_ONLY", "None"), ("return_lse", "KEYWORD_ONLY", "False"),
    ]  # fmt: skip
    # plan(**kwargs) forwards to _plan_impl: its keywords are plan's, the legacy *deprecated is dropped
    assert names(read(SOURCE, "Wrapper.plan", "plan+_plan_impl")) == [
        ("self", "POSITIONAL_OR_KEYWORD", None), ("indptr", "POSITIONAL_OR_KEYWORD", None),
        ("page_size", "POSITIONAL_OR_KEYWORD", None), ("sm_scale", "KEYWORD_ONLY", "None"),
        ("window_left", "KEYWORD_ONLY", "-1"),
    ]  # fmt: skip
    assert names(read(SOURCE, "varlen", "def"))[:3] == [
        ("q", "POSITIONAL_ONLY", None), ("k", "POSITIONAL_ONLY", None), ("v", "POSITIONAL_OR_KEYWORD", None)
    ]
    assert names(read(SOURCE, "varlen", "def"))[-1] == ("fa_version", "POSITIONAL_OR_KEYWORD", "DEFAULT_FA_VERSION")


def test_every_wanted_function_is_recorded_with_its_version_and_source() -> None:
    sigs = load_signatures()
    for library, wanted in WANTED.items():
        assert sigs[library]["version"] and sigs[library]["source"]
        assert sorted(sigs[library]["functions"]) == sorted(q for q, _, _ in wanted)
        for qualname in sigs[library]["functions"]:
            assert isinstance(signature(sigs, library, qualname), inspect.Signature)


def test_a_fake_function_refuses_what_the_library_would_and_applies_its_defaults() -> None:
    calls: list[dict[str, Any]] = []
    varlen = fake_function(load_signatures(), "flash_attn", "flash_attn_varlen_func", calls.append)
    varlen(1, 2, 3, cu_seqlens_q=4, cu_seqlens_k=5, max_seqlen_q=6, max_seqlen_k=7, causal=True)
    assert calls[0]["causal"] is True and calls[0]["softmax_scale"] is None and calls[0]["window_size"] == (-1, -1)
    with pytest.raises(TypeError, match="seqused_k"):  # vLLM's build has it, upstream's does not
        varlen(1, 2, 3, cu_seqlens_q=4, cu_seqlens_k=5, max_seqlen_q=6, max_seqlen_k=7, seqused_k=8)
    with pytest.raises(TypeError, match="max_seqlen_k"):
        varlen(1, 2, 3, cu_seqlens_q=4, cu_seqlens_k=5, max_seqlen_q=6)


def test_a_fake_class_binds_its_recorded_methods_and_hands_the_rest_through() -> None:
    class Impl:
        def __init__(self, a: dict[str, Any]) -> None:
            self.init = a

        def run(self, a: dict[str, Any]) -> dict[str, Any]:
            return a

        def helper(self) -> str:  # not a recorded method: untouched
            return "as is"

    wrapper = fake_class(load_signatures(), "flashinfer", "BatchDecodeWithPagedKVCacheWrapper", Impl)(
        "workspace", "NHD", use_cuda_graph=True, paged_kv_indptr_buffer="indptr"
    )
    assert wrapper.init["use_cuda_graph"] is True and wrapper.init["paged_kv_indices_buffer"] is None
    assert wrapper.run("q", ("k", "v"))["return_lse"] is False and wrapper.helper() == "as is"
    with pytest.raises(NotImplementedError, match="BatchDecodeWithPagedKVCacheWrapper.plan"):  # Impl has none
        wrapper.plan([0], [], [], 8, 2, 64, 16)
    with pytest.raises(TypeError, match="paged_kv_indptr_buf"):  # the prefill wrapper's name, not the decode one's
        type(wrapper)("workspace", paged_kv_indptr_buf="indptr")
