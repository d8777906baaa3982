"""What an LLM worker's steps hold on its device besides its weights, its largest prefill's
activations and its KV cache: the StepItems that llm/memory.py's budget takes off the KV cache
before sizing it (issue 34 item 5; vLLM sizes its cache after profiling its CUDA graphs too).

Each item is an upper bound from shapes, read off the code that allocates it; on CUDA the two
that the library's choices decide (the graph pool, the sampler) are measured as well, before the
KV cache exists, and the budget takes the larger. V is the vocabulary, N the rows a step samples
(max_num_seqs * (1 + drafts)), R the requests a step holds (max_num_seqs), e the model dtype's
element size:

    prompt logprobs  12 * n * V + 512 * T, n = min(T, PROMPT_LOGITS_PER_SLICE // V) rows of a
                     chunk of T (runner._prompt_logprobs: a slice's float32 logits (4) beside
                     their log_softmax (4), while the previous slice's log_softmax (4) is still
                     bound to its name (in bf16 the lm_head output and its scaled copy, 2e, take
                     the logits' place); per row the targets, ranks and top 20: under 512).
                     About 770 MiB at most.
    sampler          SAMPLER_BYTES_PER_LOGIT * N * V: sample/sampler.py's deepest path, top-k
                     with top-p, holds 47 bytes a (row, token) at once (raw and processed logits,
                     the sampled rows, the temperature-scaled and min_p copies, sorted values and
                     their int64 order, masks, softmax, cumsum, the scattered result), plus the
                     sort's scratch: 64. The penalties' per-step (P, V) copies come before the
                     warp and are fewer (53 bytes with the logits) than that.
    penalties        1.5 * C * V * 5: sample/penalties.py keeps (C, V) bool + float32 counts, C
                     the slot capacity, the first power of two from 8 that holds R (the old and
                     the new tensors both live while it grows). A preempted request keeps its
                     slot while it waits: many at once can take the counts past R's.
    graph pool       the largest recorded graph's footprint, F(largest bucket, widest table):
                     CUDA-graph trees share one pool among a worker's graphs and reuse memory a
                     replayed graph's dead outputs left (torch/_inductor/cudagraph_trees.py: "A,
                     B and A, B' ... using only max(mem(A, B), mem(A, B'))"), and each step is a
                     new generation, so the pool is the largest graph's, not the sum over the
                     len(buckets) * len(widths) graphs. Per row of a bucket b, a table of W
                     blocks of block_size bs (S = W * bs context positions):
                       inputs   (4 + W) * 8                 the recorded copies of ids, positions,
                                                            lengths, slots and the table
                       outputs  H * e + 2 * (2 * L * Hkv * D * e)   hidden, the new K/V of every
                                                            layer (the per-layer list, stacked)
                       dense    4 * (2 * widest + 8 * H + 3 * (Hq + 2 * Hkv) * D)   one layer's
                                                            float32 worst case (widest: the widest
                                                            linear output, gate|up)
                       gather   S * (8 + 1 + 2 * 4 * Hq)   attention/compiled_decode.py's gather
                                                            kernel: slots, mask, scores and exp in
                                                            float32, one layer at a time (none for
                                                            a kernel that reads the cache itself)
                     It assumes the KV cache is a static input of the graphs (issue 34 item 1;
                     a copied cache would be a cache-sized input) and that inductor fuses the K
                     gather into the score reduction, as compiled_decode.py states: what the
                     measurement (a recording of the largest graph over a scratch cache) settles.
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass

import torch
from torch import nn

from gpu_workers.attention import library_decode
from gpu_workers.llm.decode_graph import DecodeGraph, decode_buckets, table_widths
from gpu_workers.llm.memory import GIB, MemoryReader, StepItems, profile_peak
from gpu_workers.models.registry import CausalLM, CausalLMConfig
from gpu_workers.sample.sampler import Sampler
from gpu_workers.spec.drafts import Drafter
from omni.shared import protocol

log = logging.getLogger("omni.llm_runner.memory")

# Prompt logprobs are computed over at most this many logits at once (rows * vocab), so a
# long prefill chunk never holds its whole (T, V) logits: 64 Mi floats, 256 MiB in float32.
PROMPT_LOGITS_PER_SLICE = 1 << 26
PROMPT_BYTES_PER_LOGIT = 12
PROMPT_BYTES_PER_ROW = 512
SAMPLER_BYTES_PER_LOGIT = 64
PENALTY_BYTES_PER_LOGIT = 5  # bool seen + float32 count
MIN_PENALTY_SLOTS = 8


@dataclass(frozen=True, slots=True)
class StepShape:
    """The largest steps a worker takes, as the budget counts them."""

    max_num_seqs: int  # requests a step holds; the largest decode bucket
    max_model_len: int
    block_size: int
    max_step_tokens: int  # the largest step's tokens (0: max_model_len)
    graphs: bool = False  # the compiled decode step records CUDA graphs
    kernel: str | None = None  # its attention kernel (None: DecodeGraph's default for attention_backend)
    drafter: Drafter | None = None  # speculative decoding's: a request verifies its drafts each step
    attention_backend: str | None = None  # the eager path's, whose library the graphs call where it can

    @property
    def graph_kernel(self) -> str:
        """The attention kernel inside the CUDA graphs (decode_graph.graph_kernel's choice)."""
        if self.kernel is not None:
            return self.kernel
        return self.attention_backend if self.attention_backend in library_decode.CUDA_LIBRARY_KERNELS else "gather"

    @property
    def sampled_rows(self) -> int:
        return self.max_num_seqs * (1 + (self.drafter.num_tokens if self.drafter is not None else 0))

    @property
    def prompt_rows(self) -> int:
        return min(self.max_step_tokens or self.max_model_len, self.max_model_len)


def prompt_slice_rows(rows: int, vocab: int) -> int:
    """The rows runner._prompt_logprobs computes at once, of a chunk of `rows`."""
    return min(rows, max(1, PROMPT_LOGITS_PER_SLICE // vocab))


def prompt_logprobs_bound(rows: int, vocab: int) -> int:
    return PROMPT_BYTES_PER_LOGIT * prompt_slice_rows(rows, vocab) * vocab + PROMPT_BYTES_PER_ROW * rows


def sampler_bound(rows: int, vocab: int) -> int:
    return SAMPLER_BYTES_PER_LOGIT * rows * vocab


def penalty_slots(requests: int) -> int:
    """PenaltyCounts' capacity once it holds this many requests: 8, doubled until it does."""
    capacity = MIN_PENALTY_SLOTS
    while capacity < requests:
        capacity *= 2
    return capacity


def penalties_bound(requests: int, vocab: int) -> int:
    capacity = penalty_slots(requests)
    return (capacity + capacity // 2) * vocab * PENALTY_BYTES_PER_LOGIT


def graph_bytes_per_row(config: CausalLMConfig, widest: int, elem: int, width: int, block_size: int, gather: bool) -> int:
    """One row's share of a recorded decode graph at a table of `width` blocks (see the module's doc)."""
    h, layers, hq, hkv, d = config.hidden_size, config.num_layers, config.num_heads, config.num_kv_heads, config.head_dim
    inputs = (4 + width) * 8
    outputs = h * elem + 2 * (2 * layers * hkv * d * elem)
    dense = 4 * (2 * widest + 8 * h + 3 * (hq + 2 * hkv) * d)
    scores = width * block_size * (8 + 1 + 2 * 4 * hq) if gather else 0
    return inputs + outputs + dense + scores


def graph_pool_bound(model: CausalLM, dtype: torch.dtype, shape: StepShape) -> int:
    """The largest graph a CUDA worker records: its largest bucket at its widest table."""
    widest = max((m.out_features for m in model.layers.modules() if isinstance(m, nn.Linear)), default=0)
    config = model.config
    elem = torch.empty((), dtype=dtype).element_size()
    width = table_widths(shape.max_model_len, shape.block_size)[-1]
    gather = shape.graph_kernel == "gather"  # a library kernel reads the cache in place
    per_row = graph_bytes_per_row(config, widest or 4 * config.hidden_size, elem, width, shape.block_size, gather)
    return decode_buckets(shape.max_num_seqs)[-1] * per_row


@dataclass(slots=True)
class _History:  # a TokenHistory for the measuring run: one prompt token, nothing sampled
    token_ids: list[int]
    num_prompt_tokens: int = 1


def measure_sampler(reader: MemoryReader, shape: StepShape, vocab: int, device: torch.device) -> int:
    """The peak of one sampler call at the most rows, every processor on (penalties, top-k with
    top-p, min_p, logprobs) over a fresh Sampler whose counts are freed after (vLLM's dummy
    sampler run)."""
    rows = shape.sampled_rows
    options = protocol.SamplingOptions(
        temperature=1.0, top_k=50, top_p=0.9, min_p=0.01, logprobs=20,
        repetition_penalty=1.1, frequency_penalty=0.5, presence_penalty=0.5,
    )  # fmt: skip
    keys = [f"profile-{i % shape.max_num_seqs}" for i in range(rows)]
    histories = [_History([0]) for _ in range(rows)]
    logits = torch.zeros(rows, vocab, dtype=torch.float32, device=device)
    sampler = Sampler()

    def sample() -> None:
        sampler.sample(logits, [options] * rows, [None] * rows, histories, request_ids=keys)

    return profile_peak(reader, sample)  # the sampler and its counts go with this frame


def measure_graph_pool(reader: MemoryReader, model: CausalLM, dtype: torch.dtype, shape: StepShape) -> int | None:
    """The peak of recording the largest graph (DecodeGraph.record_largest) over a scratch cache
    of one block and the scratch block, its graphs and pool dropped again; None where it cannot
    compile (the worker's own warm-up will fail the same way and decode eagerly)."""
    c = model.config
    device = next(model.parameters()).device
    cache = torch.zeros((c.num_layers, 2, 2, shape.block_size, c.num_kv_heads, c.head_dim), dtype=dtype, device=device)
    try:
        graph = DecodeGraph(model, cache, max_num_seqs=shape.max_num_seqs, kernel=shape.graph_kernel,
                            max_model_len=shape.max_model_len)  # fmt: skip
        return profile_peak(reader, functools.partial(graph.record_largest, shape.max_model_len))
    except Exception as exc:  # an op inductor cannot lower, no compiler: the bound stands
        log.warning("could not record the largest decode graph to measure it: %s", exc)
        return None
    finally:
        if device.type == "cuda":
            from torch._inductor.cudagraph_trees import reset_cudagraph_trees

            reset_cudagraph_trees()  # the measuring graphs' pool; the worker records its own


def step_items(reader: MemoryReader, model: CausalLM, dtype: torch.dtype, shape: StepShape) -> StepItems:
    """The four items at their bounds; on CUDA the graph pool and the sampler measured too, each
    the larger of the two. Called after the profile run and before the KV cache is sized."""
    vocab = model.config.vocab_size
    device = next(model.parameters()).device
    notes = {"prompt logprobs": f"slices of {prompt_slice_rows(shape.prompt_rows, vocab)} rows, bound"}
    sampler = sampler_bound(shape.sampled_rows, vocab)
    penalties = penalties_bound(shape.max_num_seqs, vocab)
    notes["penalties"] = f"{penalty_slots(shape.max_num_seqs)} slots, bound"
    measured = measure_sampler(reader, shape, vocab, device)
    notes["sampler"] = f"{shape.sampled_rows} rows, bound; measured {measured / GIB:.2f} with the penalties"
    sampler = max(sampler, measured - penalties)
    pool = 0
    if shape.graphs:
        pool = graph_pool_bound(model, dtype, shape)
        graphs = len(decode_buckets(shape.max_num_seqs)) * len(table_widths(shape.max_model_len, shape.block_size))
        notes["graph pool"] = f"largest of {graphs} graphs, bound"
        if device.type == "cuda" and (recorded := measure_graph_pool(reader, model, dtype, shape)) is not None:
            notes["graph pool"] += f"; measured {recorded / GIB:.2f}"
            pool = max(pool, recorded)
    return StepItems(pool, sampler, penalties, prompt_logprobs_bound(shape.prompt_rows, vocab), notes)
