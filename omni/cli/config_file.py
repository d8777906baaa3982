"""`--config FILE`: a YAML mapping of flag names to values, as vLLM reads one.

    # omni-serve.yaml
    model: /srv/models/omni          # the positional model (or `model: [a=/dir/a, b=/dir/b]`)
    served-model-name: omni
    port: 8000
    enable-prefix-caching: true
    allowed-origins: ["https://ui.example.com"]

A key is a long flag without its dashes (`max_model_len` is read as `max-model-len`); `true`
turns a switch on, `false` turns it off (`--no-X` where the flag has one); a list repeats a
flag that may be given several times, fills one that takes several values, or, for a flag that
takes a JSON list, is passed as that list. The file sets defaults: a flag on the command line
wins over the file's value for it.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from omni.cli.flags import takes_json_list


class ConfigFileError(ValueError):
    pass


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigFileError(f"--config {path}: {exc.strerror or exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigFileError(f"--config {path}: not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict) or not all(isinstance(k, str) for k in data):
        raise ConfigFileError(f"--config {path}: must be a mapping of flag names to values")
    return data


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    """Each long flag's name (without dashes) -> its action."""
    found = {}
    for action in parser._actions:  # argparse has no public listing of its actions
        for option in action.option_strings:
            if option.startswith("--"):
                found[option[2:]] = action
    return found


def config_tokens(data: dict[str, Any], parser: argparse.ArgumentParser, path: Path) -> list[str]:
    """The file's settings as command-line tokens, checked against the parser's flags."""
    actions = _actions(parser)
    tokens: list[str] = []
    for raw_key, value in data.items():
        key = raw_key.strip().lstrip("-").replace("_", "-")
        if key == "config":
            raise ConfigFileError(f"--config {path}: a config file cannot name another (key {raw_key!r})")
        action = actions.get(key)
        if action is None:
            raise ConfigFileError(f"--config {path}: unknown setting {raw_key!r} (no flag --{key})")
        tokens += _tokens_of(key, action, value, path)
    return tokens


def _tokens_of(key: str, action: argparse.Action, value: Any, path: Path) -> list[str]:
    flag = f"--{key}"
    takes_value = action.nargs != 0
    if isinstance(value, bool) and not takes_value:
        if value:
            return [flag]
        if isinstance(action, argparse.BooleanOptionalAction):
            return [f"--no-{key}"]
        return []  # a plain switch left off
    if not takes_value:
        raise ConfigFileError(f"--config {path}: {key} is a switch: give it true or false, not {value!r}")
    if isinstance(value, dict):
        raise ConfigFileError(f"--config {path}: {key} takes a value or a list, not a mapping")
    if isinstance(value, list):
        if takes_json_list(action):
            return [flag, orjson.dumps(value).decode()]
        items = [_scalar(key, v, path) for v in value]
        if isinstance(action, argparse._AppendAction):
            return [t for item in items for t in (flag, item)]
        if action.nargs in ("+", "*") or isinstance(action.nargs, int):
            return [flag, *items]
        raise ConfigFileError(f"--config {path}: {key} takes one value, not a list")
    return [flag, _scalar(key, value, path)]


def _scalar(key: str, value: Any, path: Path) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise ConfigFileError(f"--config {path}: {key}: {value!r} is not a value a flag takes")


def apply_config_file(parser: argparse.ArgumentParser, path: Path, argv: Sequence[str]) -> None:
    """Make the file's settings the parser's defaults, so the command line's flags win.

    The file's tokens are parsed on their own first (types, choices and unknown keys are
    checked there, with the file named in the error), then each setting the file changed
    becomes that flag's default. A list-valued flag (--model) from the command line replaces
    the file's list instead of adding to it."""
    tokens = config_tokens(read_config_file(path), parser, path)
    try:
        from_file, extra = parser.parse_known_args(tokens)
    except SystemExit:
        raise ConfigFileError(f"--config {path}: a value above was refused") from None
    if extra:
        raise ConfigFileError(f"--config {path}: could not read {' '.join(extra)}")
    fresh = parser.parse_known_args([])[0]
    flags_on_line = {token.split("=", 1)[0] for token in argv if token.startswith("--")}
    given_on_line = {a.dest for a in parser._actions for o in a.option_strings if o in flags_on_line}
    defaults = {}
    for dest, value in vars(from_file).items():
        if value != getattr(fresh, dest) and dest not in given_on_line:
            defaults[dest] = value
    # Which settings came from the file: a positional model on the line replaces the file's.
    parser.set_defaults(**defaults, from_config_file=frozenset(defaults))
