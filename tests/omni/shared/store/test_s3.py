import asyncio

import aiohttp
import pytest

from omni.shared.store import KeyNotFound, StoreError
from omni.shared.store.s3 import S3Store
from tests.omni.shared.store.conftest import BUCKET, make_s3_store


async def test_presigned_url_is_fetchable(s3_store: S3Store) -> None:
    await s3_store.put("out/image/x.png", b"\x89PNG data", "image/png")
    url = await s3_store.url("out/image/x.png", 60)
    assert "X-Amz-Signature=" in url and f"/{BUCKET}/{s3_store.prefix}/out/image/x.png" in url
    async with aiohttp.ClientSession() as http:
        async with http.get(url) as resp:
            assert resp.status == 200
            assert resp.content_type == "image/png"
            assert await resp.read() == b"\x89PNG data"
    # (moto does not check presigned signatures, so tampering is not tested here.)


async def test_prefix_namespaces_keys(moto_endpoint: str, aws_env: None) -> None:
    async with make_s3_store(moto_endpoint) as a, make_s3_store(moto_endpoint) as b:
        await a.put("k", b"from a")
        assert not await b.exists("k")
        with pytest.raises(KeyNotFound):
            await b.get("k")


async def test_unreachable_endpoint_is_a_quick_store_error(
    closed_port: int, aws_env: None
) -> None:
    store = make_s3_store(
        f"http://127.0.0.1:{closed_port}", connect_timeout_s=0.5, read_timeout_s=0.5, max_attempts=1
    )
    async with store:
        for op in (store.put("k", b"x"), store.get("k"), store.exists("k"), store.delete("k")):
            with pytest.raises(StoreError, match=f"s3://{BUCKET}/") as info:
                await asyncio.wait_for(op, timeout=120)  # a hang fails here (TimeoutError), not a slow host
            assert "Traceback" not in str(info.value)


async def test_missing_bucket_is_a_store_error(moto_endpoint: str, aws_env: None) -> None:
    async with S3Store("no-such-bucket", endpoint_url=moto_endpoint, region="us-east-1") as store:
        with pytest.raises(StoreError, match="NoSuchBucket"):
            await store.put("k", b"x")


async def test_use_before_start_is_a_store_error() -> None:
    with pytest.raises(StoreError, match="not started"):
        await S3Store("b").get("k")


def test_prefix_is_validated() -> None:
    assert S3Store("b", prefix="/a/b/").prefix == "a/b"
    assert S3Store("b").prefix == ""
    with pytest.raises(ValueError):
        S3Store("b", prefix="a/../b")
