"""Media embeddings key the prefix cache by content, not by their placeholder tokens."""

from __future__ import annotations

from scheduler.block_manager import BlockManager
from scheduler.prefix_hash import block_hashes, media_extra_keys
from scheduler.request import MediaSpan, Request, RequestId, SamplingParams
from tests.scheduler.test_block_manager import admit

PAD = 999
# positions 0-7 text, 8-19 an image's 12 embedding rows (placeholder ids), 20-24 text
TOKENS = [1, 2, 3, 4, 5, 6, 7, 8, *[PAD] * 12, 9, 10, 11, 12, 13]


def request(request_id: str, image_hash: str) -> Request:
    return Request(
        RequestId(request_id),
        list(TOKENS),
        SamplingParams(max_tokens=4),
        media=(MediaSpan(offset=8, num_rows=12, key=image_hash),),
    )


def test_extra_keys_name_the_item_and_the_row_each_block_starts_at() -> None:
    span = MediaSpan(offset=6, num_rows=5, key="h")
    assert media_extra_keys([span], 0, 4) == ()
    assert media_extra_keys([span], 4, 8) == (("h", -2),)  # the item begins 2 tokens in
    assert media_extra_keys([span], 8, 12) == (("h", 2),)  # from its third row on
    assert media_extra_keys([span], 12, 16) == ()


def test_same_placeholders_different_images_share_only_the_text_before() -> None:
    bm = BlockManager(num_blocks=32, block_size=4)
    admit(bm, request("a", "image-1"))
    other = request("b", "image-2")
    blocks, cached = bm.get_computed_blocks(other)
    assert cached == 8  # blocks 0-1 (positions 0-7); block 2 holds image rows
    assert blocks == bm.block_ids(RequestId("a"))[:2]
    same = request("c", "image-1")
    blocks, cached = bm.get_computed_blocks(same)
    assert cached == 24  # every full block, capped so one token is left to compute
    assert blocks == bm.block_ids(RequestId("a"))[:6]


def test_placement_hashes_agree_with_the_block_manager() -> None:
    bm = BlockManager(num_blocks=32, block_size=4)
    admit(bm, request("a", "image-1"))
    span = (MediaSpan(8, 12, "image-1"),)
    assert bm.num_cached_leading_blocks(block_hashes(TOKENS, 4, media=span)) == 6
    other = (MediaSpan(8, 12, "image-2"),)
    assert bm.num_cached_leading_blocks(block_hashes(TOKENS, 4, media=other)) == 2
    assert bm.num_cached_prefix_blocks(TOKENS, span) == 6
    assert bm.num_cached_prefix_blocks(TOKENS) == 2  # no media given: placeholders only
