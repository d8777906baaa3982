from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpu_workers.tiny.checkpoints import make_tiny_checkpoint
from gpu_workers.tiny.published import make_tiny_omni_checkpoint
from tests.e2e.server import free_port, running_server

BLOCK_SIZE = 4
E2E_DIR = Path(__file__).resolve().parent
# The browser test's page is served from this origin, which the shared server allows (CORS).
CORS_PAGE_PORT = free_port()
CORS_PAGE_ORIGIN = f"http://127.0.0.1:{CORS_PAGE_PORT}"


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test here starts the real server: all are slow; -m "not slow" is the unit suite."""
    for item in items:
        if item.path.is_relative_to(E2E_DIR):
            item.add_marker(pytest.mark.slow)
        # schemathesis names its items per operation (test_fuzz[POST /v1/completions]) but gives
        # them all the function's node id; pytest-xdist schedules by node id and would run one.
        if isinstance(item, pytest.Function) and item.name != item.originalname and not item.nodeid.endswith("]"):
            if hasattr(item, "_id"):  # pytest 9: the id pytest gives its own parametrized items
                item._id = item.parent.id.child(item.name)
            else:
                item._nodeid = f"{item.nodeid}[{item.name.removeprefix(item.originalname + '[')}"


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "omni-tiny", "hyperclovax")


@pytest.fixture(scope="session")
def server(tiny_model_dir: Path) -> Iterator[str]:
    """One shared server on the tiny hyperclovax checkpoint (small blocks: boundaries matter)."""
    with running_server(
        "--model",
        f"omni-tiny={tiny_model_dir}",
        "--block-size",
        str(BLOCK_SIZE),
        "--num-kv-blocks",
        "512",
        "--max-model-len",
        "1024",
        "--trust-request-chat-template",
        "--max-request-bytes",
        "65536",
        "--allowed-origins",
        f'["{CORS_PAGE_ORIGIN}"]',  # as vLLM takes it
    ) as base:
        yield base


# The shared omni server's denoising steps: every image drawn on it is quick.
DIFFUSION_STEPS = 2


@pytest.fixture(scope="session")
def omni_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_omni_checkpoint(tmp_path_factory.mktemp("ckpt") / "omni")


@pytest.fixture(scope="session")
def speaking_server(omni_dir: Path) -> Iterator[str]:
    """The tiny omni checkpoint with all it has, served as "omni": it draws (images; its decoder
    2 ranks running transformer | transformer2 at once, --image-guidance-parallel's auto), speaks
    (speech, chat audio) and hears (transcription). One start for those test modules. (That two
    ranks draw what one process draws, byte for byte, is tests/gpu_workers/vision_decoder/'s
    test_runner.py for Ulysses and test_guidance_parallel.py for guidance parallelism; replicas
    are test_images.py's own server: session servers stay up to the end, and CI's 24 GiB hold
    only so many processes.)"""
    with running_server(
        "--model", f"omni={omni_dir}", "--max-model-len", "2048", "--diffusion-steps", str(DIFFUSION_STEPS),
        "--vision-decoder-devices", "cpu,cpu",
    ) as base:  # fmt: skip
        yield base


@dataclass(frozen=True)
class Dialect:
    """A served chat dialect for the tests that run on both: the bare LLM checkpoint with its
    own template ("bare", the session's `server`), and the published-layout default that
    bin/omni-serve serves ("published", `speaking_server`: the reference template, which opens
    a reasoning block unless told otherwise)."""

    name: str
    base: str
    model: str
    # what every chat request adds on it: random weights never close the reference template's
    # reasoning block, so the tests that read `content` ask it skipped, as a client would
    chat: dict[str, Any] = field(default_factory=dict)


SKIP_REASONING: dict[str, Any] = {"chat_template_kwargs": {"skip_reasoning": True}}


@pytest.fixture(params=["bare", "published"])
def dialect(request: pytest.FixtureRequest) -> Dialect:
    """Both served dialects, one per test; no server of its own (each is a session server)."""
    if request.param == "bare":
        return Dialect("bare", request.getfixturevalue("server"), "omni-tiny")
    return Dialect("published", request.getfixturevalue("speaking_server"), "omni", SKIP_REASONING)


def read_metric(base: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus series' samples whose labels include the given ones."""
    with urllib.request.urlopen(f"{base}/metrics", timeout=120) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        match = re.match(rf"^{re.escape(name)}(\{{[^}}]*\}})?\s+(\S+)$", line)
        if not match:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(match.group(2))
    return total
