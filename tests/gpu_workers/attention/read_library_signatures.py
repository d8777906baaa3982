"""Regenerates library_signatures.json: the parameters of every library function the CUDA
attention backends call (and the graphs' FlashInfer decode wrapper), read with `ast` from the
published source, so that CPU tests can bind our calls to them (library_fakes.py).

    pip download flashinfer-python==0.7.4 --no-deps -d /tmp/fi
    FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE pip download flash-attn==2.8.3 --no-deps --no-binary :all: \
        --no-build-isolation -d /tmp/fa
    git clone https://github.com/vllm-project/flash-attention /tmp/vfa   # vLLM's build
    python -m tests.gpu_workers.attention.read_library_signatures \
        --flashinfer /tmp/fi/flashinfer_python-0.7.4-py3-none-any.whl \
        --flash-attn /tmp/fa/flash_attn-2.8.3.tar.gz \
        --vllm-flash-attn /tmp/vfa --vllm-flash-attn-rev "$(git -C /tmp/vfa rev-parse HEAD)"

None of these imports on a CPU machine (each loads its CUDA extension at import), which is
why the source is read rather than inspect.signature of the installed package.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import tarfile
import zipfile
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).with_name("library_signatures.json")

# (library, qualified name as called, file inside the package, how it is read)
#   "plan+_plan_impl": BatchDecodeWithPagedKVCacheWrapper.plan takes **kwargs and forwards
#   them to _plan_impl; its keyword-only parameters are plan's keywords.
WANTED: dict[str, list[tuple[str, str, str]]] = {
    "flashinfer": [
        ("BatchPrefillWithPagedKVCacheWrapper.__init__", "flashinfer/prefill.py", "def"),
        ("BatchPrefillWithPagedKVCacheWrapper.plan", "flashinfer/prefill.py", "def"),
        ("BatchPrefillWithPagedKVCacheWrapper.run", "flashinfer/prefill.py", "def"),
        ("BatchDecodeWithPagedKVCacheWrapper.__init__", "flashinfer/decode.py", "def"),
        ("BatchDecodeWithPagedKVCacheWrapper.plan", "flashinfer/decode.py", "plan+_plan_impl"),
        ("BatchDecodeWithPagedKVCacheWrapper.run", "flashinfer/decode.py", "def"),
    ],
    "flash_attn": [
        ("flash_attn_varlen_func", "flash_attn/flash_attn_interface.py", "def"),
        ("flash_attn_with_kvcache", "flash_attn/flash_attn_interface.py", "def"),
    ],
    # vLLM's build exports no flash_attn_with_kvcache (vllm_flash_attn/__init__.py at the
    # revision read): its paged decode is flash_attn_varlen_func with block_table
    "vllm_flash_attn": [
        ("flash_attn_varlen_func", "vllm_flash_attn/flash_attn_interface.py", "def"),
    ],
}


def _params(fn: ast.FunctionDef) -> list[dict[str, Any]]:
    a = fn.args
    out: list[dict[str, Any]] = []
    positional = [(p, "POSITIONAL_ONLY") for p in a.posonlyargs] + [(p, "POSITIONAL_OR_KEYWORD") for p in a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    for (p, kind), d in zip(positional, defaults):
        out.append({"name": p.arg, "kind": kind, "default": None if d is None else ast.unparse(d)})
    if a.vararg is not None:
        out.append({"name": a.vararg.arg, "kind": "VAR_POSITIONAL", "default": None})
    for p, kd in zip(a.kwonlyargs, a.kw_defaults):
        out.append({"name": p.arg, "kind": "KEYWORD_ONLY", "default": None if kd is None else ast.unparse(kd)})
    if a.kwarg is not None:
        out.append({"name": a.kwarg.arg, "kind": "VAR_KEYWORD", "default": None})
    return out


def _find(tree: ast.Module, qualname: str) -> ast.FunctionDef:
    """The last definition of the name (an @overload's stubs come before the implementation)."""
    *owner, name = qualname.split(".")
    body: list[ast.stmt] = tree.body
    for cls_name in owner:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls_name)
    defs = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    if not defs:
        raise LookupError(f"no def {qualname}")
    return defs[-1]


def read(source: str, qualname: str, how: str) -> list[dict[str, Any]]:
    tree = ast.parse(source)
    params = _params(_find(tree, qualname))
    if how == "plan+_plan_impl":
        impl = _params(_find(tree, qualname.rsplit(".", 1)[0] + "._plan_impl"))
        named = [p for p in params if p["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD")]
        params = named + [p for p in impl if p["kind"] == "KEYWORD_ONLY"]
    return params


def _member(archive: Path, inner: str) -> str:
    if archive.is_dir():
        return (archive / inner).read_text()
    if archive.suffix == ".whl":
        with zipfile.ZipFile(archive) as z:
            return z.read(inner).decode()
    with tarfile.open(archive) as t:  # an sdist: <name>-<version>/<inner>
        member = next(m for m in t.getmembers() if m.name.split("/", 1)[-1] == inner)
        f = t.extractfile(member)
        assert f is not None
        return f.read().decode()


def library(name: str, archive: Path, version: str, source: str) -> dict[str, Any]:
    return {
        "version": version,
        "source": source,
        "functions": {q: {"file": f, "params": read(_member(archive, f), q, how)} for q, f, how in WANTED[name]},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--flashinfer", type=Path, required=True, help="flashinfer_python-<v>-py3-none-any.whl")
    p.add_argument("--flash-attn", type=Path, required=True, help="flash_attn-<v>.tar.gz (the sdist)")
    p.add_argument("--vllm-flash-attn", type=Path, required=True, help="a checkout of vllm-project/flash-attention")
    p.add_argument("--vllm-flash-attn-rev", help="its commit (default: git rev-parse HEAD there)")
    args = p.parse_args()
    fi_version = args.flashinfer.name.split("-")[1]
    fa_version = args.flash_attn.name.removeprefix("flash_attn-").removesuffix(".tar.gz")
    rev = args.vllm_flash_attn_rev or subprocess.run(
        ["git", "-C", str(args.vllm_flash_attn), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    fixture = {
        "flashinfer": library("flashinfer", args.flashinfer, fi_version,
                              f"PyPI wheel {args.flashinfer.name} (pip download flashinfer-python=={fi_version})"),
        "flash_attn": library("flash_attn", args.flash_attn, fa_version,
                              f"PyPI sdist {args.flash_attn.name} (pip download flash-attn=={fa_version})"),
        "vllm_flash_attn": library("vllm_flash_attn", args.vllm_flash_attn, f"git {rev}",
                                   f"github.com/vllm-project/flash-attention at {rev} (the vllm_flash_attn vLLM builds)"),
    }  # fmt: skip
    FIXTURE.write_text(json.dumps(fixture, indent=1) + "\n")
    print(f"wrote {FIXTURE}")


if __name__ == "__main__":
    main()
