"""Large bytes travel out of band: the frame's pieces hold them as they are, the payload
decodes to what the plain form decodes to, and a broken envelope is refused."""

from __future__ import annotations

import array
import struct

import msgpack
import pytest

from omni.shared import protocol
from omni.shared.protocol import wire
from tests.omni.shared.protocol.test_messages import EXAMPLES

MIB = wire.BLOB_MIN_BYTES


def item(item_id: int, data: bytes | bytearray) -> protocol.EncodeItem:
    # a bytes field may hold a bytearray: the encoder takes any buffer and decodes it as bytes
    return protocol.EncodeItem(item_id, "vision_encoder", "image", f"enc/v/r/{item_id}", data, None, "image")  # type: ignore[arg-type]


BIG = b"\x89PNG" + bytes(range(256)) * (MIB // 256)  # just over the threshold
OTHER = bytearray(b"\xff\xd8") * MIB  # 2 MiB
BATCH = protocol.EncodeBatch(9, [item(0, BIG), item(1, b"small"), item(2, OTHER)])


def plain(message: object, monkeypatch: pytest.MonkeyPatch) -> bytes:
    """The payload as it was before blobs: every value in the msgpack array."""
    with monkeypatch.context() as m:
        m.setattr(wire, "BLOB_MIN_BYTES", 1 << 62)
        return protocol.encode(message)


@pytest.mark.parametrize("cls", sorted(EXAMPLES, key=lambda c: c.__name__), ids=lambda c: c.__name__)
def test_a_message_without_large_bytes_is_one_plain_piece(cls: type) -> None:
    pieces = protocol.encode_frame(EXAMPLES[cls])
    assert len(pieces) == 1 and pieces[0][0] != 0xC1
    assert pieces[0] == protocol.encode(EXAMPLES[cls])


def test_the_plain_payload_is_the_msgpack_array_byte_for_byte() -> None:
    under = b"\x01" * (MIB - 1)
    message = item(4, under)
    expected = msgpack.packb(
        [protocol.EncodeItem.TAG, 4, "vision_encoder", "image", "enc/v/r/4", under, None, "image"], use_bin_type=True
    )
    assert protocol.encode_frame(message) == [expected]
    assert protocol.encode(message) == expected


def test_large_bytes_are_pieces_of_their_own_not_copies() -> None:
    envelope, head, *blobs = protocol.encode_frame(BATCH)
    assert blobs[0] is BIG and blobs[1] is OTHER  # in the order the head references them
    assert len(blobs) == 2
    assert envelope == struct.pack("!BQ", 0xC1, len(head))
    assert len(head) < 200  # the blobs are not in it
    references = [x for x in _head_values(head) if isinstance(x, msgpack.ExtType)]
    assert references == [
        msgpack.ExtType(wire.BLOB_EXT, struct.pack("!IQ", 0, len(BIG))),
        msgpack.ExtType(wire.BLOB_EXT, struct.pack("!IQ", 1, len(OTHER))),
    ]
    assert protocol.frame_size([envelope, head, *blobs]) == 9 + len(head) + len(BIG) + len(OTHER)


def _head_values(head: bytes | bytearray | memoryview) -> list[object]:
    batch = msgpack.unpackb(head, raw=False)
    return [field for encoded_item in batch[2] for field in encoded_item]


@pytest.mark.parametrize("form", [bytes, bytearray, memoryview])
def test_an_enveloped_payload_decodes_as_the_plain_one(form: type, monkeypatch: pytest.MonkeyPatch) -> None:
    payload = protocol.encode(BATCH)
    assert payload[0] == 0xC1
    decoded = protocol.decode(form(payload))
    assert decoded == protocol.decode(plain(BATCH, monkeypatch)) == BATCH
    assert [type(x.data) for x in decoded.items] == [bytes, bytes, bytes]  # bytearray in, bytes out, as before


def test_a_memoryview_goes_as_a_byte_view_of_the_same_memory() -> None:
    samples = array.array("f", [0.5]) * (MIB // 4)
    chunk = protocol.AudioChunk(1, [3], speaker_embedding=memoryview(samples))  # type: ignore[arg-type]
    *_, blob = protocol.encode_frame(chunk)
    assert isinstance(blob, memoryview) and blob.obj is samples and len(blob) == MIB
    assert protocol.decode(protocol.encode(chunk)).speaker_embedding == samples.tobytes()


def test_an_optional_large_field_and_a_small_one_beside_it() -> None:
    chunk = protocol.AudioChunk(1, [3, 4], speaker_embedding=BIG, first=True)
    assert protocol.decode(protocol.encode(chunk)) == chunk
    empty = protocol.AudioChunk(1, [3, 4])
    assert protocol.encode_frame(empty) == [protocol.encode(empty)]


def envelope(head: list[object], blobs: bytes) -> bytes:
    packed = msgpack.packb(head, use_bin_type=True)
    return struct.pack("!BQ", 0xC1, len(packed)) + packed + blobs


def ref(index: int, size: int, code: int = wire.BLOB_EXT) -> msgpack.ExtType:
    return msgpack.ExtType(code, struct.pack("!IQ", index, size))


def fields(data: object) -> list[object]:
    return [protocol.EncodeItem.TAG, 4, "vision_encoder", "image", "k", data, None, "image"]


def test_a_hand_built_envelope_decodes() -> None:
    decoded = protocol.decode(envelope(fields(ref(0, 3)), b"abc"))
    assert decoded == protocol.EncodeItem(4, "vision_encoder", "image", "k", b"abc", None, "image")


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        (b"\xc1", "truncated frame envelope"),
        (b"\xc1\x00\x00\x00", "truncated frame envelope"),
        (struct.pack("!BQ", 0xC1, 50) + b"\x90", "a head of 50 bytes in 10"),
        (struct.pack("!BQ", 0xC1, 0), "incomplete input"),
        (envelope(fields(ref(0, 4)), b"abc"), "blob reference 0 \\(4 bytes\\) out of range"),
        (envelope(fields(ref(1, 3)), b"abc"), "blob reference 1 \\(3 bytes\\) out of range"),
        (envelope([protocol.EncodeBatch.TAG, 1, [fields(ref(0, 1)), fields(ref(0, 1))]], b"ab"), "reference 0"),
        (envelope(fields(ref(0, 3)), b"abcd"), "1 bytes no reference covers"),
        (envelope(fields(b"abc"), b"abc"), "3 bytes no reference covers"),
        (envelope(fields(ref(0, 3, code=5)), b"abc"), "unknown msgpack extension type 5"),
        (envelope(fields(msgpack.ExtType(wire.BLOB_EXT, b"\x00")), b"abc"), "a blob reference of 1 bytes"),
        (msgpack.packb(fields(ref(0, 0)), use_bin_type=True), "extension type 1 in a frame without an envelope"),
        (envelope([999, ref(0, 1)], b"a"), "not an omni-serve message"),
    ],
)
def test_a_malformed_envelope_is_refused(payload: bytes, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        protocol.decode(payload)
