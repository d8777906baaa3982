"""The flag builder: one argparse group from a config dataclass's declarations, read back into it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from omni.cli.flags import add_section, read_section
from omni.shared.settings import setting


@dataclasses.dataclass(frozen=True)
class Example:
    max_things: int = setting(8, help="at most this many things", vllm_alias="--max-num-things")
    memory: int = setting(1 << 20, help="bytes", type="size")
    mode: str = setting("fast", help="how", choices=("fast", "slow"))
    verbose: bool = setting(False, help="say more")
    caching: bool = setting(True, flag="--enable-caching", help="cache", off_flag=("--no-caching", "do not cache"))
    devices: tuple[str, ...] = setting(default_factory=tuple, help="devices", type="devices")
    derived: int | None = setting(None, help="worked out after parsing", unset=None)
    internal: int = 3  # no flag: the command line never sets it


def _parse(*argv: str) -> Example:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    add_section(parser, "example", Example)
    return read_section(Example, parser.parse_args(list(argv)))


def test_defaults_are_the_fields_defaults() -> None:
    assert _parse() == Example()


def test_every_declared_flag_reaches_its_field() -> None:
    parsed = _parse(
        "--max-num-things", "5", "--memory", "2KiB", "--mode", "slow", "--verbose", "--no-caching",
        "--devices", "cuda:0,cuda:1", "--derived", "7",
    )  # fmt: skip
    assert parsed == Example(
        max_things=5, memory=2048, mode="slow", verbose=True, caching=False,
        devices=("cuda:0", "cuda:1"), derived=7,
    )  # fmt: skip
    assert _parse("--max-things", "6").max_things == 6  # the flag and its vLLM alias are one setting


@pytest.mark.parametrize("argv", [["--mode", "medium"], ["--internal", "4"], ["--enable-caching", "--no-caching"]])
def test_refused(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        _parse(*argv)
