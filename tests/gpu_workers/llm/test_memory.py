"""The KV cache budget of workers sharing a GPU, on the CPU with a device the test keeps the
books of (FakeDevice): its processes' allocations and peaks, as CUDA's counters report them.
The arithmetic is checked against sums the test does itself, not against the module's own."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field

import pytest
import torch

from gpu_workers.llm.memory import DEFAULT_GPU_MEMORY_UTILIZATION, StepItems, kv_cache_budget, profile_peak

GIB = 1024**3


@dataclass
class FakeDevice:
    total: int
    held: dict[str, int] = field(default_factory=dict)  # process -> bytes it holds (reserved)

    def free(self) -> int:
        return self.total - sum(self.held.values())


@dataclass
class FakeProcess:
    """One process's view: what it allocated (weights), the peak of its last profile."""

    device: FakeDevice
    name: str
    allocated_now: int = 0
    peak_now: int = 0
    resets: int = 0

    def load(self, nbytes: int) -> None:
        self.allocated_now += nbytes
        self.peak_now = max(self.peak_now, self.allocated_now)
        self.device.held[self.name] = max(self.device.held.get(self.name, 0), self.allocated_now)

    def run_batch(self, activations: int) -> None:
        self.peak_now = max(self.peak_now, self.allocated_now + activations)
        # the caching allocator keeps the peak reserved for this process
        self.device.held[self.name] = max(self.device.held.get(self.name, 0), self.peak_now)

    # MemoryReader
    def free_and_total(self) -> tuple[int, int]:
        return self.device.free(), self.device.total

    def allocated(self) -> int:
        return self.allocated_now

    def reset_peak(self) -> None:
        self.resets += 1
        self.peak_now = self.allocated_now

    def peak(self) -> int:
        return self.peak_now

    def release(self) -> None:
        self.device.held[self.name] = self.allocated_now

    def hold(self, nbytes: int) -> None:
        self.device.held[self.name] = max(self.device.held.get(self.name, 0), self.allocated_now + nbytes)


def _start_llm(device: FakeDevice, name: str, weights: int, activations: int, shares: int, util: float | None) -> int:
    proc = FakeProcess(device, name)
    proc.load(weights)
    peak = profile_peak(proc, lambda: proc.run_batch(activations))
    assert peak == activations
    proc.release()
    kv = kv_cache_budget(proc, peak, util, shares).kv_bytes
    proc.load(kv)
    proc.hold(peak)
    return kv


def test_two_llm_workers_started_in_turn_split_the_device_evenly() -> None:
    device = FakeDevice(total=80 * GIB)
    encoder = FakeProcess(device, "encoder")
    encoder.load(3 * GIB)
    encoder.run_batch(5 * GIB)  # its profile: 8 GiB held from now on
    kv0 = _start_llm(device, "llm0", 16 * GIB, 2 * GIB, shares=2, util=0.9)
    kv1 = _start_llm(device, "llm1", 16 * GIB, 2 * GIB, shares=1, util=0.9)
    # 0.9 * 80 = 72 GiB, less the encoder's 8: 64, i.e. 32 GiB a worker, less 16 + 2 each
    assert kv0 == kv1 == int(0.9 * 80 * GIB) // 2 - 4 * GIB - 18 * GIB  # 14 GiB
    # everything held fits the 90 %, the rest stays free
    assert sum(device.held.values()) == int(0.9 * device.total)


def test_a_worker_alone_gets_what_the_share_leaves_and_the_default_share_is_vllms() -> None:
    device = FakeDevice(total=80 * GIB, held={"other process": 4 * GIB})
    kv = _start_llm(device, "llm0", 16 * GIB, 2 * GIB, shares=1, util=None)
    assert kv == int(DEFAULT_GPU_MEMORY_UTILIZATION * 80 * GIB) - 4 * GIB - 16 * GIB - 2 * GIB


def test_the_old_rule_overcommits_and_a_late_restart_takes_only_what_is_left() -> None:
    """Sized at once, both workers saw the whole device free (what A4 found); in turn, the
    second sees the first. A restarted worker (shares 1) gets back what it had."""
    device = FakeDevice(total=80 * GIB)
    kv0 = _start_llm(device, "llm0", 16 * GIB, 2 * GIB, shares=2, util=0.9)
    kv1 = _start_llm(device, "llm1", 16 * GIB, 2 * GIB, shares=1, util=0.9)
    del device.held["llm1"]  # it died
    again = _start_llm(device, "llm1", 16 * GIB, 2 * GIB, shares=1, util=0.9)
    assert again == kv1 == kv0


def test_no_room_names_the_numbers() -> None:
    device = FakeDevice(total=80 * GIB, held={"other": 60 * GIB})
    with pytest.raises(ValueError, match=r"no room for a KV cache: 0.5 of 80.0 GiB, 76.00 GiB used"):
        _start_llm(device, "llm0", 16 * GIB, 1 * GIB, shares=1, util=0.5)
    with pytest.raises(ValueError, match="shares"):
        kv_cache_budget(FakeProcess(device, "x"), 0, 0.9, shares=0)


def test_the_step_items_come_off_the_kv_cache_exactly_and_the_table_adds_up() -> None:
    """Graph pool, sampler, penalties and a prompt-logprobs slice: the KV cache is smaller by
    exactly their sum; the allocator holds the eager ones with the activation peak; the start-up
    table's rows (GiB) make up the whole device."""
    device = FakeDevice(total=80 * GIB, held={"encoder": 8 * GIB})
    proc = FakeProcess(device, "llm0")
    proc.load(16 * GIB)
    plain = kv_cache_budget(proc, 2 * GIB, 0.9)
    items = StepItems(graph_pool=GIB // 2, sampler=GIB // 4, penalties=GIB // 8, prompt_logprobs=GIB // 2)
    budget = kv_cache_budget(proc, 2 * GIB, 0.9, items=items)
    assert plain.kv_bytes - budget.kv_bytes == GIB // 2 + GIB // 4 + GIB // 8 + GIB // 2
    # 0.9 * 80 = 72 GiB, less the encoder's 8, the weights' 16, the prefill's 2 and the items' 1.375
    assert budget.kv_bytes == int(0.9 * 80 * GIB) - 8 * GIB - 16 * GIB - 2 * GIB - 11 * GIB // 8
    assert budget.held == 2 * GIB + GIB // 4 + GIB // 8 + GIB // 2  # the graph pool is its own pool
    rows = {name: n for name, n, _ in budget.rows()}
    assert rows == {
        "others on the device": 8 * GIB, "weights": 16 * GIB, "activation peak": 2 * GIB,
        "graph pool": GIB // 2, "sampler": GIB // 4, "penalties": GIB // 8, "prompt logprobs": GIB // 2,
        "KV cache": budget.kv_bytes, "headroom": 80 * GIB - int(0.9 * 80 * GIB),
    }  # fmt: skip
    assert sum(rows.values()) == 80 * GIB
    table = budget.table().splitlines()
    assert [line.split("  ")[1].strip() for line in table[1:]] == list(rows)
    assert "graph pool                       0.50 GiB" in table[4]
    assert "KV cache                        44.62 GiB" in table[8]
    # two workers still to size: the table names the other's share, and still adds up
    halves = kv_cache_budget(proc, 2 * GIB, 0.9, shares=2, items=items)
    assert sum(n for _, n, _ in halves.rows()) == 80 * GIB
    assert ("LLM workers still to size (1)", halves.share) in [(name, n) for name, n, _ in halves.rows()]


def test_a_layout_the_items_do_not_leave_room_for_is_refused_naming_them() -> None:
    device = FakeDevice(total=80 * GIB)
    proc = FakeProcess(device, "llm0")
    proc.load(60 * GIB)
    kv_cache_budget(proc, 2 * GIB, 0.9, items=StepItems(graph_pool=9 * GIB))  # 0.9 * 80 - 62 - 9: 1 GiB left
    with pytest.raises(
        ValueError,
        match=r"no room for a KV cache: 0.9 of 80.0 GiB, 60.00 GiB used .* less 2.00 GiB for its largest batch and "
        r"11.00 GiB for its steps' other buffers \(graph pool 9.00, sampler 1.00, penalties 0.50, prompt logprobs "
        r"0.50\): -1.00 GiB of KV cache; raise it, lower --max-num-seqs",
    ):
        kv_cache_budget(proc, 2 * GIB, 0.9, items=StepItems(9 * GIB, GIB, GIB // 2, GIB // 2))


def test_the_llm_runner_profiles_its_largest_step_then_sizes_its_share(
    tmp_path: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The runner on the CPU, with this test's device: it runs one real prefill of the
    largest step's tokens (over a scratch cache it then drops) and one sampler call at its most
    rows, and its KV cache is its share less the items its steps hold. It logs the table."""
    import torch

    from gpu_workers.llm.runner import LLMRunner, kv_bytes_per_block
    from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
    from omni.shared import protocol

    model_dir = make_tiny_checkpoint(tmp_path, "hyperclovax")  # type: ignore[arg-type]
    device = FakeDevice(total=64 * 1024**2, held={"encoder": 8 * 1024**2})
    proc = FakeProcess(device, "llm0")
    proc.load(4 * 1024**2)  # its weights, as CUDA would count them
    steps: list[int] = []
    execute = LLMRunner.execute

    def counted(self: LLMRunner, step: protocol.Step) -> protocol.StepResult:
        if step.new_requests:
            steps.append(sum(r.num_scheduled_tokens for r in step.new_requests))
            proc.run_batch(1024**2)  # what its activations took on the device
        return execute(self, step)

    monkeypatch.setattr(LLMRunner, "execute", counted)
    with caplog.at_level("INFO", logger="omni.llm_runner.memory"):
        runner = LLMRunner(
            model_dir, block_size=4, profile_tokens=100, memory_shares=2, gpu_memory_utilization=0.75, memory=proc
        )
    assert steps == [100] and proc.resets == 2 and not runner.requests  # the prefill's, the sampler's
    # 0.75 * 64 = 48 MiB, less the encoder's 8: 40, 20 a worker, less 4 of weights and 1 of
    # activations, and the steps' items (no compiled step: no graph pool): the sampler at 64
    # rows (64 bytes a logit), 64 penalty slots and 32 more while they grow (5 bytes), a slice
    # of 100 prompt rows (12 bytes a logit, 512 a row)
    v = runner.model_config.vocab_size
    items = 64 * 64 * v + (64 + 32) * 5 * v + 12 * 100 * v + 512 * 100
    expected = ((20 - 4 - 1) * 1024**2 - items) // kv_bytes_per_block(runner.model_config, 4, torch.float32)
    assert runner.num_kv_blocks == expected
    assert device.held["llm0"] == 4 * 1024**2 + 1024**2 + items  # weights, and held: activations and items
    (table,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("memory budget")]
    for row in ("weights", "activation peak", "graph pool", "sampler", "penalties", "prompt logprobs", "KV cache"):
        assert f"\n  {row} " in table
    assert "headroom" in table and "LLM workers still to size (1)" in table
    assert runner.kv_cache.shape[2] == expected
    # and it serves a request over that cache
    request = protocol.NewRequest("a", [1, 2, 3], protocol.SamplingOptions(temperature=0.0), [0], 0, 3)
    assert len(execute(runner, protocol.Step(1, [request], [], [])).sampled) == 1


def test_the_cpu_kv_cache_is_zeroed_and_asks_for_huge_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    """kv_cache_zeros: the shape and dtype asked, all zeros, and on Linux madvise(MADV_HUGEPAGE)
    over exactly the whole 2 MiB pages inside the tensor's memory, before the zeroing touches it."""
    from gpu_workers.llm import memory

    advised: list[tuple[int, int]] = []
    real = memory.advise_huge_pages

    def spy(address: int, size: int) -> bool:
        advised.append((address, size))
        return real(address, size)

    monkeypatch.setattr(memory, "advise_huge_pages", spy)
    cache = memory.kv_cache_zeros((4, 2, 256, 16, 4, 64), torch.bfloat16, torch.device("cpu"))
    assert cache.shape == (4, 2, 256, 16, 4, 64) and cache.dtype == torch.bfloat16
    assert not cache.any()
    assert advised == [(cache.data_ptr(), cache.numel() * 2)]
    # 16 MiB of cache: whole huge pages inside it exist, and a Linux kernel takes the advice
    if sys.platform.startswith("linux"):
        assert real(cache.data_ptr(), cache.numel() * 2)
    assert not real(cache.data_ptr(), 4096)  # no whole 2 MiB page inside: nothing to advise
