"""bench/gpu_smoke/graph_check.py's calls bound to what it calls: LLMRunner's keywords, the
protocol messages it builds, DecodeGraph's methods. Running it needs inductor's compile (about
a minute on this CPU), so the CPU run is by hand: --device cpu --dtype float32 on a tiny
checkpoint (bench/make_checkpoint.py --size tiny)."""

from __future__ import annotations

import inspect

import torch

from bench.gpu_smoke import graph_check
from gpu_workers.llm.decode_graph import DecodeGraph
from gpu_workers.llm.runner import LLMRunner
from omni.shared import protocol


def test_the_runner_takes_the_keywords_the_check_passes() -> None:
    a = graph_check.parser().parse_args(["--model", "m", "--json", "j"])
    for compiled in (True, False):
        inspect.signature(LLMRunner).bind("model_dir", **graph_check.runner_kwargs(a, compiled, 100))
    assert a.device == "cuda:0" and graph_check.runner_kwargs(a, True, 1)["dtype"] is torch.bfloat16


def test_the_messages_and_the_graph_have_what_the_check_uses() -> None:
    inspect.signature(protocol.NewRequest).bind("r0", [1, 2], graph_check.GREEDY, [0], 0, 2)
    inspect.signature(protocol.CachedRequest).bind("r0", [], 2, 1)
    inspect.signature(protocol.Step).bind(1, [], [], [])
    for name, arity in (("warm_up", 1), ("stats", 1), ("forward", 4)):
        assert len(inspect.signature(getattr(DecodeGraph, name)).parameters) == arity, name


def test_marked_static_reads_the_mark_torch_documents() -> None:
    t = torch.zeros(4)
    assert not graph_check.marked_static(t)
    torch._dynamo.mark_static_address(t)
    assert graph_check.marked_static(t)
