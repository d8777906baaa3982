"""The lent GPU machine's Python packages, simulated in this venv (issue 34 acceptance 2).

The lent machine has a fixed package list (LENT, from the device tool's notes) plus what
bundle.py carries. To see here what collection and imports do there, `site DIR` writes a
sitecustomize.py into DIR that hides every package outside that set; run a python with DIR
first on PYTHONPATH.
"That set" is LENT and the carried distributions with everything they require (read from the
installed metadata, markers evaluated for this interpreter): the lent image has each listed
package's dependencies installed too, under whatever name it was installed.

    python -m bench.gpu_smoke.lent site DIR    # writes DIR/sitecustomize.py
    python -m bench.gpu_smoke.lent blocked     # the distributions and modules it hides

The hook works at the path finder, as a missing package is missing: an import raises
ModuleNotFoundError, importlib.util.find_spec returns None (transformers asks that way whether
accelerate is there), and importlib.metadata does not list the distribution (so pytest does not
autoload pytest-asyncio's or xdist's plugin).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import re
import sys
from collections.abc import Iterable
from pathlib import Path

from bench.gpu_smoke.bundle import CARRIED, FLASHINFER_WHEEL

# On the image already ("Not carried" in docs/GPU_SMOKE_PLAN.md and the device tool's notes).
LENT = (
    "torch", "triton", "transformers", "tokenizers", "safetensors", "numpy", "pillow", "aiohttp", "yarl",
    "msgpack", "prometheus-client", "pyyaml", "jinja2", "tqdm", "uvloop", "onnxruntime", "huggingface-hub",
    "pytest", "pytest-timeout", "hypothesis", "ninja", "filelock", "packaging", "requests", "nvidia-ml-py",
    "einops", "click", "tabulate", "cuda-bindings",
)  # fmt: skip
# Absent there whatever this venv's newer versions require (the review of the image named them:
# docs/GPU_SMOKE_PLAN.md); here transformers 5.25 and huggingface-hub 2.x pull pydantic in.
ABSENT = (
    "aiobotocore", "botocore", "diffusers", "jsonschema", "openai", "alias-free-torch", "bigvgan",
    "openapi-spec-validator", "pydantic", "pydantic-core", "referencing", "pytest-asyncio", "pytest-xdist",
)  # fmt: skip
# the project itself runs from the tree (PYTHONPATH), not installed: its requirements are not there
OURS = "omni-serve"
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def carried() -> list[str]:
    """The carried distributions' names, from bundle.py's requirements."""
    names = [c.requirement.split("==")[0] for c in CARRIED]
    return [normalize(n) for n in [*names, FLASHINFER_WHEEL.requirement.split("==")[0]]]


def _requires(dist: md.Distribution) -> Iterable[str]:
    from packaging.requirements import InvalidRequirement, Requirement

    for line in dist.requires or []:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            m = _REQ_NAME.match(line)
            if m:
                yield normalize(m.group(1))
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            yield normalize(req.name)


def installed() -> dict[str, md.Distribution]:
    return {normalize(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}


def allowed(dists: dict[str, md.Distribution], roots: Iterable[str], absent: Iterable[str] = ABSENT) -> set[str]:
    """roots and every distribution they require, transitively, as far as `dists` knows them,
    but never one named absent."""
    seen: set[str] = {normalize(a) for a in absent}
    todo = [normalize(r) for r in roots]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in dists:
            todo.extend(_requires(dists[name]))
    return (seen - {normalize(a) for a in absent}) | {OURS}


def top_level_modules(dist: md.Distribution) -> set[str]:
    """The importable top-level names a distribution installs (its files, else top_level.txt)."""
    names: set[str] = set()
    for f in dist.files or []:
        parts = f.parts
        if not parts or parts[0].endswith((".dist-info", ".egg-info", ".data")) or parts[0] in ("..", "__pycache__"):
            continue
        head = parts[0]
        if len(parts) == 1:
            if head.endswith(".py"):
                names.add(head[:-3])
            elif head.endswith((".so", ".pyd")):
                names.add(head.split(".")[0])
        else:
            names.add(head)
    top = dist.read_text("top_level.txt")
    if top:
        names.update(x.strip() for x in top.split() if x.strip())
    return {n for n in names if n.isidentifier()}


def blocked() -> tuple[list[str], list[str]]:
    """(the distributions outside the lent set, the modules only they provide)."""
    dists = installed()
    ok = allowed(dists, [*LENT, *carried()])
    out = sorted(n for n in dists if n not in ok)
    keep: set[str] = set()
    for n in ok:
        if n in dists:
            keep |= top_level_modules(dists[n])
    mods: set[str] = set()
    for n in out:
        mods |= top_level_modules(dists[n])
    return out, sorted(mods - keep - set(sys.stdlib_module_names) - {"tests", "bench"})


_SITE = '''"""Written by bench/gpu_smoke/lent.py: the packages the lent GPU machine lacks, made absent.

Absent as there: the path finder neither finds their modules (an import raises
ModuleNotFoundError, importlib.util.find_spec returns None) nor lists their distributions
(importlib.metadata, and so pytest's plugin autoload, do not see them).
"""
import re
from importlib.machinery import PathFinder

MODULES = frozenset({modules!r})
DISTRIBUTIONS = frozenset({dists!r})
_find_spec = PathFinder.find_spec  # bound or static, as this Python has it
_find_distributions = PathFinder.find_distributions


def _spec(cls, fullname, path=None, target=None):
    if fullname.partition(".")[0] in MODULES:
        return None
    return _find_spec(fullname, path, target)


def _distributions(cls, *args, **kwargs):
    for d in _find_distributions(*args, **kwargs):
        name = d.metadata["Name"] or ""
        if re.sub(r"[-_.]+", "-", name).lower() not in DISTRIBUTIONS:
            yield d


# bound on access, as callers that keep PathFinder.find_spec as a class attribute expect (pytest)
PathFinder.find_spec = classmethod(_spec)
PathFinder.find_distributions = classmethod(_distributions)
'''


def write_site(directory: Path) -> list[str]:
    """DIR/sitecustomize.py; the modules it hides."""
    directory.mkdir(parents=True, exist_ok=True)
    dists, mods = blocked()
    # the project runs from the tree there, uninstalled (tests/bare_checkout.py): its metadata goes too
    (directory / "sitecustomize.py").write_text(_SITE.format(modules=sorted(mods), dists=sorted([*dists, OURS])))
    return mods


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="action", required=True)
    s = sub.add_parser("site")
    s.add_argument("dir", type=Path)
    sub.add_parser("blocked")
    a = p.parse_args(argv)
    if a.action == "site":
        write_site(a.dir)
    else:
        dists, mods = blocked()
        print(f"{len(dists)} distributions not on the lent machine: {' '.join(dists)}")
        print(f"{len(mods)} modules blocked: {' '.join(mods)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
