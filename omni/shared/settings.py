"""Settings declared once, on the dataclass field that holds them.

A field made with `setting` carries what the command line needs: its help, its flag (default
`--` and the field's name with dashes), vLLM's name for it, and how its text is read.
omni/cli/flags.py builds the parser, and reads `--config` files, from these declarations alone.

A field made with `json_key` names its key in a checkpoint's config.json (default: the field's
name) and how a raw value becomes the field's; `read_json_config` reads such a dataclass, and
`to_json_config` writes it back. Model code in gpu_workers shares them, so this module imports
only the standard library.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")

# How a flag's text is read, by name (omni/cli/flags.py holds the readers): "size" (4GiB),
# "positive_int", "positive_float", "fraction" (0, 1], "string_list" (a JSON list or a comma
# list), "devices" (a comma list). A field without one is read by its annotation's type.
FLAG_TYPES = frozenset({"size", "positive_int", "positive_float", "fraction", "string_list", "devices"})


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str | None = None,
    flag: str | None = None,
    vllm_alias: str | tuple[str, ...] = (),
    type: str | None = None,
    choices: tuple[Any, ...] | None = None,
    metavar: str | None = None,
    nargs: str | None = None,
    action: str | None = None,
    env: str | None = None,
    exclusive: str | None = None,
    off_flag: tuple[str, str] | None = None,
    unset: Any = dataclasses.MISSING,
    positional: bool = False,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A field with a flag.

    env: the flag's default is this environment variable when it is set.
    exclusive: flags of one name are mutually exclusive.
    off_flag: (flag, help) of a second switch that turns this boolean off.
    unset: the flag's default when the field's value is derived from other settings after
    parsing (None, or "auto"): the CLI resolves it, and the field's own default is what a
    config built in code gets."""
    assert type is None or type in FLAG_TYPES, type
    metadata = {
        "help": help,
        "flag": flag,
        "vllm_alias": (vllm_alias,) if isinstance(vllm_alias, str) else vllm_alias,
        "type": type,
        "choices": choices,
        "metavar": metavar,
        "nargs": nargs,
        "action": action,
        "env": env,
        "exclusive": exclusive,
        "off_flag": off_flag,
        "unset": unset,
        "positional": positional,
    }
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata={"setting": metadata})
    return dataclasses.field(default=default, metadata={"setting": metadata})


def flag_settings(field: dataclasses.Field[Any]) -> dict[str, Any] | None:
    """A field's flag declaration; None for a field the command line does not set."""
    return field.metadata.get("setting")


def json_key(
    default: Any = dataclasses.MISSING,
    *,
    key: str | None = None,
    read: Callable[[str, Any], Any] | None = None,
    write: Callable[[Any], Any] | None = None,
    default_factory: Callable[[], Any] | Any = dataclasses.MISSING,
) -> Any:
    """A field read from config.json: `key` (default: the field's name), `read(key, raw)`
    turning the raw value into the field's (and refusing what it cannot), `write` the reverse."""
    metadata = {"json": {"key": key, "read": read, "write": write}}
    if default_factory is not dataclasses.MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def _json_settings(field: dataclasses.Field[Any]) -> dict[str, Any]:
    return field.metadata.get("json") or {"key": None, "read": None, "write": None}


def read_json_config(
    cls: type[T], raw: Mapping[str, Any], *, what: str, ignore: frozenset[str] = frozenset(), strict: bool = True
) -> T:
    """cls from a config.json mapping: each field from its key, a key left out taking the field's
    default; a field without a default is read from None then, so that its reader refuses it by
    name. strict: a key that is no field's (and not in `ignore`) is refused, so that a misspelt
    one is not silently dropped."""
    if not isinstance(raw, Mapping):
        raise ValueError(f"{what} must be a dict, got {type(raw).__name__}")  # noqa: TRY004
    values: dict[str, Any] = {}
    known = set(ignore)
    for field in dataclasses.fields(cls):  # type: ignore[arg-type]
        spec = _json_settings(field)
        key = spec["key"] or field.name
        known.add(key)
        required = field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        if key not in raw and not required:
            continue
        if key not in raw and spec["read"] is None:
            raise ValueError(f"{what}: {key} is required")
        value = raw.get(key)
        values[field.name] = value if spec["read"] is None else spec["read"](key, value)
    unknown = sorted(set(raw) - known)
    if strict and unknown:
        raise ValueError(f"{what}: unknown keys {unknown}")
    return cls(**values)


def to_json_config(config: Any, **extra: Any) -> dict[str, Any]:
    """The config.json mapping read_json_config reads back into `config` (extra keys first)."""
    out = dict(extra)
    for field in dataclasses.fields(config):
        spec = _json_settings(field)
        value = getattr(config, field.name)
        out[spec["key"] or field.name] = _plain(value) if spec["write"] is None else spec["write"](value)
    return out


def _plain(value: Any) -> Any:
    """Tuples as lists, all the way down (JSON has no tuples)."""
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value
