from __future__ import annotations

import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from omni.shared.store import ArtifactStore, LocalStore

if TYPE_CHECKING:  # imported where used: S3Store needs aiobotocore, which a bare checkout may lack
    from omni.shared.store.s3 import S3Store

BUCKET = "omni-test"
AWS_TEST_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never read the developer's ~/.aws or probe an instance-metadata endpoint.
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    for name, value in AWS_TEST_ENV.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
        import boto3

        boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        ).create_bucket(Bucket=BUCKET)
        yield endpoint
    finally:
        server.stop()


def make_s3_store(endpoint: str, **kwargs: float) -> S3Store:
    from omni.shared.store.s3 import S3Store

    # A fresh prefix per store keeps tests independent in the one session-wide bucket.
    kwargs = {"connect_timeout_s": 2.0, "read_timeout_s": 5.0, **kwargs}
    return S3Store(
        BUCKET, prefix=f"t-{uuid.uuid4().hex}", endpoint_url=endpoint, region="us-east-1", **kwargs
    )


@pytest.fixture
async def s3_store(moto_endpoint: str, aws_env: None) -> AsyncIterator[S3Store]:
    store = make_s3_store(moto_endpoint)
    async with store:
        yield store


@pytest.fixture
def local_store(tmp_path: Path) -> LocalStore:
    return LocalStore(tmp_path / "artifacts", "http://testserver", b"test-secret")


@pytest.fixture(params=["local", "s3"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[ArtifactStore]:
    # Only sync fixtures are requested here: an async one cannot be set up from inside
    # this (already running) fixture's event loop.
    if request.param == "local":
        yield LocalStore(tmp_path / "artifacts", "http://testserver", b"test-secret")
    else:
        request.getfixturevalue("aws_env")
        async with make_s3_store(request.getfixturevalue("moto_endpoint")) as s3:
            yield s3


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port  # nothing listens here once the socket is closed
