"""Chained hashes of full KV blocks, the keys of the prefix cache.

A block's hash covers its parent's hash, its token ids and its extra keys, so equal hashes
mean equal prefixes: blocks [0, i] of two requests hold the same KV. The first block's parent
is the request's salt root (salt_root: None without a cache_salt), so requests with different
salts never share a block, as vLLM's cache_salt keeps tenants apart. Extra keys carry
whatever besides token ids decides the KV, e.g. (key, offset) of each image or
audio embedding overlapping the block: two different images behind the same placeholder
tokens must never share a cache entry.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Sequence
from typing import NewType

from scheduler.request import MediaSpan

BlockHash = NewType("BlockHash", bytes)

DIGEST_SIZE = 16


def hash_block(
    parent: BlockHash | None, token_ids: Sequence[int], extra_keys: tuple[object, ...] = ()
) -> BlockHash:
    h = hashlib.blake2b(digest_size=DIGEST_SIZE)
    h.update(_encode(parent))
    h.update(struct.pack(f"<I{len(token_ids)}q", len(token_ids), *token_ids))
    h.update(_encode(extra_keys))
    return BlockHash(h.digest())


def salt_root(cache_salt: str | None) -> BlockHash | None:
    """The parent of a salted request's first block; None (the unsalted chain) without a salt."""
    if cache_salt is None:
        return None
    h = hashlib.blake2b(b"cache_salt\0", digest_size=DIGEST_SIZE)
    h.update(cache_salt.encode())
    return BlockHash(h.digest())


def media_extra_keys(media: Sequence[MediaSpan], start: int, end: int) -> tuple[object, ...]:
    """Extra keys of the block holding positions [start, end): (key, start - offset)
    for each media span overlapping it. The second item says which of the item's embedding
    rows the block starts at (negative when the item starts inside the block):

        positions   start ........ end
        span            offset ..................... offset + num_rows
        key         (hash, start - offset) = (hash, -2) when the item begins 2 tokens in
    """
    return tuple(
        (span.key, start - span.offset)
        for span in media
        if span.offset < end and span.end > start
    )


def block_hashes(
    token_ids: Sequence[int],
    block_size: int,
    parent: BlockHash | None = None,
    media: Sequence[MediaSpan] = (),
) -> list[BlockHash]:
    """Hashes of the full blocks of token_ids; a trailing partial block gets none."""
    hashes: list[BlockHash] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        end = start + block_size
        parent = hash_block(parent, token_ids[start:end], media_extra_keys(media, start, end))
        hashes.append(parent)
    return hashes


def _encode(value: object) -> bytes:
    # Type tag + length prefix on every item, so no two different keys share an encoding
    # (("ab",), ("a", "b") and (b"ab",) all differ). bool before int: bool is an int.
    if value is None:
        return b"N"
    if isinstance(value, bool):
        return b"T" if value else b"F"
    if isinstance(value, int):
        return _tagged(b"i", str(value).encode())
    if isinstance(value, str):
        return _tagged(b"s", value.encode())
    if isinstance(value, bytes):
        return _tagged(b"b", value)
    if isinstance(value, tuple | list):
        return _tagged(b"t", b"".join(_encode(v) for v in value))
    raise TypeError(f"cannot hash an extra key of type {type(value).__name__}")


def _tagged(tag: bytes, payload: bytes) -> bytes:
    return tag + struct.pack("<Q", len(payload)) + payload
