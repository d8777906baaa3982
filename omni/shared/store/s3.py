"""S3Store: artifacts as objects in an S3 bucket (or any S3-compatible endpoint), via aiobotocore.

Credentials come from the standard environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
AWS_SESSION_TOKEN, AWS_PROFILE, instance roles); nothing here reads or stores them.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError

from omni.shared.store.base import ArtifactStore, KeyNotFound, StoreError, validate_key

_NOT_FOUND_CODES = frozenset({"NoSuchKey", "NotFound", "404"})
# Everything a call can fail with that is not a bug here: HTTP-level errors from S3, and
# connection/timeout/credential errors from botocore or the transport under it.
_BACKEND_ERRORS = (BotoCoreError, ClientError, aiohttp.ClientError, OSError, asyncio.TimeoutError)


def _describe(e: BaseException) -> str:
    if isinstance(e, ClientError):
        err = e.response.get("Error", {})
        return f"{err.get('Code', 'error')}: {err.get('Message', '')}".rstrip(": ")
    return f"{type(e).__name__}: {e}"


class S3Store(ArtifactStore, backend="s3"):
    """One aiobotocore client, opened by start() (or `async with`) and closed by close()."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        *,
        connect_timeout_s: float = 5.0,
        read_timeout_s: float = 30.0,
        max_attempts: int = 3,
    ) -> None:
        self.bucket = bucket
        self.prefix = validate_key(prefix.strip("/")) if prefix.strip("/") else ""
        self.endpoint_url = endpoint_url
        self.region = region
        self._config = AioConfig(
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            signature_version="s3v4",
            # Custom endpoints (MinIO, moto, an IP) rarely resolve <bucket>.<host>.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
        )
        self._stack: AsyncExitStack | None = None
        self._client: Any = None

    async def start(self) -> None:
        if self._client is not None:
            return
        stack = AsyncExitStack()
        try:
            self._client = await stack.enter_async_context(
                get_session().create_client(
                    "s3",
                    region_name=self.region,
                    endpoint_url=self.endpoint_url,
                    config=self._config,
                )
            )
        except _BACKEND_ERRORS as e:
            await stack.aclose()
            raise StoreError(f"S3 store: cannot create client: {_describe(e)}") from e
        self._stack = stack

    async def close(self) -> None:
        stack, self._stack, self._client = self._stack, None, None
        if stack is not None:
            await stack.aclose()

    def _object_key(self, key: str) -> str:
        validate_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _started(self) -> Any:
        if self._client is None:
            raise StoreError("S3 store is not started (call start() or use `async with`)")
        return self._client

    def _error(self, op: str, key: str, e: BaseException) -> StoreError:
        return StoreError(f"S3 {op} s3://{self.bucket}/{self._object_key(key)}: {_describe(e)}")

    async def put(
        self, key: str, data: bytes, content_type: str = "application/octet-stream"
    ) -> None:
        # A PUT becomes visible all at once or not at all, so no temp-then-rename dance.
        obj, client = self._object_key(key), self._started()
        try:
            await client.put_object(
                Bucket=self.bucket, Key=obj, Body=data, ContentType=content_type
            )
        except _BACKEND_ERRORS as e:
            raise self._error("put", key, e) from e

    async def get(self, key: str) -> bytes:
        obj, client = self._object_key(key), self._started()
        try:
            resp = await client.get_object(Bucket=self.bucket, Key=obj)
            async with resp["Body"] as body:
                data: bytes = await body.read()
            return data
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND_CODES:
                raise KeyNotFound(key) from None
            raise self._error("get", key, e) from e
        except _BACKEND_ERRORS as e:
            raise self._error("get", key, e) from e

    async def read_head(self, key: str, length: int) -> tuple[bytes, int]:
        obj, client = self._object_key(key), self._started()
        if length <= 0:
            return b"", await self._size(key)
        try:
            resp = await client.get_object(Bucket=self.bucket, Key=obj, Range=f"bytes=0-{length - 1}")
            async with resp["Body"] as body:
                data: bytes = await body.read()
            # "bytes 0-99/12345": the total after the slash; absent if the range was ignored
            content_range = resp.get("ContentRange") or ""
            total = int(content_range.rpartition("/")[2]) if "/" in content_range else len(data)
            return data[:length], total
        except ClientError as e:
            code = e.response.get("Error", {}).get("Code")
            if code in _NOT_FOUND_CODES:
                raise KeyNotFound(key) from None
            if code == "InvalidRange":  # an empty object has no byte 0
                return b"", 0
            raise self._error("get", key, e) from e
        except (*_BACKEND_ERRORS, ValueError) as e:
            raise self._error("get", key, e) from e

    async def _size(self, key: str) -> int:
        obj, client = self._object_key(key), self._started()
        try:
            head = await client.head_object(Bucket=self.bucket, Key=obj)
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND_CODES:
                raise KeyNotFound(key) from None
            raise self._error("head", key, e) from e
        except _BACKEND_ERRORS as e:
            raise self._error("head", key, e) from e
        return int(head["ContentLength"])

    async def exists(self, key: str) -> bool:
        obj, client = self._object_key(key), self._started()
        try:
            await client.head_object(Bucket=self.bucket, Key=obj)
            return True
        except ClientError as e:
            if e.response.get("Error", {}).get("Code") in _NOT_FOUND_CODES:
                return False
            raise self._error("head", key, e) from e
        except _BACKEND_ERRORS as e:
            raise self._error("head", key, e) from e

    async def delete(self, key: str) -> None:
        # DeleteObject on a missing key succeeds in S3: idempotent as the interface asks.
        obj, client = self._object_key(key), self._started()
        try:
            await client.delete_object(Bucket=self.bucket, Key=obj)
        except _BACKEND_ERRORS as e:
            raise self._error("delete", key, e) from e

    async def url(self, key: str, expires_s: int) -> str:
        obj, client = self._object_key(key), self._started()
        try:
            url: str = await client.generate_presigned_url(
                "get_object", Params={"Bucket": self.bucket, "Key": obj}, ExpiresIn=expires_s
            )
        except _BACKEND_ERRORS as e:
            raise self._error("presign", key, e) from e
        return url
