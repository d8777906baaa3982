"""docs/ARCHITECTURE.md stays a short, current design: at most 300 lines, and every repository
path it names exists, with the function or class it names after a colon (`file.py:name`,
`file.py:Class.method`). A move or a rename that forgets the page fails here."""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DESIGN = ROOT / "docs" / "ARCHITECTURE.md"
HISTORY = ROOT / "docs" / "history"
MAX_LINES = 300

_TOPS = ("omni", "gpu_workers", "scheduler", "tests", "bench", "docs", "bin", "deploy")
# A top folder, then segments; a {a,b} group names several files. Not preceded by a path
# character, so `/v1/...` or `x/omni/...` is no match. `<kind>` placeholders end the path
# at the folder before them.
_PATH = re.compile(
    rf"(?<![\w./-])((?:{'|'.join(_TOPS)})/(?:[\w.-]|/|\{{[\w.,-]+\}})*)"
    r"(?::([A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*))?"
)


def named_paths(text: str) -> list[tuple[str, str | None]]:
    """(path, name after the colon or None) for each mention, braces expanded, in order."""
    found = []
    for m in _PATH.finditer(text):
        path = m.group(1).rstrip(".")  # a sentence's full stop
        for expanded in _expand(path):
            found.append((expanded, m.group(2)))
    return found


def _expand(path: str) -> list[str]:
    """a/{b,c}.py -> [a/b.py, a/c.py]; several groups multiply."""
    head, brace, rest = path.partition("{")
    if not brace:
        return [path]
    choices, _, tail = rest.partition("}")
    return [p for choice in choices.split(",") for p in _expand(head + choice + tail)]


def _resolve(path: str) -> Path | None:
    target = ROOT / path.rstrip("/")
    if target.exists():
        return target
    module = target.with_name(target.name + ".py")
    return module if not path.endswith("/") and module.is_file() else None


@cache
def _defined(path: Path) -> frozenset[str]:
    """Every function and class of a module by its qualified name (f, C, C.m, C.Inner.m), and its
    top-level constants (SAMPLING_BOUNDS)."""
    names: set[str] = set()

    def walk(body: list[ast.stmt], prefix: str) -> None:
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(prefix + node.name)
                if isinstance(node, ast.ClassDef):
                    walk(node.body, f"{prefix}{node.name}.")
            elif not prefix and isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))  # a module's constants

    walk(ast.parse(path.read_text(), str(path)).body, "")
    return frozenset(names)


def missing(text: str) -> list[str]:
    """The mentions in text whose path, or whose name in that file, does not exist."""
    bad = []
    for path, name in named_paths(text):
        target = _resolve(path)
        if target is None:
            bad.append(path)
        elif name is not None and (target.suffix != ".py" or name not in _defined(target)):
            bad.append(f"{path}:{name}")
    return bad


def test_the_design_is_at_most_300_lines() -> None:
    assert len(DESIGN.read_text().splitlines()) <= MAX_LINES


def test_every_path_the_design_names_exists() -> None:
    text = DESIGN.read_text()
    assert len(named_paths(text)) > 100  # the pattern still finds the page's paths
    assert missing(text) == []


def test_a_wrong_path_or_name_is_caught() -> None:
    text = (
        "See omni/errors.py:APIError and omni/http/errors.py:error_middleware, "
        "omni/serving/model.py:ModelRegistry.get, omni/modalities/outputs/{image,audio}.py, "
        "omni/http/handlers/chat (the handler) and gpu_workers/llm/.\n"
        "Gone: omni/orchestrator.py, omni/api/, omni/errors.py:no_such_helper, "
        "omni/serving/model.py:ModelRegistry.nothing, omni/modalities/outputs/{image,video}.py, "
        "and a route, /v1/omni/chat, which is no path."
    )
    assert missing(text) == [
        "omni/orchestrator.py",
        "omni/api/",
        "omni/errors.py:no_such_helper",
        "omni/serving/model.py:ModelRegistry.nothing",
        "omni/modalities/outputs/video.py",
    ]


def test_the_history_index_lists_every_log() -> None:
    index = (HISTORY / "README.md").read_text()
    logs = sorted(p.name for p in HISTORY.glob("*.md") if p.name != "README.md")
    assert logs and [name for name in logs if f"]({name})" not in index] == []


def _recipes() -> dict[str, str]:
    """Each recipe of the page's Recipes section by its bold title (`**Add a worker kind:**`)."""
    section = DESIGN.read_text().split("\n## Recipes\n", 1)[1].split("\n## ", 1)[0]
    parts = re.split(r"^\*\*(Add [^*(:]+?)[:]?\*\*", section, flags=re.M)
    return {title.strip(): body for title, body in zip(parts[1::2], parts[2::2], strict=True)}


def _module_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    names = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}  # fmt: skip
    return names | {name.split(".")[0] for name in _defined(path)}


def test_every_path_a_recipe_names_exists() -> None:
    recipes = _recipes()
    assert {"Add a sampling field", "Add a worker kind", "Add an LLM", "Add an output modality"} <= set(recipes)
    for title, body in recipes.items():
        assert named_paths(body), title
        assert missing(body) == [], title


def test_the_llm_recipe_states_its_file_counts_and_the_names_it_gives_exist() -> None:
    """A Llama-family variant touches two files, a new family four (issue 32): the recipe says so,
    names exactly those files, and each code name it quotes is defined where it says."""
    body = " ".join(_recipes()["Add an LLM"].split())
    variant, family = body.split("A new family, four:")
    assert "a Llama-family variant, two files:" in variant
    assert {p for p, _ in named_paths(variant)} == {"gpu_workers/models/llama.py", "gpu_workers/tiny/checkpoints.py"}
    assert {p for p, _ in named_paths(family)} == {
        "gpu_workers/models/",  # <family>.py
        "gpu_workers/models/registry.py",
        "gpu_workers/tiny/checkpoints.py",
        "tests/gpu_workers/models/",
    }
    quoted = {
        "gpu_workers/models/llama.py": {"ARCHITECTURES", "LlamaFamilyConfig"},
        "gpu_workers/tiny/checkpoints.py": {"_PER_TYPE"},
        "gpu_workers/models/registry.py": {"_BUILTIN_MODULES", "register_architecture", "CausalLM"},
    }
    for path, names in quoted.items():
        assert names <= _module_names(ROOT / path), path
        assert all(re.search(rf"[`:@]{n}\b", body) for n in names), names
    assert "LlamaFamilyConfig.from_hf" in _defined(ROOT / "gpu_workers/models/llama.py")
