"""Encoder outputs injected into the LLM's prompt: the right rows at the right positions, however
the prefill is chunked, and a request whose artifact cannot be used fails alone."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from gpu_workers.artifacts import embeddings_to_bytes
from gpu_workers.attention.backend import SequenceChunk
from gpu_workers.llm.runner import LLMRunner
from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from omni.shared import protocol

GREEDY = protocol.SamplingOptions(temperature=0.0)
HIDDEN = 64
PROMPT = [(7 * i + 3) % 1000 + 5 for i in range(30)]
SPAN = (8, 20)  # media rows at prompt positions [8, 20): 12 rows
SPAN_REF = (SPAN[0], SPAN[1] - SPAN[0])  # as MediaRef's (offset, length)
KEY = "enc/vision_encoder/test/image-a"
NUM_NEW = 4


def random_rows(n: int, seed: int, hidden: int = HIDDEN) -> torch.Tensor:
    # the scale of the tiny model's own embedding rows (initializer_range 0.1)
    return 0.1 * torch.randn(n, hidden, generator=torch.Generator().manual_seed(seed))


ROWS = random_rows(SPAN[1] - SPAN[0], seed=1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny-media"), "hyperclovax")


class Artifacts(dict[str, bytes]):
    """An in-memory artifact store that counts reads."""

    def __init__(self, items: dict[str, bytes]) -> None:
        super().__init__(items)
        self.reads: list[str] = []

    def read(self, key: str) -> bytes:
        self.reads.append(key)
        return self[key]


def artifact(rows: torch.Tensor) -> bytes:
    return embeddings_to_bytes(rows, {"component": "vision_encoder", "kind": "image"})


def make_runner(tiny: Path, artifacts: Artifacts) -> LLMRunner:
    return LLMRunner(tiny, block_size=4, num_kv_blocks=32, read_artifact=artifacts.read)


def media_request(request_id: str, prompt: list[int], blocks: list[int], n: int,
                  media: list[protocol.MediaRef]) -> protocol.NewRequest:  # fmt: skip
    return protocol.NewRequest(request_id, list(prompt), GREEDY, blocks, 0, n, media)


@contextmanager
def captured_logits(runner: LLMRunner) -> Iterator[list[torch.Tensor]]:
    """Every logits tensor the runner computes, in order."""
    seen: list[torch.Tensor] = []
    original = runner.model.compute_logits

    def capture(hidden: torch.Tensor) -> torch.Tensor:
        logits = original(hidden)
        seen.append(logits.clone())
        return logits

    runner.model.compute_logits = capture  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del runner.model.compute_logits


# ---- the reference: one stateless forward over the whole sequence -------------------------


def reference_logits(runner: LLMRunner, tokens: list[int], rows: torch.Tensor | None) -> torch.Tensor:
    """Last-position logits of a stateless full prefill (no KV cache), media spliced by hand."""
    ids = torch.tensor(tokens)
    with torch.inference_mode():
        embeds = runner.model.embed(ids).clone()  # (T, H)
        if rows is not None:
            embeds[SPAN[0] : SPAN[1]] = rows
        meta = runner.attention_backend.build_metadata([SequenceChunk(0, len(tokens), 0, [])])
        hidden = runner.model(ids, torch.arange(len(tokens)), None, meta, inputs_embeds=embeds)
        return runner.model.compute_logits(hidden[-1:])[0]


def reference_greedy(
    runner: LLMRunner, prompt: list[int], rows: torch.Tensor | None, n: int
) -> tuple[list[int], torch.Tensor]:
    """n greedy tokens, recomputing the whole sequence each time, and the first token's logits."""
    tokens = list(prompt)
    first = reference_logits(runner, tokens, rows)
    for _ in range(n):
        tokens.append(int(reference_logits(runner, tokens, rows).argmax()))
    return tokens[len(prompt) :], first


# ---- driving the runner -------------------------------------------------------------------


def run_chunks(
    runner: LLMRunner, chunks: list[tuple[int, int]], n: int, *, companion: list[int] | None = None
) -> list[int]:
    """Prefill PROMPT (media at SPAN) in the given chunks, then decode; a companion request, if
    given, is packed ahead of it in every step, so the media rows sit at a non-zero row offset."""
    media = [protocol.MediaRef(KEY, *SPAN_REF)]
    m_blocks = list(range(9))  # 30 + 4 tokens in blocks of 4
    c_blocks = list(range(9, 12))
    out: list[int] = []
    step_id = 0
    companion_computed = 0
    for i, (start, end) in enumerate(chunks):
        new: list[protocol.NewRequest] = []
        cached: list[protocol.CachedRequest] = []
        if companion is not None:
            if i == 0:
                new.append(protocol.NewRequest("c", companion, GREEDY, c_blocks, 0, len(companion)))
                companion_computed = len(companion)
            else:
                cached.append(protocol.CachedRequest("c", [], companion_computed, 1))
                companion_computed += 1
        if i == 0:
            assert start == 0
            new.append(media_request("m", PROMPT, m_blocks, end, media))
        else:
            cached.append(protocol.CachedRequest("m", [], start, end - start))
        result = runner.execute(protocol.Step(step_id, new, cached, []))
        step_id += 1
        assert result.failed == []
        sampled = {s.request_id: s.token_id for s in result.sampled}
        assert ("m" in sampled) == (end == len(PROMPT))
        if companion is not None:
            assert "c" in sampled
        if "m" in sampled:
            out.append(sampled["m"])
    while len(out) < n:
        pos = len(PROMPT) + len(out) - 1
        result = runner.execute(protocol.Step(step_id, [], [protocol.CachedRequest("m", [], pos, 1)], []))
        step_id += 1
        out.append(result.sampled[0].token_id)
    runner.execute(protocol.Step(step_id, [], [], ["m", "c"]))
    assert not runner.requests
    return out


# ---- a. injection ---------------------------------------------------------------------------


def test_injected_rows_match_a_stateless_reference(tiny: Path) -> None:
    artifacts = Artifacts({KEY: artifact(ROWS)})
    runner = make_runner(tiny, artifacts)
    want_tokens, want_logits = reference_greedy(runner, PROMPT, ROWS, NUM_NEW)
    with captured_logits(runner) as seen:
        got_tokens = run_chunks(runner, [(0, len(PROMPT))], NUM_NEW)
    assert got_tokens == want_tokens
    assert (seen[0][0] - want_logits).abs().max().item() < 1e-4
    assert artifacts.reads == [KEY]  # decode steps do not touch the media span

    # the injection matters: other rows, or the placeholder tokens themselves, predict otherwise
    other = reference_logits(runner, PROMPT, random_rows(12, seed=2))
    plain = reference_logits(runner, PROMPT, None)
    assert (other - want_logits).abs().max().item() > 1e-2
    assert (plain - want_logits).abs().max().item() > 1e-2


# ---- b. chunks that cut the media span -----------------------------------------------------


@pytest.mark.parametrize(
    "chunks",
    [
        [(0, 10), (10, 17), (17, 30)],  # cuts the span twice
        [(0, 8), (8, 20), (20, 30)],  # chunk edges on the span's edges
        [(0, 19), (19, 20), (20, 21), (21, 30)],  # the span's last row alone
    ],
    ids=["cut-twice", "on-edges", "last-row-alone"],
)
def test_chunked_prefill_through_the_span_equals_one_prefill(tiny: Path, chunks: list[tuple[int, int]]) -> None:
    artifacts = Artifacts({KEY: artifact(ROWS)})
    runner = make_runner(tiny, artifacts)
    want_tokens, want_logits = reference_greedy(runner, PROMPT, ROWS, NUM_NEW)
    with captured_logits(runner) as seen:
        got = run_chunks(runner, chunks, NUM_NEW, companion=[40, 41, 42, 43, 44])
    assert got == want_tokens
    # the step that finished the prompt sampled [companion, m]: m's row is the last
    first = next(logits for logits in seen if logits.shape[0] == 2)
    assert (first[1] - want_logits).abs().max().item() < 1e-4
    assert artifacts.reads == [KEY]  # read once, then served from the embedding cache


# ---- c. an unreadable artifact fails its request only ---------------------------------------


def test_missing_artifact_fails_only_its_request(tiny: Path) -> None:
    runner = make_runner(tiny, Artifacts({}))
    plain = [50, 51, 52, 53, 54, 55]
    want = int(reference_logits(runner, plain, None).argmax())
    step = protocol.Step(
        0,
        [
            media_request("m", PROMPT, list(range(8)), len(PROMPT), [protocol.MediaRef(KEY, *SPAN_REF)]),
            protocol.NewRequest("p", plain, GREEDY, [8, 9], 0, len(plain)),
        ],
        [],
        [],
    )
    result = runner.execute(step)
    assert [f.request_id for f in result.failed] == ["m"]
    assert KEY in result.failed[0].reason
    assert [(s.request_id, s.token_id) for s in result.sampled] == [("p", want)]
    assert set(runner.requests) == {"p"}
    with pytest.raises(ValueError, match="unknown"):
        runner.execute(protocol.Step(1, [], [protocol.CachedRequest("m", [], 0, 1)], []))
    # alone in its step: nothing runs, the failure is still reported
    m2 = media_request("m2", PROMPT, list(range(10, 18)), 10, [protocol.MediaRef(KEY, *SPAN_REF)])
    alone = runner.execute(protocol.Step(2, [m2], [], []))
    assert alone.sampled == [] and [f.request_id for f in alone.failed] == ["m2"]
    assert set(runner.requests) == {"p"}


def test_failure_in_a_later_chunk_drops_the_request_then(tiny: Path) -> None:
    # the span lies in the second chunk: the first chunk runs, the second one fails the request
    runner = make_runner(tiny, Artifacts({}))
    r = media_request("m", PROMPT, list(range(8)), 8, [protocol.MediaRef(KEY, *SPAN_REF)])
    first = runner.execute(protocol.Step(0, [r], [], []))
    assert (first.sampled, first.failed) == ([], [])
    second = runner.execute(protocol.Step(1, [], [protocol.CachedRequest("m", [], 8, 8)], []))
    assert [f.request_id for f in second.failed] == ["m"] and not runner.requests


# ---- d. malformed media -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stored", "reason"),
    [
        (lambda: artifact(random_rows(10, seed=3)), "holds (10, 64) embeddings, the prompt wants (12, 64)"),
        (lambda: artifact(random_rows(12, seed=3, hidden=32)), "holds (12, 32) embeddings"),
        (lambda: b"not safetensors", "deserializing"),
    ],
    ids=["short", "narrow", "junk"],
)
def test_malformed_artifact_fails_its_request_not_the_step(
    tiny: Path, stored: Callable[[], bytes], reason: str
) -> None:
    runner = make_runner(tiny, Artifacts({KEY: stored()}))
    plain = [60, 61, 62]
    want = int(reference_logits(runner, plain, None).argmax())
    step = protocol.Step(
        0,
        [
            protocol.NewRequest("p", plain, GREEDY, [9], 0, len(plain)),
            media_request("m", PROMPT, list(range(8)), len(PROMPT), [protocol.MediaRef(KEY, *SPAN_REF)]),
        ],
        [],
        [],
    )
    result = runner.execute(step)
    assert [f.request_id for f in result.failed] == ["m"]
    assert result.failed[0].reason.startswith(f"cannot read encoder output {KEY}: ")
    assert reason in result.failed[0].reason
    assert [(s.request_id, s.token_id) for s in result.sampled] == [("p", want)]
    assert set(runner.requests) == {"p"}


@pytest.mark.parametrize(
    "spans",
    [
        [(2, 5), (6, 3)],  # [2, 7) and [6, 9) overlap
        [(10, 2), (2, 2)],  # not sorted by offset
        [(25, 6)],  # ends at 31, past the 30-token prompt
        [(-1, 3)],
        [(4, 0)],  # empty
    ],
    ids=["overlap", "unsorted", "past-end", "negative", "empty"],
)
def test_bad_spans_reject_the_step_and_change_nothing(tiny: Path, spans: list[tuple[int, int]]) -> None:
    runner = make_runner(tiny, Artifacts({KEY: artifact(ROWS)}))
    runner.execute(protocol.Step(0, [protocol.NewRequest("p", [1, 2, 3], GREEDY, [9], 0, 3)], [], []))
    media = [protocol.MediaRef(KEY, offset, length) for offset, length in spans]
    step = protocol.Step(1, [media_request("m", PROMPT, list(range(8)), len(PROMPT), media)], [], [])
    with pytest.raises(ValueError, match="media spans must be sorted, disjoint and inside the prompt"):
        runner.execute(step)
    assert set(runner.requests) == {"p"}


def test_media_without_an_artifact_reader_is_rejected(tiny: Path) -> None:
    runner = LLMRunner(tiny, block_size=4, num_kv_blocks=32)
    m = media_request("m", PROMPT, list(range(8)), len(PROMPT), [protocol.MediaRef(KEY, *SPAN_REF)])
    step = protocol.Step(0, [m], [], [])
    with pytest.raises(ValueError, match="no artifact store"):
        runner.execute(step)
    assert not runner.requests


def test_a_request_reading_blocks_of_a_dropped_one_in_the_same_step_leaves_too(tiny: Path) -> None:
    # "m" was to write blocks 0-7 this step; "s" got a prefix hit on blocks 0-1 in the same
    # schedule pass (their hashes were registered when "m" was scheduled) and computes the
    # rest. "m" is dropped, so blocks 0-1 are never written: "s" must not run on them, and
    # "t", which reads only its own blocks, is unaffected.
    runner = make_runner(tiny, Artifacts({}))
    shared = PROMPT[:8] + [70, 71, 72]
    plain = [50, 51, 52, 53, 54, 55]
    want = int(reference_logits(runner, plain, None).argmax())
    step = protocol.Step(
        0,
        [
            media_request("m", PROMPT, list(range(8)), len(PROMPT), [protocol.MediaRef(KEY, *SPAN_REF)]),
            protocol.NewRequest("s", shared, GREEDY, [0, 1, 20], 8, len(shared) - 8),
            protocol.NewRequest("t", plain, GREEDY, [21, 22], 0, len(plain)),
        ],
        [],
        [],
    )
    result = runner.execute(step)
    assert [f.request_id for f in result.failed] == ["m", "s"]
    assert "same step" in result.failed[1].reason
    assert [(s.request_id, s.token_id) for s in result.sampled] == [("t", want)]
    assert set(runner.requests) == {"t"}


def test_a_steps_artifacts_are_prefetched_together_and_failures_stay_per_request(tiny: Path) -> None:
    rows = random_rows(SPAN_REF[1], seed=5)
    artifacts = Artifacts({KEY: artifact(rows), KEY + "-b": artifact(random_rows(SPAN_REF[1], seed=6))})
    runner = make_runner(tiny, artifacts)
    ref_a, ref_b = protocol.MediaRef(KEY, *SPAN_REF), protocol.MediaRef(KEY + "-b", *SPAN_REF)
    missing = protocol.MediaRef(KEY + "-gone", *SPAN_REF)
    step = protocol.Step(
        0,
        [
            media_request("a", PROMPT, list(range(8)), len(PROMPT), [ref_a]),
            media_request("b", PROMPT, list(range(8, 16)), len(PROMPT), [ref_b]),
            media_request("c", PROMPT, list(range(16, 24)), len(PROMPT), [missing]),
        ],
        [],
        [],
    )
    result = runner.execute(step)
    assert [f.request_id for f in result.failed] == ["c"]
    assert sorted(s.request_id for s in result.sampled) == ["a", "b"]
    # each present artifact read once (by the prefetch), the missing one tried again for its error
    assert sorted(artifacts.reads) == sorted([KEY, KEY + "-b", KEY + "-gone", KEY + "-gone"])
    want_a = int(reference_logits(runner, PROMPT, rows).argmax())
    assert next(s.token_id for s in result.sampled if s.request_id == "a") == want_a


# ---- e. reads start when a request is placed (review C5) -------------------------------------


class GatedArtifacts(Artifacts):
    """A store whose reads block until the test opens the gate: shows where a read waits."""

    def __init__(self, items: dict[str, bytes]) -> None:
        super().__init__(items)
        self.gate = threading.Event()

    def read(self, key: str) -> bytes:
        self.reads.append(key)
        assert self.gate.wait(10), "the gate stayed shut"
        return self[key]


def test_media_is_read_when_the_request_is_placed_not_in_its_step(tiny: Path) -> None:
    artifacts = GatedArtifacts({KEY: artifact(ROWS)})
    runner = make_runner(tiny, artifacts)
    # placed while another request runs: its key rides on that step, whose forward does not wait
    plain = media_request("t", [60, 61, 62], list(range(8, 16)), 3, [])
    first = runner.execute(protocol.Step(0, [plain], [], [], media_prefetch=[KEY]))
    assert [s.request_id for s in first.sampled] == ["t"]  # ran with the read still blocked
    assert artifacts.reads == [KEY]
    artifacts.gate.set()
    m = media_request("m", PROMPT, list(range(8)), len(PROMPT), [protocol.MediaRef(KEY, *SPAN_REF)])
    result = runner.execute(protocol.Step(1, [m], [], []))
    assert artifacts.reads == [KEY]  # its step read nothing more
    want = int(reference_logits(runner, PROMPT, ROWS).argmax())
    assert [(s.request_id, s.token_id) for s in result.sampled] == [("m", want)]
    assert runner._fetches == {}  # collected


def test_a_requests_first_chunk_starts_reading_its_later_chunks_media(tiny: Path) -> None:
    rows_b = random_rows(SPAN_REF[1], seed=9)
    artifacts = Artifacts({KEY: artifact(ROWS), KEY + "-late": artifact(rows_b)})
    runner = make_runner(tiny, artifacts)
    late = protocol.MediaRef(KEY + "-late", SPAN_REF[0] + len(PROMPT), SPAN_REF[1])
    prompt = PROMPT + PROMPT
    r = media_request("m", prompt, list(range(16)), 4, [protocol.MediaRef(KEY, *SPAN_REF), late])
    runner.execute(protocol.Step(0, [r], [], []))  # chunk [0, 4): neither span yet
    runner._fetches[KEY + "-late"].result()  # both reads were started by the first chunk
    assert sorted(artifacts.reads) == [KEY, KEY + "-late"]
