"""Large hostile bodies against the real server, and what other clients see meanwhile.

For each body shape, a server on the omni tiny checkpoint (as tests/e2e/test_hostile_input.py
starts it) gets the body paced over about 2.5 s while two other clients call /health and a
short chat over and over; printed per run: how long after its last byte the body was answered,
and the worst /health and short-chat latencies between its first byte and its answer.

    .venv/bin/python bench/large_bodies.py                    # every shape, 2 runs each
    .venv/bin/python bench/large_bodies.py --shapes prompt --runs 5

Shapes: prompt (a 60 MB chat message), image (a 40 MB data URL), messages (500k short chat
messages, 62 MB), ids (a completions prompt of 8M token ids, 64 MB). Results: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import base64
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gpu_workers.tiny.published import make_tiny_omni_checkpoint  # noqa: E402
from tests.e2e import test_hostile_input as hostile  # noqa: E402

MODEL = hostile.MODEL


def body(shape: str) -> tuple[str, bytes]:
    """(path, body) of one shape."""
    if shape == "prompt":
        text = "All work and no play makes Jack a dull boy. " * (60_000_000 // 44)
        return "/v1/chat/completions", orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": text}], "max_tokens": 4})
    if shape == "image":
        url = "data:image/png;base64," + base64.b64encode(random.Random(0).randbytes(30_000_000)).decode()
        content = [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": url}}]
        return "/v1/chat/completions", orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": content}], "max_tokens": 4})
    if shape == "messages":
        messages = [{"role": "user", "content": "hello world " * 8}] * 500_000
        return "/v1/chat/completions", orjson.dumps({"model": MODEL, "messages": messages, "max_tokens": 4})
    if shape == "ids":
        return "/v1/completions", orjson.dumps({"model": MODEL, "prompt": list(range(1_000_000, 9_000_000)), "max_tokens": 4})
    raise ValueError(shape)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default="prompt,image,messages,ids")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = make_tiny_omni_checkpoint(Path(tmp) / "omni-tiny")
        timeouts = ("--header-timeout", "5", "--body-timeout", "30")
        media = ("--max-media-bytes", str(hostile.MAX_MEDIA_BYTES), "--no-audio-output", "--no-image-output")
        with hostile.logged_server(model_dir, Path(tmp) / "server.log", *timeouts, *media) as (base, _):
            alone = []
            with httpx.Client(base_url=base, timeout=60) as client:
                for _ in range(20):
                    start = time.monotonic()
                    client.post("/v1/chat/completions", json=hostile.SHORT_CHAT)
                    alone.append(time.monotonic() - start)
            print(f"short chat alone: median {sorted(alone)[10] * 1000:.0f} ms")
            for shape in args.shapes.split(","):
                path, payload = body(shape)
                for run in range(args.runs):
                    flight = hostile._in_flight(base, payload, path)
                    status = flight.response.split(b"\r\n", 1)[0].decode()
                    print(f"{shape} ({len(payload) / 1e6:.0f} MB) run {run + 1}: {status}; {flight.figures()}")


if __name__ == "__main__":
    main()
