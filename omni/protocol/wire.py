"""The wire format of every message between the server and its workers: msgpack arrays.

A message is a slots dataclass registered under a unique integer tag. On the wire it is the
array [tag, field0, field1, ...] in declaration order; a field holding a registered message
(or a list of them, or None) is encoded the same way, so decoding is a table lookup by tag
and never evaluates names. Which fields nest which types is read once from the type hints,
not kept in a second table. No pickle anywhere.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

import msgpack

T = TypeVar("T")

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


def _to_wire(value: Any) -> Any:
    cls = type(value)
    tag = _TAG_OF.get(cls)
    if tag is not None:
        return [tag, *(_to_wire(getattr(value, name)) for name, _, _ in _layout(cls))]
    if cls is list or cls is tuple:
        return [_to_wire(v) for v in value]
    return value


def encode(message: Any) -> bytes:
    if type(message) not in _TAG_OF:
        raise TypeError(f"{type(message).__name__} is not a registered message")
    return msgpack.packb(_to_wire(message), use_bin_type=True)


def decode(data: bytes) -> Any:
    items = msgpack.unpackb(data, raw=False, strict_map_key=True)
    if not isinstance(items, list) or not items or items[0] not in _BY_TAG:
        raise ValueError("not an omni-serve message")
    return _decode_as(_BY_TAG[items[0]], items[1:])


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
