"""The command line, built from the config dataclasses' declarations (omni/shared/settings.py).

Each section is a dataclass and becomes one argument group; each field declared with
`setting` becomes one flag (its vLLM aliases beside it), typed from its annotation unless it
names a reader below. `read_section` turns the parsed namespace back into the dataclass.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import types
import typing
from pathlib import Path
from typing import Any

import orjson

from omni.shared.settings import flag_settings

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-z]*)\s*$", re.IGNORECASE)
_FACTORS = {
    **{u: 1 for u in ("", "b")},
    **{p + s: 1000**i for i, p in enumerate("kmgt", 1) for s in ("", "b")},
    **{p + s: 1024**i for i, p in enumerate("kmgt", 1) for s in ("i", "ib")},
}


# The readers keep their names: argparse names the reader in "invalid _positive_int value".
def parse_size(text: str) -> int:
    """'4GiB' -> 4 * 2**30, '500MB' -> 500 * 10**6, '1024' -> 1024."""
    match = _SIZE.match(text)
    unit = (match.group(2) or "").lower() if match else ""
    if not match or unit not in _FACTORS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 4GiB, 512MB)")
    return int(float(match.group(1)) * _FACTORS[unit])


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0.0:
        raise argparse.ArgumentTypeError(f"must be positive, got {text}")
    return value


def _fraction(text: str) -> float:
    value = float(text)
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _string_list(text: str) -> list[str]:
    """A JSON list, as vLLM takes its CORS flags ('["https://a.example"]'), or a comma list."""
    text = text.strip()
    if text.startswith("["):
        try:
            value = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise argparse.ArgumentTypeError(f"not a JSON list: {exc}") from None
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise argparse.ArgumentTypeError("must be a JSON list of strings")
        return value
    return [v.strip() for v in text.split(",") if v.strip()]


def _devices(text: str) -> tuple[str, ...]:
    return tuple(d.strip() for d in text.split(",") if d.strip())


_READERS = {"size": parse_size, "positive_int": _positive_int, "positive_float": _positive_float,
            "fraction": _fraction, "string_list": _string_list, "devices": _devices}  # fmt: skip


def takes_json_list(action: argparse.Action) -> bool:
    """A flag whose value is itself a JSON list (vLLM's CORS flags): a config file's list goes in as JSON."""
    return action.type is _string_list


def dest(field: dataclasses.Field[Any]) -> str:
    """The namespace attribute of a field's flag: its first flag's name (unique across sections)."""
    spec = flag_settings(field)
    assert spec is not None
    if spec["positional"]:
        return field.name
    return (spec["flag"] or "--" + field.name.replace("_", "-")).lstrip("-").replace("-", "_")


def add_section(parser: argparse.ArgumentParser, title: str, cls: type) -> None:
    """One argument group of cls's declared fields, mutually exclusive ones grouped together."""
    group = parser.add_argument_group(title)
    exclusive: dict[str, Any] = {}
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        spec = flag_settings(field)
        if spec is None:
            continue
        target: Any = group
        if spec["exclusive"] or spec["off_flag"]:
            key = spec["exclusive"] or field.name
            if key not in exclusive:
                exclusive[key] = group.add_mutually_exclusive_group()
            target = exclusive[key]
        default = field.default_factory() if field.default is dataclasses.MISSING else field.default  # type: ignore[misc,operator]
        if spec["unset"] is not dataclasses.MISSING:
            default = spec["unset"]
        if spec["env"] is not None:
            default = os.environ.get(spec["env"], default)
        kwargs: dict[str, Any] = {"default": default, "help": spec["help"]}
        kind = _base_type(hints[field.name])
        if spec["type"] is not None:
            kwargs["type"] = _READERS[spec["type"]]
        elif kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction if field.default is True else "store_true"
        elif kind in (int, float, Path):
            kwargs["type"] = kind
        for key in ("choices", "metavar", "nargs", "action"):
            if spec[key] is not None:
                kwargs[key] = list(spec[key]) if key == "choices" else spec[key]
        if spec["positional"]:
            target.add_argument(field.name, **kwargs)
            continue
        names = [spec["flag"] or "--" + field.name.replace("_", "-"), *spec["vllm_alias"]]
        target.add_argument(*names, dest=dest(field), **kwargs)
        if spec["off_flag"]:
            flag, help_text = spec["off_flag"]
            target.add_argument(flag, dest=dest(field), action="store_false", default=default, help=help_text)


def _base_type(hint: Any) -> Any:
    """int for `int | None`; the origin (tuple) of a generic."""
    if isinstance(hint, types.UnionType):
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    return typing.get_origin(hint) or hint


def read_section(cls: type, args: argparse.Namespace) -> Any:
    """cls from the parsed flags. A field whose flag was left at its `unset` marker takes the
    field's default: the CLI derives that value itself (omni/cli/options.py)."""
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        spec = flag_settings(field)
        if spec is None:
            continue
        value = getattr(args, dest(field))
        if spec["unset"] is not dataclasses.MISSING and value == spec["unset"]:
            continue
        values[field.name] = tuple(value) if isinstance(value, list) else value
    return cls(**values)
