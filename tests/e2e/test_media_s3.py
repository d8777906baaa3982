"""The artifact store on S3 end to end: moto's S3 server on loopback (started and stopped here),
encoder outputs written there by the encoder worker, read by the LLM worker, and reused by a
second server that never saw the image."""

from __future__ import annotations

import base64
import io
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from PIL import Image

from gpu_workers.tiny.published import make_tiny_omni_checkpoint
from tests.e2e.conftest import read_metric
from tests.e2e.server import running_server
from tests.omni.shared.store.conftest import AWS_TEST_ENV

MODEL = "omni-tiny"
BUCKET = "omni-e2e"
PREFIX = "run1"


class Moto:
    def __init__(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self.server.start()
        host, port = self.server.get_host_and_port()
        self.endpoint = f"http://{host}:{port}"
        self.running = True

    def client(self):  # type: ignore[no-untyped-def]
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def stop(self) -> None:
        if self.running:
            self.server.stop()
            self.running = False


@pytest.fixture(scope="module")
def moto() -> Iterator[Moto]:
    m = Moto()
    m.client().create_bucket(Bucket=BUCKET)
    try:
        yield m
    finally:
        m.stop()


@pytest.fixture(scope="module")
def omni_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_omni_checkpoint(tmp_path_factory.mktemp("omni") / "omni-tiny")


def serve_on_s3(omni_dir: Path, moto: Moto):  # type: ignore[no-untyped-def]
    return running_server(
        "--model", f"{MODEL}={omni_dir}",
        "--no-audio-output", "--no-image-output",  # no decoder is used here: two processes less to start
        "--block-size", "4",
        "--num-kv-blocks", "1024",
        "--max-model-len", "1024",
        "--store", f"s3://{BUCKET}/{PREFIX}",
        "--store-endpoint-url", moto.endpoint,
        "--store-region", "us-east-1",
        env=AWS_TEST_ENV,
    )  # fmt: skip


def image_request(seed: int) -> dict[str, object]:
    pixels = (np.random.default_rng(seed).random((60, 80, 3)) * 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    content = [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": "What?"}]
    return {"model": MODEL, "max_tokens": 4, "temperature": 0, "messages": [{"role": "user", "content": content}]}


def encoder_calls(base: str) -> float:
    return read_metric(base, "omni_encoder_batch_seconds_count", model_name=MODEL)


def test_s3_store_end_to_end(moto: Moto, omni_dir: Path) -> None:
    with serve_on_s3(omni_dir, moto) as base, httpx.Client(base_url=base, timeout=120) as http:
        first = http.post("/v1/chat/completions", json=image_request(seed=1))
        assert first.status_code == 200, first.text
        calls = encoder_calls(base)
        again = http.post("/v1/chat/completions", json=image_request(seed=1))
        assert again.status_code == 200
        assert encoder_calls(base) == calls  # served from the store's key, no encode
        assert again.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]

    keys = [o["Key"] for o in moto.client().list_objects_v2(Bucket=BUCKET)["Contents"]]
    components = {k.split("/")[2] for k in keys}
    assert all(k.startswith(f"{PREFIX}/enc/") for k in keys)
    assert components == {"vision_encoder", "image_tokenizer"}

    # A second server (nothing in memory) finds the outputs by key in the bucket.
    with serve_on_s3(omni_dir, moto) as base, httpx.Client(base_url=base, timeout=120) as http:
        r = http.post("/v1/chat/completions", json=image_request(seed=1))
        assert r.status_code == 200, r.text
        assert encoder_calls(base) == 0
        assert read_metric(base, "omni_encoder_cache_hits_total", model_name=MODEL) == 2
        assert r.json()["choices"][0]["message"] == first.json()["choices"][0]["message"]

        # S3 goes away: a new image cannot be handed to the LLM worker (a clear 503, nothing
        # half-written), while text requests are untouched and the server keeps serving.
        moto.stop()
        down = http.post("/v1/chat/completions", json=image_request(seed=2))
        assert down.status_code == 503, down.text
        assert "artifact store" in down.json()["error"]["message"]
        text = {"model": MODEL, "max_tokens": 3, "messages": [{"role": "user", "content": "Hello"}]}
        assert http.post("/v1/chat/completions", json=text).status_code == 200
        assert read_metric(base, "omni_store_errors_total") > 0
