"""The wire format of every message between the server and its workers: msgpack arrays.

A message is a slots dataclass registered under a unique integer tag. On the wire it is the
array [tag, field0, field1, ...] in declaration order; a field holding a registered message
(or a list of them, or None) is encoded the same way, so decoding is a table lookup by tag
and never evaluates names. Which fields nest which types is read once from the type hints,
not kept in a second table. No pickle anywhere.

A frame's payload is that array alone, or, when the message holds bytes of BLOB_MIN_BYTES or
more (a media item, an encoded image), an envelope that carries them out of band, so that
the sender never copies them into the msgpack buffer (30 MB of image bytes copied on the
server's event loop is a 30 ms stall):

    0xc1 | head length (u64) | head | blob 0 | blob 1 | ...

where the head is the array with each large bytes value replaced by a reference,
ExtType(BLOB_EXT, index (u32) | length (u64)). 0xc1 is the one byte msgpack never writes, so
no plain payload starts with it. Blobs lie back to back in the order their references appear
in the head (index 0, 1, ...): their offsets are the running sum of the lengths.
"""

from __future__ import annotations

import dataclasses
import struct
import types
import typing
from collections.abc import Callable
from typing import Any, TypeVar

import msgpack

T = TypeVar("T")

# A piece of a frame's payload: what a socket takes as is.
Piece = bytes | bytearray | memoryview

BLOB_MIN_BYTES = 1 << 20  # a bytes value this long travels out of band
BLOB_EXT = 1  # the ExtType code of a blob reference
_ENVELOPE_MARK = 0xC1
_ENVELOPE = struct.Struct("!BQ")  # the mark, the head's length
_BLOB_REF = struct.Struct("!IQ")  # the blob's index, its length

_BY_TAG: dict[int, type] = {}
_TAG_OF: dict[type, int] = {}


def register(cls: type[T], tag: int | None = None) -> type[T]:
    """Make a dataclass a message: under its TAG class variable, or the tag given (for a
    dataclass owned by another shared layer, e.g. MediaLimits). Tags never repeat."""
    tag = getattr(cls, "TAG") if tag is None else tag
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls.__name__} is not a dataclass")
    owner = _BY_TAG.get(tag)
    if owner is not None and owner is not cls:
        raise ValueError(f"tag {tag} is taken by {owner.__name__}")
    _BY_TAG[tag] = cls
    _TAG_OF[cls] = tag
    return cls


def message(cls: type[T]) -> type[T]:
    """Class decorator: register a dataclass with a TAG class variable."""
    return register(cls)


def message_types() -> dict[int, type]:
    return dict(_BY_TAG)


# (field name, nested message type or None, whether the field is a list of them)
_Layout = tuple[tuple[str, type | None, bool], ...]


_LAYOUTS: dict[type, _Layout] = {}


def _layout(cls: type) -> _Layout:
    layout = _LAYOUTS.get(cls)
    if layout is None:  # on first use: every type a hint names is defined by then
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        layout = _LAYOUTS[cls] = tuple((f.name, *_nested(hints[f.name])) for f in fields)
    return layout


def _nested(hint: Any) -> tuple[type | None, bool]:
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
        inner = [a for a in args if a is not type(None)]
        return _nested(inner[0]) if len(inner) == 1 else (None, False)
    if typing.get_origin(hint) is list and args and args[0] in _TAG_OF:
        return args[0], True
    if hint in _TAG_OF:
        return hint, False
    return None, False


def _to_wire(value: Any, blobs: list[Piece]) -> Any:
    cls = type(value)
    tag = _TAG_OF.get(cls)
    if tag is not None:
        return [tag, *(_to_wire(getattr(value, name), blobs) for name, _, _ in _layout(cls))]
    if cls is list or cls is tuple:
        return [_to_wire(v, blobs) for v in value]
    if cls is bytes or cls is bytearray or cls is memoryview:
        return _lift(value, blobs)
    return value


def _lift(value: Piece, blobs: list[Piece]) -> Any:
    """A large value's reference, the value itself appended to blobs; a small one as it is."""
    blob = value
    if isinstance(value, memoryview) and (value.ndim != 1 or value.itemsize != 1):
        if not value.c_contiguous:
            return value  # in band, where msgpack refuses it as before
        blob = value.cast("B")  # a view of the same memory whose len() counts bytes
    if len(blob) < BLOB_MIN_BYTES:
        return value
    blobs.append(blob)
    return msgpack.ExtType(BLOB_EXT, _BLOB_REF.pack(len(blobs) - 1, len(blob)))


def encode_frame(message: Any) -> list[Piece]:
    """A frame's payload in pieces, to send one after another: the plain msgpack array alone,
    or the envelope header, the head, then each large bytes value of the message itself (the
    same object, not a copy)."""
    if type(message) not in _TAG_OF:
        raise TypeError(f"{type(message).__name__} is not a registered message")
    blobs: list[Piece] = []
    head = msgpack.packb(_to_wire(message, blobs), use_bin_type=True)
    if not blobs:
        return [head]
    return [_ENVELOPE.pack(_ENVELOPE_MARK, len(head)), head, *blobs]


def frame_size(pieces: list[Piece]) -> int:
    return sum(len(piece) for piece in pieces)  # a blob view counts bytes (see _lift)


def encode(message: Any) -> bytes:
    """The payload in one buffer: a copy of every blob, for a caller that needs one."""
    return b"".join(encode_frame(message))  # one bytes piece: join hands it back, no copy


def decode(data: Piece) -> Any:
    """The message of a payload, plain or enveloped; each blob comes back as bytes."""
    with memoryview(data) as view:
        if not view or view[0] != _ENVELOPE_MARK:
            items = _unpack(view, _no_blobs)
        else:
            if len(view) < _ENVELOPE.size:
                raise ValueError("truncated frame envelope")
            _, head_size = _ENVELOPE.unpack_from(view)
            head_end = _ENVELOPE.size + head_size
            if head_end > len(view):
                raise ValueError(f"frame envelope: a head of {head_size} bytes in {len(view)}")
            blobs = _Blobs(view, head_end)
            with view[_ENVELOPE.size : head_end] as head:
                items = _unpack(head, blobs.take)
            if blobs.offset != len(view):
                raise ValueError(f"frame envelope: {len(view) - blobs.offset} bytes no reference covers")
    if not isinstance(items, list) or not items or items[0] not in _BY_TAG:
        raise ValueError("not an omni-serve message")
    return _decode_as(_BY_TAG[items[0]], items[1:])


def _unpack(data: memoryview, ext_hook: Callable[[int, bytes], bytes]) -> Any:
    return msgpack.unpackb(data, raw=False, strict_map_key=True, ext_hook=ext_hook)


def _no_blobs(code: int, data: bytes) -> bytes:
    raise ValueError(f"msgpack extension type {code} in a frame without an envelope")


class _Blobs:
    """An envelope's blobs, from `offset` on, handed out as bytes in the order the unpacker
    meets their references."""

    def __init__(self, view: memoryview, offset: int) -> None:
        self.view = view
        self.offset = offset
        self.count = 0

    def take(self, code: int, data: bytes) -> bytes:
        if code != BLOB_EXT:
            raise ValueError(f"unknown msgpack extension type {code}")
        if len(data) != _BLOB_REF.size:
            raise ValueError(f"a blob reference of {len(data)} bytes")
        index, size = _BLOB_REF.unpack(data)
        end = self.offset + size
        if index != self.count or end > len(self.view):
            raise ValueError(f"blob reference {index} ({size} bytes) out of range")
        blob = bytes(self.view[self.offset : end])
        self.offset, self.count = end, self.count + 1
        return blob


def _decode_as(cls: type, items: list[Any]) -> Any:
    layout = _layout(cls)
    if len(items) != len(layout):
        raise ValueError(f"{cls.__name__}: expected {len(layout)} fields, got {len(items)}")
    values = {}
    for (name, sub, is_list), item in zip(layout, items):
        if sub is None or item is None:
            values[name] = item
        elif is_list:
            if not isinstance(item, list):
                raise ValueError(f"{cls.__name__}.{name}: expected a list of {sub.__name__}")
            values[name] = [_decode_as(sub, _check_tag(sub, x)) for x in item]
        else:
            values[name] = _decode_as(sub, _check_tag(sub, item))
    return cls(**values)


def _check_tag(cls: type, item: Any) -> list[Any]:
    if not isinstance(item, list) or not item or item[0] != _TAG_OF[cls]:
        raise ValueError(f"expected a {cls.__name__} message")
    return item[1:]
