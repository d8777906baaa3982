"""A worker's share of its device's memory, measured rather than guessed (review A4, A7).

Every worker on a GPU runs its largest batch once before it reports ready (a profile run),
and keeps that peak reserved in torch's caching allocator (`hold`): it stays its own, and
shows as used to every worker that starts after it on the device. The LLM workers, which
size their KV caches from what is left, start last and one after another per device (the
server's start order, omni/engines/start_order.py), and each is told how many of them are
still to size on that device (`shares`):

    room   = utilization * total - used + own_static     used: the device's used memory now
    share  = room / shares                               (every earlier worker's peak, the
    kv     = share - own_static - activation_peak         others' processes, our weights)
                 - graph_pool - sampler - penalties - prompt_logprobs

`used` is read after the LLM worker's profile run has been released (its scratch KV cache
must not count); own_static (this process's weights, counted in `used` too) is added back so
that every LLM worker of a device pays for its own weights out of an equal share. The four
step items (StepItems) are what its steps hold besides the largest prefill's activations:
the compiled decode step's CUDA-graph pool, the sampler's (N, V) buffers at max_num_seqs rows,
the penalties' kept counts, one prompt-logprobs slice; llm/step_memory.py bounds each from
shapes and, on CUDA, measures the graph pool and the sampler before the KV cache is sized, as
vLLM sizes its cache after capturing. They are added, not maxed: a conservative bound (a
prompt-logprobs slice never runs in the prefill's peak, say). Once the KV cache is allocated
the worker holds its activation peak and the eager items again (`held`; the graph pool is a
private pool of its own, recorded at warm-up). A worker restarted later is told shares = 1:
the others hold theirs already.

The reader is injected: CudaMemory on a GPU; tests give a fake one and run the same
arithmetic and profile on the CPU.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch

from gpu_workers.host_pages import advise_huge_pages

# vLLM's default: what a worker may count on of its device when --gpu-memory-utilization is
# not given (the rest absorbs fragmentation and whatever is not torch's: contexts, NCCL, cuBLAS).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
GIB = 1024**3

log = logging.getLogger("omni.llm_runner.memory")


class MemoryReader(Protocol):
    def free_and_total(self) -> tuple[int, int]:
        """The device's free and total bytes, across every process on it."""
        ...

    def allocated(self) -> int:
        """Bytes this process's tensors hold now."""
        ...

    def reset_peak(self) -> None: ...

    def peak(self) -> int:
        """The most bytes this process's tensors held since reset_peak."""
        ...

    def release(self) -> None:
        """Give the allocator's cached, unused blocks back to the device."""
        ...

    def hold(self, nbytes: int) -> None:
        """Keep nbytes more than the tensors need reserved in the allocator's cache."""
        ...


class CudaMemory:
    def __init__(self, device: torch.device) -> None:
        self.device = device

    def free_and_total(self) -> tuple[int, int]:
        free, total = torch.cuda.mem_get_info(self.device)
        return int(free), int(total)

    def allocated(self) -> int:
        return int(torch.cuda.memory_allocated(self.device))

    def reset_peak(self) -> None:
        torch.cuda.synchronize(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        torch.cuda.synchronize(self.device)
        return int(torch.cuda.max_memory_allocated(self.device))

    def release(self) -> None:
        torch.cuda.empty_cache()

    def hold(self, nbytes: int) -> None:
        if nbytes > 0:  # freed at once, the block stays in the cache for this process's batches
            del_me = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            del del_me


def reader_for(device: torch.device) -> MemoryReader | None:
    """CUDA's counters on a GPU; None on the CPU, where a KV cache is sized in bytes (its
    default or --kv-cache-memory) and nothing else shares a budget."""
    return CudaMemory(device) if device.type == "cuda" else None


def profile_peak(reader: MemoryReader, forward: Callable[[], object]) -> int:
    """Bytes forward() needed above what was allocated before it (its activations)."""
    before = reader.allocated()
    reader.reset_peak()
    forward()
    return max(0, reader.peak() - before)


@dataclass(frozen=True, slots=True)
class StepItems:
    """Bytes a worker's steps hold besides its weights, its largest prefill's activations and
    its KV cache (llm/step_memory.py says how each is counted)."""

    graph_pool: int = 0  # the compiled decode step's CUDA graphs (one private pool)
    sampler: int = 0  # the sampler's (N, V) buffers at its most rows
    penalties: int = 0  # the penalties' (slots, V) counts, kept across steps
    prompt_logprobs: int = 0  # one slice of prompt-logprob rows
    notes: Mapping[str, str] = field(default_factory=dict)  # by item name: bound or measured

    @property
    def total(self) -> int:
        return self.graph_pool + self.sampler + self.penalties + self.prompt_logprobs

    @property
    def eager(self) -> int:
        """What the caching allocator serves (everything but the graphs' own pool)."""
        return self.sampler + self.penalties + self.prompt_logprobs

    def rows(self) -> list[tuple[str, int]]:
        return [
            ("graph pool", self.graph_pool),
            ("sampler", self.sampler),
            ("penalties", self.penalties),
            ("prompt logprobs", self.prompt_logprobs),
        ]


@dataclass(frozen=True, slots=True)
class KVBudget:
    """The numbers a KV cache's size came from, for the log line and the error."""

    total: int
    used: int
    own_static: int
    activation_peak: int
    utilization: float
    shares: int
    items: StepItems = field(default_factory=StepItems)

    @property
    def share(self) -> int:
        room = int(self.utilization * self.total) - self.used + self.own_static
        return room // self.shares

    @property
    def kv_bytes(self) -> int:
        return self.share - self.own_static - self.activation_peak - self.items.total

    @property
    def held(self) -> int:
        """What the allocator keeps reserved for the steps once the KV cache is allocated."""
        return self.activation_peak + self.items.eager

    def describe(self) -> str:
        return (
            f"{self.utilization:g} of {self.total / GIB:.1f} GiB, {self.used / GIB:.2f} GiB used "
            f"(of it {self.own_static / GIB:.2f} GiB this worker's weights), split {self.shares} ways: "
            f"{self.share / GIB:.2f} GiB for this worker, less {self.activation_peak / GIB:.2f} GiB "
            f"for its largest batch and {self.items.total / GIB:.2f} GiB for its steps' other buffers "
            f"({', '.join(f'{name} {n / GIB:.2f}' for name, n in self.items.rows())}): "
            f"{self.kv_bytes / GIB:.2f} GiB of KV cache"
        )

    def rows(self) -> list[tuple[str, int, str]]:
        """The device's memory as this worker's budget sees it, (item, bytes, note); the bytes add
        up to the device's total (to within the share's rounding)."""
        later = (self.shares - 1) * self.share
        rows = [
            ("others on the device", self.used - self.own_static, "other processes and workers, measured"),
            ("weights", self.own_static, "this worker's tensors before its profile"),
            ("activation peak", self.activation_peak, "the largest prefill, measured"),
            *((name, n, self.items.notes.get(name, "")) for name, n in self.items.rows()),
            ("KV cache", self.kv_bytes, "what the share leaves"),
            ("headroom", self.total - int(self.utilization * self.total), f"1 - utilization {self.utilization:g}"),
        ]
        if later:
            rows.insert(-1, (f"LLM workers still to size ({self.shares - 1})", later, "an equal share each"))
        return rows

    def table(self) -> str:
        """The start-up table the worker logs: one item a line, in GiB."""
        lines = [f"  {name:<28} {n / GIB:8.2f} GiB  {note}".rstrip() for name, n, note in self.rows()]
        return "\n".join([f"  {'device total':<28} {self.total / GIB:8.2f} GiB", *lines])


def kv_cache_budget(
    reader: MemoryReader,
    activation_peak: int,
    utilization: float | None,
    shares: int = 1,
    items: StepItems | None = None,
) -> KVBudget:
    """What this worker's KV cache may take; raises ValueError naming the numbers when nothing
    is left. The allocator's cached blocks are given back first: a profile's scratch (its KV
    cache, its peak) must not count as used."""
    if shares < 1:
        raise ValueError(f"shares must be at least 1, got {shares}")
    reader.release()
    free, total = reader.free_and_total()
    budget = KVBudget(
        total=total,
        used=total - free,
        own_static=reader.allocated(),
        activation_peak=activation_peak,
        utilization=DEFAULT_GPU_MEMORY_UTILIZATION if utilization is None else utilization,
        shares=shares,
        items=items or StepItems(),
    )
    if budget.kv_bytes <= 0:
        raise ValueError(
            f"--gpu-memory-utilization {budget.utilization:g}: no room for a KV cache: "
            f"{budget.describe()}; raise it, lower --max-num-seqs or --max-num-batched-tokens, "
            "free the device or put fewer workers on it"
        )
    log.info("memory budget (%d LLM workers to size on this device):\n%s", shares, budget.table())
    return budget


def kv_cache_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A zeroed KV cache. On a Linux CPU its memory is first marked for transparent huge pages
    (gpu_workers/host_pages.py), then zeroed: the first touch, all at start, while whole 2 MiB
    pages are easy to find. Decode reads each sequence's scattered blocks, and with 4 KiB pages
    nearly every block is a TLB miss (bench: the paged CPU kernel 18 % faster in bf16, 5 % in
    fp32). Committing as the cache fills instead (an anonymous mapping, zeroed on demand) cost
    the CPU text benchmark 4 %, its faults taken while serving (docs/BENCHMARKS.md, session 20)."""
    if device.type != "cpu":
        return torch.zeros(shape, dtype=dtype, device=device)
    cache = torch.empty(shape, dtype=dtype, device=device)
    advise_huge_pages(cache.data_ptr(), cache.numel() * cache.element_size())
    return cache.zero_()  # the first touch: the pages are faulted in huge where the kernel can
