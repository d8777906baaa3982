"""Layers import one way, and the package keeps its shape (STYLE.md 2 and 12,
docs/ARCHITECTURE.md "Layers", HOUSE_REVIEW.md 4.3).

Read from the source: every import statement, including those inside functions, under
`TYPE_CHECKING` and relative ones (`from . import x`), into a graph of the package's modules
(omni, gpu_workers, scheduler). `from pkg import name` is an edge to pkg.name where that is a
module, else to pkg; importing a package is an edge to its __init__. Then checked again in a
fresh interpreter importing what a worker process imports.

1. One-way imports. LAYERS is ordered, lowest first:
       omni.shared, scheduler  <  omni.errors, omni.config, omni.metrics, omni.model_layout
       <  omni.text  <  omni.engines  <  omni.modalities  <  omni.serving  <  omni.http
       <  omni.cli  <  omni.__main__, omni
   A module of a layer imports only modules of its own layer or lower ones.
2. Who may import the workers. gpu_workers imports nothing of ours but itself and omni.shared;
   of gpu_workers the server imports only gpu_workers.worker (the spawn target), and only from
   omni.engines; the scheduler imports nothing of ours. Model code (gpu_workers/models/)
   imports no loader, no runner and no module of a worker kind's folder (llm/, encoder/, ...).
3. No cycle: no strongly connected component of more than one module. A `TYPE_CHECKING` guard
   does not hide one.
4. aiohttp. omni/http and omni/cli use any of it. Anywhere else a module uses only the aiohttp
   names its AIOHTTP_CLIENT entry lists, with the reason: the client side a module needs to
   fetch something (a ClientSession, a resolver, ClientError). Those lists never name the
   server side (aiohttp.web and web_*, test_utils, typedefs, the multipart readers,
   http_exceptions), and a test says so. "Uses" counts `from aiohttp.x import y` as aiohttp.x.y,
   `import aiohttp.x` as aiohttp.x, and after `import aiohttp` every attribute read off the
   name (`aiohttp.ClientSession` is aiohttp.ClientSession). gpu_workers uses no aiohttp at all.
5. A size budget: a package module over BUDGET lines needs an OVER_BUDGET entry with a reason.
6. Tests mirror the tree: every package module but an __init__ has tests/<same dirs>/test_<module>.py
   (test_<module>_<aspect>.py may sit beside it), or an UNMIRRORED entry naming where it is tested.
7. A fixed top: omni/ holds exactly TOP's modules, and its subpackages are the layers'.
8. Output kinds as data: no module outside omni/modalities/outputs/ names a concrete output kind
   (its OutputKind object, model-side class, piece type or route) but the endpoints of one kind
   (ONE_KIND_ENDPOINTS), each with the API it serves. Chat is generic: each kind's chat side
   (omni/modalities/outputs/chat_output.py) reads its options and renders its body.

Known violations sit in KNOWN_* sets and the allowlists. A test fails on a violation that is not
listed and on a listed one that no longer exists, so the lists only shrink. Each rule has a
self-test on synthetic graphs or tmp files that shows its checker sees a violation.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from collections.abc import Collection, Iterable, Iterator, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("omni", "gpu_workers", "scheduler")
SHARED = ("omni.shared",)


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules(package: str, root: Path = ROOT) -> list[tuple[str, Path]]:
    base = root / package.replace(".", "/")
    out = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out.append((name, path))
    return out


def _imports(path: Path) -> set[str]:
    """Every module an import statement in the file names (`from a import b` counts a.b too,
    since b may be a module)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _violations(packages: tuple[str, ...], forbidden: tuple[str, ...], allowed: tuple[str, ...] = ()) -> list[str]:
    found = []
    for package in packages:
        for module, path in _modules(package):
            for name in sorted(_imports(path)):
                if _under(name, forbidden) and not _under(name, allowed):
                    found.append(f"{module} imports {name}")
    return found


def test_worker_code_uses_only_the_shared_layers_of_the_server_package() -> None:
    # omni itself is allowed as a name only so that `from omni import shared` parses; each
    # imported member is checked as omni.<member> (the name list of _imports).
    found = [
        v for v in _violations(("gpu_workers",), ("omni", "aiohttp", "aiobotocore"), SHARED)
        if not v.endswith(" imports omni")
    ]  # fmt: skip
    assert found == []


@pytest.mark.parametrize("layer", [*SHARED, "scheduler"])
def test_shared_layers_and_the_scheduler_never_import_torch_or_aiohttp_web(layer: str) -> None:
    assert _violations((layer,), ("torch", "aiohttp.web", "gpu_workers")) == []


@pytest.mark.parametrize("layer", SHARED)
def test_shared_layers_import_nothing_of_the_server_above_them(layer: str) -> None:
    found = [v for v in _violations((layer,), ("omni",), SHARED) if not v.endswith(" imports omni")]
    assert found == []


def test_the_scheduler_imports_nothing_of_ours() -> None:
    assert _violations(("scheduler",), ("omni", "gpu_workers", "aiohttp")) == []


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text("def f():\n    from omni.http.errors import bad_request\n    import torch.nn\n")
    assert _imports(bad) >= {"omni.http.errors", "omni.http.errors.bad_request", "torch.nn"}


_WORKER_SCRIPT = """
import sys
from omni.shared import protocol
from gpu_workers.worker import worker_main
from gpu_workers.runner import runner_class
from gpu_workers.store_client import StoreClient
runner_class(protocol.LLMWorkerSpec), runner_class(protocol.EncoderWorkerSpec)  # both runners
store = StoreClient({store!r})
store.close()
ours = sorted(m for m in sys.modules if m == "omni" or m.startswith("omni."))
shared = {shared!r}
above = [m for m in ours if m != "omni" and not any(m == s or m.startswith(s + ".") for s in shared)]
clients = sorted(m for m in sys.modules if m.split(".")[0] in ("aiohttp", "aiobotocore", "botocore"))
print("ABOVE", above)
print("CLIENTS", clients)
"""


def _worker_imports(store: str) -> tuple[str, str]:
    script = _WORKER_SCRIPT.format(store=store, shared=SHARED)
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if line[:5] in ("ABOVE", "CLIEN"))
    return lines["ABOVE"], lines["CLIENTS"]


def test_a_worker_process_loads_no_server_module_and_no_http_client(tmp_path: Path) -> None:
    above, clients = _worker_imports(f"local:{tmp_path}")
    assert (above, clients) == ("[]", "[]")


def test_the_s3_client_is_loaded_only_for_an_s3_store(tmp_path: Path) -> None:
    above, clients = _worker_imports("s3://bucket/prefix")
    assert above == "[]"
    assert "'aiobotocore'" in clients


# --- The module graph -----------------------------------------------------------------------


def _module_paths(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, Path]:
    return {name: path for package in packages for name, path in _modules(package, root)}


def _import_edges(module: str, path: Path, known: Collection[str]) -> set[str]:
    """The modules of `known` that one file's import statements reach, wherever they stand."""

    def nearest(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    targets: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets.update(nearest(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # from . import x: relative to the module's package, one level up per extra dot
                base = package[: len(package) - node.level + 1]
                source = ".".join([*base, node.module] if node.module else base)
            else:
                source = node.module or ""
            for alias in node.names:
                full = f"{source}.{alias.name}"
                targets.add(full if full in known else nearest(source))
    return {t for t in targets if t is not None and t != module}


def _graph(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> dict[str, set[str]]:
    paths = _module_paths(root, packages)
    return {module: _import_edges(module, path, paths) for module, path in paths.items()}


GRAPH = _graph()


def _check_known(found: Collection[object], known: Collection[object], what: str) -> None:
    """found must equal known: a new violation fails, and so does a listed one that is gone."""
    def show(entries: set[object]) -> list[str]:  # a cycle's members in order, to read it
        return sorted(" ".join(sorted(map(str, e))) if isinstance(e, frozenset) else str(e) for e in entries)

    new = show(set(found) - set(known))
    stale = show(set(known) - set(found))
    assert not new, f"{what}, not listed: {new}"
    assert not stale, f"listed as {what} but no longer so; delete the entries: {stale}"


def test_the_known_list_check_fails_on_a_new_and_on_a_stale_entry() -> None:
    _check_known({"a"}, {"a"}, "violations")
    with pytest.raises(AssertionError, match="not listed"):
        _check_known({"a", "b"}, {"a"}, "violations")
    with pytest.raises(AssertionError, match="no longer"):
        _check_known({"a"}, {"a", "b"}, "violations")


def test_the_graph_reads_every_kind_of_import(tmp_path: Path) -> None:
    files = {
        "pkg/__init__.py": "from . import a\n",
        "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub import b\n",
        "pkg/sub/__init__.py": "",
        "pkg/sub/b.py": "def f():\n    from ..a import name\n    import pkg.sub.c.name_in_c\n",
        "pkg/sub/c.py": "from . import not_a_module\nimport os\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _graph(tmp_path, ("pkg",)) == {
        "pkg": {"pkg.a"},
        "pkg.a": {"pkg.sub.b"},
        "pkg.sub": set(),
        "pkg.sub.b": {"pkg.a", "pkg.sub.c"},
        "pkg.sub.c": {"pkg.sub"},
    }


# --- 1. One-way imports ---------------------------------------------------------------------

LAYERS: list[tuple[str, ...]] = [
    ("omni.shared", "scheduler"),
    ("omni.errors", "omni.config", "omni.metrics", "omni.model_layout"),
    ("omni.text",),
    ("omni.engines",),
    ("omni.modalities",),
    ("omni.serving",),
    ("omni.http",),
    ("omni.cli",),
    ("omni.__main__", "omni"),
]

# Issue 21's seams cut the 9 imports that ran up the layers; none is left, and none may be added.
KNOWN_UPWARD: set[tuple[str, str]] = set()


def _layer(module: str) -> int | None:
    """The index in LAYERS of the longest prefix naming the module (omni matches only
    what no layer below names); None for gpu_workers."""
    best: tuple[int, int] | None = None
    for index, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if _under(module, (prefix,)) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), index)
    return None if best is None else best[1]


def _upward(graph: Mapping[str, Collection[str]]) -> set[tuple[str, str]]:
    found = set()
    for module, targets in graph.items():
        for target in targets:
            here, there = _layer(module), _layer(target)
            if here is not None and there is not None and there > here:
                found.add((module, target))
    return found


def test_imports_run_down_the_layers() -> None:
    _check_known(_upward(GRAPH), KNOWN_UPWARD, "imports that run up the layers")


def test_the_layer_checker_sees_a_violation() -> None:
    graph = {
        "omni.text.tokenizer": {"omni.http.app", "omni.shared.media", "omni.text.chat_format"},
        "omni.errors": {"omni.engines.admission", "omni.config"},
        "omni.http.app": {"omni", "omni.cli.main", "scheduler.request", "gpu_workers.worker"},
        "scheduler.request": {"omni.errors"},
        "omni.cli.main": {"omni.__main__"},
        "omni.__main__": {"omni.cli.main"},
    }
    assert _upward(graph) == {
        ("omni.text.tokenizer", "omni.http.app"),
        ("omni.errors", "omni.engines.admission"),
        ("omni.http.app", "omni"),
        ("omni.http.app", "omni.cli.main"),
        ("scheduler.request", "omni.errors"),
        ("omni.cli.main", "omni.__main__"),
    }


# --- 2. Who may import the workers ----------------------------------------------------------

WORKER_ENTRY = "gpu_workers.worker"  # the spawn target the engines start a worker process with


def _crossings(graph: Mapping[str, Collection[str]]) -> set[tuple[str, str]]:
    """Imports across the server/worker boundary that the rules do not allow."""
    found = set()
    for module, targets in graph.items():
        for target in targets:
            if _under(module, ("gpu_workers",)):
                allowed = _under(target, ("gpu_workers", *SHARED))
            elif _under(target, ("gpu_workers",)):
                allowed = _under(module, ("omni.engines",)) and target == WORKER_ENTRY
            elif _under(module, ("scheduler",)):
                allowed = _under(target, ("scheduler",))
            else:
                allowed = True
            if not allowed:
                found.add((module, target))
    return found


def test_workers_and_server_meet_only_at_the_shared_layers_and_the_spawn_target() -> None:
    assert _crossings(GRAPH) == set()


def test_the_crossing_checker_sees_a_violation() -> None:
    graph = {
        "gpu_workers.runner": {"omni.shared.protocol", "omni.errors", "scheduler.request", "gpu_workers.llm.loader"},
        "omni.engines.llm": {"gpu_workers.worker", "gpu_workers.runner"},
        "omni.http.app": {"gpu_workers.worker"},
        "scheduler.scheduler": {"omni.shared.protocol", "scheduler.request"},
    }
    assert _crossings(graph) == {
        ("gpu_workers.runner", "omni.errors"),
        ("gpu_workers.runner", "scheduler.request"),
        ("omni.engines.llm", "gpu_workers.runner"),
        ("omni.http.app", "gpu_workers.worker"),
        ("scheduler.scheduler", "omni.shared.protocol"),
    }


# --- 2b. Model code loads nothing ----------------------------------------------------------

# gpu_workers/models/ holds model code: modules a loader builds and a runner drives. It reads its
# checkpoints through models/checkpoint_io.py, so it imports no loader, no runner and nothing of
# a worker kind's folder, where those live (a model that did could not be reused by another kind).
WORKER_KINDS = ("gpu_workers.llm", "gpu_workers.sample", "gpu_workers.encoder", "gpu_workers.vision_decoder",
                "gpu_workers.audio_decoder")  # fmt: skip
KNOWN_MODEL_IMPORTS: set[tuple[str, str]] = set()


def _model_imports(graph: Mapping[str, Collection[str]]) -> set[tuple[str, str]]:
    """Imports by gpu_workers.models of a loader, a runner, the worker or a worker kind's module."""
    return {
        (module, target)
        for module, targets in graph.items()
        if _under(module, ("gpu_workers.models",))
        for target in targets
        if _under(target, (*WORKER_KINDS, "gpu_workers.runner", "gpu_workers.worker"))
        or target.rpartition(".")[2] in ("loader", "runner")
    }


def test_models_import_no_loader_and_no_runner() -> None:
    assert {m for m in GRAPH if _under(m, WORKER_KINDS)}, "the worker kinds' folders are where this list says"
    _check_known(_model_imports(GRAPH), KNOWN_MODEL_IMPORTS, "model modules importing a loader or a runner")


def test_the_model_import_checker_sees_a_violation() -> None:
    graph = {
        "gpu_workers.models.a": {"gpu_workers.models.checkpoint_io", "gpu_workers.attention.backend",
                                 "gpu_workers.llm.loader", "gpu_workers.sample.sampler"},
        "gpu_workers.models.b": {"gpu_workers.runner", "gpu_workers.tiny.loader", "gpu_workers.preprocess.image"},
        "gpu_workers.llm.loader": {"gpu_workers.models.a", "gpu_workers.llm.runner"},
    }  # fmt: skip
    assert _model_imports(graph) == {
        ("gpu_workers.models.a", "gpu_workers.llm.loader"),
        ("gpu_workers.models.a", "gpu_workers.sample.sampler"),
        ("gpu_workers.models.b", "gpu_workers.runner"),
        ("gpu_workers.models.b", "gpu_workers.tiny.loader"),
    }


# --- 3. No import cycle ---------------------------------------------------------------------

# Issue 21's seams cut the one cycle of six modules that a TYPE_CHECKING guard hid; none is left.
KNOWN_CYCLES: set[frozenset[str]] = set()


def _cycles(graph: Mapping[str, Collection[str]]) -> set[frozenset[str]]:
    """Tarjan's strongly connected components, iterative; those of more than one module."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: set[frozenset[str]] = set()

    def enter(node: str) -> tuple[str, Iterator[str]]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        return node, iter(sorted(t for t in graph[node] if t in graph))

    for root in sorted(graph):
        if root in index:
            continue
        work = [enter(root)]
        while work:
            node, targets = work[-1]
            for target in targets:
                if target not in index:
                    work.append(enter(target))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:  # every target done: node closes; a root of a component pops it
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = {node}
                    while (member := stack.pop()) != node:
                        component.add(member)
                    on_stack.difference_update(component)
                    if len(component) > 1:
                        found.add(frozenset(component))
    return found


def test_no_import_cycle() -> None:
    _check_known(_cycles(GRAPH), KNOWN_CYCLES, "import cycles")


def test_the_cycle_checker_sees_a_violation() -> None:
    graph = {
        "a": {"b"}, "b": {"c"}, "c": {"a", "d"},  # a cycle of three that leads on to d
        "d": {"e"}, "e": {"d", "outside"},  # and a second of two
        "f": {"a", "f"},  # into a cycle, and to itself: neither is a cycle of modules
    }  # fmt: skip
    assert _cycles(graph) == {frozenset("abc"), frozenset("de")}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == set()


# --- 4. aiohttp -----------------------------------------------------------------------------

AIOHTTP_ANYWHERE = ("omni.http", "omni.cli")

# What a module outside omni/http and omni/cli may use of aiohttp, and why. Client side only.
AIOHTTP_CLIENT: dict[str, tuple[frozenset[str], str]] = {
    "omni.modalities.inputs.source": (
        frozenset({
            "aiohttp.ClientError", "aiohttp.ClientResponse", "aiohttp.ClientSession",
            "aiohttp.TCPConnector", "aiohttp.abc.ResolveResult", "aiohttp.resolver.ThreadedResolver",
        }),
        "fetches media by URL: one ClientSession whose resolver refuses private addresses",
    ),
    "omni.shared.store.s3": (
        frozenset({"aiohttp.ClientError"}),
        "aiobotocore talks to S3 over aiohttp and raises its ClientError, a backend error to map",
    ),
}  # fmt: skip

# Issue 21's seams moved every server-side aiohttp use below http up into it; none is left.
KNOWN_AIOHTTP: set[tuple[str, str]] = set()

_SERVER_SIDE = ("test_utils", "typedefs", "multipart", "BodyPartReader", "MultipartReader", "http_exceptions")


def _server_side(name: str) -> bool:
    member = name.split(".")[1]
    return member.startswith("web") or member in _SERVER_SIDE


def _aiohttp_uses(path: Path) -> set[str]:
    """Each aiohttp name the file uses: imported from it, or read off a name bound to it."""
    tree = ast.parse(path.read_text(), str(path))
    uses: set[str] = set()
    bound: set[str] = set()  # local names of the aiohttp package itself
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "aiohttp":
                    bound.add(alias.asname or "aiohttp")
                elif _under(alias.name, ("aiohttp",)):
                    uses.add(alias.name)
                    if alias.asname is None:  # import aiohttp.x binds aiohttp too
                        bound.add("aiohttp")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and _under(node.module or "", ("aiohttp",)):
            uses.update(f"{node.module}.{alias.name}" for alias in node.names)
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in bound:
            uses.add(f"aiohttp.{node.attr}")
    return uses


def _aiohttp_violations(uses: Mapping[str, Collection[str]]) -> set[tuple[str, str]]:
    return {
        (module, name)
        for module, names in uses.items()
        if not _under(module, AIOHTTP_ANYWHERE)
        for name in names
        if name not in AIOHTTP_CLIENT.get(module, (frozenset(), ""))[0]
    }


_USES = {module: _aiohttp_uses(path) for module, path in _module_paths().items()}


def test_aiohttp_below_http_is_only_a_listed_client() -> None:
    _check_known(_aiohttp_violations(_USES), KNOWN_AIOHTTP, "aiohttp uses outside omni/http and omni/cli")


def test_the_aiohttp_allowlist_names_only_the_client_side_and_only_what_is_used() -> None:
    for module, (names, reason) in AIOHTTP_CLIENT.items():
        assert reason and not _under(module, ("gpu_workers",)), module
        assert not [n for n in names if _server_side(n)], module
        assert names <= _USES[module], f"{module} no longer uses {sorted(names - _USES[module])}"


def test_the_aiohttp_checker_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "m.py"
    bad.write_text(
        "import aiohttp as h\nimport aiohttp.web_request\nfrom aiohttp.typedefs import Handler\n"
        "def f(r: 'aiohttp.web_request.Request') -> None:\n    h.ClientSession(); aiohttp.web_request.Request\n"
    )
    uses = _aiohttp_uses(bad)
    assert uses == {"aiohttp.web_request", "aiohttp.typedefs.Handler", "aiohttp.ClientSession"}
    assert _aiohttp_violations({"omni.serving.x": uses, "omni.http.x": uses}) == {
        ("omni.serving.x", name) for name in uses
    }
    source = {"omni.modalities.inputs.source": {"aiohttp.ClientSession", "aiohttp.web"}}
    assert _aiohttp_violations(source) == {("omni.modalities.inputs.source", "aiohttp.web")}
    assert [_server_side(n) for n in ("aiohttp.web", "aiohttp.web_protocol.X", "aiohttp.ClientError")] == [
        True, True, False,
    ]  # fmt: skip


# --- 5. A size budget -----------------------------------------------------------------------

BUDGET = 600

OVER_BUDGET: dict[str, str] = {
    "gpu_workers/models/unit_vocoder.py": "one model, read top-down like nanoGPT's model.py (STYLE.md 7)",
    "omni/metrics.py": "one registry of every metric family, so vLLM's names, labels and buckets read in one place",
    "omni/http/openapi.py": "one document of every endpoint: its operations are data, read in one place as the API is",
}


def _oversized(root: Path, paths: Iterable[Path]) -> dict[str, int]:
    sizes = {str(p.relative_to(root)): len(p.read_text().splitlines()) for p in paths}
    return {name: size for name, size in sizes.items() if size > BUDGET}


def test_modules_keep_to_the_size_budget() -> None:
    _check_known(_oversized(ROOT, _module_paths().values()), OVER_BUDGET, f"modules over {BUDGET} lines")
    assert all(OVER_BUDGET.values())


def test_the_size_checker_sees_a_violation(tmp_path: Path) -> None:
    (tmp_path / "big.py").write_text("x = 1\n" * (BUDGET + 1))
    (tmp_path / "small.py").write_text("x = 1\n" * BUDGET)
    assert _oversized(tmp_path, tmp_path.glob("*.py")) == {"big.py": BUDGET + 1}


# --- 6. Tests mirror the tree ---------------------------------------------------------------

# A module without tests/<same dirs>/test_<module>.py, and where it is tested instead. Every
# tests/ path named here must exist. Every gpu_workers module has its own test file.
UNMIRRORED: dict[str, str] = {
    "omni/__main__.py": "two lines calling omni.cli.main.main, whose rules are tests/omni/cli/test_main.py's; the e2e tests run omni.cli.main",
    "omni/http/handlers/images.py": "tests/e2e/test_images.py",
    "omni/http/state.py": "the app's typed keys only, no behaviour",
    "omni/modalities/outputs/chat_output.py": "protocols only; the chat sides that keep them are tests/omni/modalities/outputs/test_image_chat.py's and tests/omni/modalities/outputs/test_audio_chat_turns.py's",
    "omni/serving/image_edits.py": "tests/e2e/test_image_edits.py (the lifecycle on real workers)",
}


def _unmirrored(root: Path, paths: Iterable[Path]) -> set[str]:
    found = set()
    for path in paths:
        relative = path.relative_to(root)
        if path.name != "__init__.py" and not (root / "tests" / relative.parent / f"test_{path.name}").exists():
            found.add(str(relative))
    return found


def test_tests_mirror_the_package_tree() -> None:
    _check_known(_unmirrored(ROOT, _module_paths().values()), UNMIRRORED, "modules without a mirrored test")


def test_every_test_an_unmirrored_entry_names_exists() -> None:
    named = {m for reason in UNMIRRORED.values() for m in re.findall(r"tests/[\w/]+\.py", reason)}
    assert named, "the entries name their tests"
    assert sorted(n for n in named if not (ROOT / n).exists()) == []


def test_the_mirror_checker_sees_a_violation(tmp_path: Path) -> None:
    names = ("pkg/__init__.py", "pkg/sub/a.py", "pkg/sub/b.py", "tests/pkg/sub/test_a.py", "tests/pkg/test_b.py")
    for name in names:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    assert _unmirrored(tmp_path, (tmp_path / "pkg").rglob("*.py")) == {"pkg/sub/b.py"}


# --- 7. A fixed top -------------------------------------------------------------------------

TOP = {"__init__", "__main__", "config", "errors", "metrics", "model_layout"}


def _top(package_dir: Path) -> tuple[set[str], set[str]]:
    """The modules at the top of a package and its subpackages (folders holding Python)."""
    modules = {p.stem for p in package_dir.glob("*.py")}
    subpackages = {p.name for p in package_dir.iterdir() if p.is_dir() and any(p.rglob("*.py"))}
    return modules, subpackages


def test_the_top_of_omni_is_fixed_and_its_subpackages_are_the_layers() -> None:
    modules, subpackages = _top(ROOT / "omni")
    assert modules == TOP
    layered = {p.removeprefix("omni.") for layer in LAYERS for p in layer if p.startswith("omni.")}
    assert subpackages == layered - TOP  # every subpackage has its place in LAYERS
    assert TOP - {"__init__"} <= layered


def test_the_top_checker_sees_a_violation(tmp_path: Path) -> None:
    for name in ("__init__.py", "config.py", "utils.py", "text/__init__.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).touch()
    (tmp_path / "data").mkdir()  # no Python in it: not a subpackage
    assert _top(tmp_path) == ({"__init__", "config", "utils"}, {"text"})


# --- 8. Output kinds as data ----------------------------------------------------------------

OUTPUTS = "omni.modalities.outputs"

# The endpoints of one kind: a module outside omni/modalities/outputs/ that names a concrete
# output kind, and the API it serves. "Names": it imports a kind's module
# (omni/modalities/outputs/<kind>.py, in any form) and uses one of that kind's names, imported or
# read as an attribute: the OutputKind object (IMAGE) or the classes it is made of, its
# model-side object, piece type and route (ModelImages, GeneratedImage, ImageRoute). Generic
# paths (the router, Delta, the served model, choice constraints, the ban chain, SSE collection,
# app start-up, the watchdog, and chat: its options, its routes and its body, which each kind's
# chat side in omni/modalities/outputs/ gives) iterate the kinds instead. What is left is not a
# violation waiting to be fixed: each module is an API that exists for one kind, its body that
# kind's output in OpenAI's shape. A new module may join only as such an endpoint; a generic one
# iterates OUTPUT_KINDS and CHAT_SIDES.
ONE_KIND_ENDPOINTS: dict[str, str] = {
    "omni.http.handlers.images": "the images API (/v1/images/*): its body is the drawn images",
    "omni.http.handlers.speech": "the speech API (/v1/audio/speech): its body is the spoken audio",
    "omni.serving.speech": "the speech API's lifecycle",
    "omni.serving.images": "the images API's lifecycle (image_generation, and the steps image edits share)",
    "omni.serving.realtime.response": "the Realtime API speaks: its events carry audio",
    "omni.serving.realtime.session": "the Realtime API's voices",
    "omni.serving.responses.turn": "the Responses API's image_generation tool",
    "omni.serving.responses.events": "the Responses API's image_generation_call items",
}


def _concrete_kinds(root: Path = ROOT) -> dict[str, set[str]]:
    """Each module of omni/modalities/outputs/ that makes an OutputKind -> the kind's names: the
    object it is bound to and the classes it is made of (model-side object, piece type, route)."""
    kinds: dict[str, set[str]] = {}
    for module, path in _modules(OUTPUTS, root):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            call = node.value
            if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id == "OutputKind"):
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {t.id for t in targets if isinstance(t, ast.Name)}
            kinds.setdefault(module, set()).update(names | {a.id for a in call.args[1:4] if isinstance(a, ast.Name)})
    return kinds


def _kind_namers(root: Path = ROOT, packages: Iterable[str] = PACKAGES) -> set[str]:
    """The modules outside omni/modalities/outputs/ that name a concrete kind (ONE_KIND_ENDPOINTS)."""
    kinds = _concrete_kinds(root)
    found = set()
    for module, path in _module_paths(root, packages).items():
        if _under(module, (OUTPUTS,)):
            continue
        imported = _imports(path)
        tree = ast.parse(path.read_text(), str(path))
        used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        used |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
        used |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
        if any(kind_module in imported and used & names for kind_module, names in kinds.items()):
            found.add(module)
    return found


def test_only_the_listed_modules_name_a_concrete_output_kind() -> None:
    assert _concrete_kinds().keys() == {f"{OUTPUTS}.image", f"{OUTPUTS}.audio"}
    _check_known(_kind_namers(), ONE_KIND_ENDPOINTS, "modules naming a concrete output kind")
    assert all(ONE_KIND_ENDPOINTS.values())


def test_the_kind_checker_sees_a_violation(tmp_path: Path) -> None:
    outputs = "omni/modalities/outputs"
    files = {
        f"{outputs}/thing.py": (
            "class ModelThing: ...\nclass ThingPiece: ...\nclass ThingRoute: ...\ndef helper(): ...\n"
            'THING: OutputKind[ModelThing, ThingPiece] = OutputKind("thing", ModelThing, ThingPiece, ThingRoute, b)\n'
        ),
        f"{outputs}/router.py": "from omni.modalities.outputs.thing import ThingPiece\n",  # inside outputs/: fine
        "omni/serving/imports_a_class.py": "from omni.modalities.outputs.thing import ThingPiece\n",
        "omni/serving/reads_the_kind.py": "from omni.modalities.outputs import thing\nx = thing.THING\n",
        "omni/serving/imports_a_helper.py": "from omni.modalities.outputs.thing import helper\n",  # no kind's name
        "omni/serving/same_name_elsewhere.py": "ThingPiece = 1\n",  # never imports the kind's module
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _concrete_kinds(tmp_path) == {f"{OUTPUTS}.thing": {"THING", "ModelThing", "ThingPiece", "ThingRoute"}}
    assert _kind_namers(tmp_path, ("omni",)) == {"omni.serving.imports_a_class", "omni.serving.reads_the_kind"}
