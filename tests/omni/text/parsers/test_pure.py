"""The parsers are pure text code: they import nothing of the server, no torch, no aiohttp and
no grammar library, so any layer (the API, a benchmark, a test) can use them."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[4] / "omni" / "text" / "parsers"
FORBIDDEN = ("torch", "aiohttp", "llguidance", "gpu_workers", "scheduler")


def imported(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


def test_parsers_import_only_the_standard_library_and_each_other() -> None:
    modules = sorted(PACKAGE.glob("*.py"))
    assert {p.name for p in modules} >= {"__init__.py", "tool_calls.py", "reasoning.py", "tool_grammar.py"}
    found = []
    for path in modules:
        for name in imported(path):
            top = name.split(".")[0]
            if top in FORBIDDEN or (top == "omni" and not name.startswith("omni.text.parsers")):
                found.append(f"{path.name} imports {name}")
    assert found == []
