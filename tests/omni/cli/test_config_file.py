"""--config FILE: a YAML mapping of flag names becomes the parser's defaults, so the command
line wins; switches, lists (repeated, several values, a JSON list) and every way a file can be
wrong, named with the file. tests/omni/cli/test_options.py checks a file and its flags give the
same settings end to end."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from omni.cli.config_file import ConfigFileError, apply_config_file, config_tokens, read_config_file
from omni.cli.options import build_parser


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--host", default="0.0.0.0")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--model", action="append", default=[])
    p.add_argument("--devices", nargs="+", default=[])
    return p


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "omni.yaml"
    path.write_text(text)
    return path


def test_each_kind_of_flag_becomes_its_tokens(tmp_path: Path) -> None:
    data = {"port": 9000, "verbose": True, "prefix_caching": False, "model": ["a", "b"], "--devices": ["cpu", "cpu"]}
    assert config_tokens(data, parser(), tmp_path) == [
        "--port", "9000", "--verbose", "--no-prefix-caching", "--model", "a", "--model", "b", "--devices", "cpu", "cpu",
    ]  # fmt: skip
    assert config_tokens({"verbose": False}, parser(), tmp_path) == []  # a plain switch left off


def test_a_json_list_flag_gets_its_list_as_json(tmp_path: Path) -> None:
    tokens = config_tokens({"allowed-origins": ["https://a.example", "https://b.example"]}, build_parser(), tmp_path)
    assert tokens == ["--allowed-origins", '["https://a.example","https://b.example"]']


def test_the_file_sets_defaults_and_the_command_line_wins(tmp_path: Path) -> None:
    path = write(tmp_path, "port: 9000\nhost: 127.0.0.1\nmodel: [a, b]\n")
    p = parser()
    argv = ["--port", "7000", "--model", "c"]
    apply_config_file(p, path, argv)
    args = p.parse_args(argv)
    assert (args.port, args.host) == (7000, "127.0.0.1")
    assert args.from_config_file == frozenset({"host"})  # port and model came from the line
    assert args.model == ["c"]  # the line's list replaces the file's, not added to it
    alone = parser()
    apply_config_file(alone, path, [])
    assert alone.parse_args([]).model == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("port: [1, 2\n", "not valid YAML"),
        ("- port\n", "must be a mapping of flag names to values"),
        ("config: other.yaml\n", "cannot name another"),
        ("frobnicate: 1\n", "unknown setting 'frobnicate' \\(no flag --frobnicate\\)"),
        ("verbose: 3\n", "verbose is a switch: give it true or false"),
        ("port: {a: 1}\n", "port takes a value or a list, not a mapping"),
        ("port: [1, 2]\n", "port takes one value, not a list"),
        ("devices: [[cpu]]\n", "is not a value a flag takes"),
        ("port: many\n", "a value above was refused"),
    ],
)
def test_a_bad_file_is_refused_naming_it(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigFileError, match=message) as refused:
        apply_config_file(parser(), path, [])
    assert str(refused.value).startswith(f"--config {path}:")


def test_an_empty_file_sets_nothing_and_a_missing_one_says_so(tmp_path: Path) -> None:
    assert read_config_file(write(tmp_path, "")) == {}
    with pytest.raises(ConfigFileError, match="No such file"):
        read_config_file(tmp_path / "absent.yaml")
