import pytest

from scheduler.prefix_hash import DIGEST_SIZE, block_hashes, hash_block, salt_root


def test_hash_is_deterministic_and_16_bytes():
    h = hash_block(None, [1, 2, 3, 4])
    assert h == hash_block(None, (1, 2, 3, 4))
    assert isinstance(h, bytes) and len(h) == DIGEST_SIZE == 16


def test_hash_depends_on_tokens_parent_and_order():
    root = hash_block(None, [1, 2])
    assert hash_block(None, [2, 1]) != root
    assert hash_block(None, [1, 2, 3]) != root
    # The same tokens under different parents are different blocks.
    assert hash_block(root, [3, 4]) != hash_block(None, [3, 4])
    assert hash_block(root, [3, 4]) != hash_block(hash_block(None, [9, 9]), [3, 4])


def test_extra_keys_change_the_hash():
    plain = hash_block(None, [7, 7, 7, 7])
    image_a = hash_block(None, [7, 7, 7, 7], (("sha-a", 0),))
    image_b = hash_block(None, [7, 7, 7, 7], (("sha-b", 0),))
    image_a_later = hash_block(None, [7, 7, 7, 7], (("sha-a", 4),))
    assert len({plain, image_a, image_b, image_a_later}) == 4
    assert image_a == hash_block(None, [7, 7, 7, 7], (("sha-a", 0),))
    # Type and nesting are part of the encoding.
    assert hash_block(None, [1], ("ab",)) != hash_block(None, [1], (b"ab",))
    assert hash_block(None, [1], ("ab",)) != hash_block(None, [1], ("a", "b"))
    assert hash_block(None, [1], (1,)) != hash_block(None, [1], ("1",))


def test_unhashable_extra_key_is_rejected():
    with pytest.raises(TypeError):
        hash_block(None, [1], (1.5,))


def test_block_hashes_chain_full_blocks_only():
    tokens = [1, 2, 3, 4, 5, 6, 7]
    hashes = block_hashes(tokens, 3)
    first = hash_block(None, [1, 2, 3])
    assert hashes == [first, hash_block(first, [4, 5, 6])]
    assert block_hashes(tokens[:2], 3) == []
    assert block_hashes([4, 5, 6], 3, parent=first) == [hashes[1]]
    # A change in block 0 changes every later hash.
    other = block_hashes([9, 2, 3, 4, 5, 6], 3)
    assert other[0] != hashes[0] and other[1] != hashes[1]


def test_a_salt_roots_its_own_chain():
    tokens = list(range(8))
    plain = block_hashes(tokens, 4)
    assert salt_root(None) is None
    assert block_hashes(tokens, 4, salt_root(None)) == plain  # no salt: the chain as it was
    a, b = block_hashes(tokens, 4, salt_root("a")), block_hashes(tokens, 4, salt_root("b"))
    assert a == block_hashes(tokens, 4, salt_root("a"))
    assert not {*a} & {*plain} and not {*a} & {*b}  # no block shared across salts
