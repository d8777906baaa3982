"""Layers import one way (STYLE.md 2, docs/ARCHITECTURE.md "Layers").

    server (omni/: api, engines, orchestrator, ...) --> shared layers, scheduler
    workers (gpu_workers/)                          --> shared layers
    shared layers (omni.shared.protocol, omni.shared.store, omni.shared.media, omni.shared.log_format, omni.shared.gil_free,
                   omni.shared.settings), scheduler --> nothing of ours above

Read from the source (every import statement, including those inside functions), then
checked again in a fresh interpreter importing what a worker process imports.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED = ("omni.shared.protocol", "omni.shared.store", "omni.shared.media", "omni.shared.log_format", "omni.shared.gil_free",
          "omni.shared.settings")  # fmt: skip


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _modules(package: str) -> list[tuple[str, Path]]:
    base = ROOT / package.replace(".", "/")
    out = []
    for path in sorted(base.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
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
    # omni itself is allowed as a name only so that `from omni import protocol` parses; each
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
