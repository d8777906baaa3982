"""The files a lent GPU machine needs and cannot fetch (it reaches no registry), in `.gpu/`.

The lent machine has torch 2.11.0+cu130, triton 3.6.0, transformers 5.17 and nvcc 13.0 and a
fixed package list (lent.py's LENT). What the project imports beyond it travels as wheels for
CPython 3.12 on manylinux x86_64, each repacked with LZMA (repack(): 10 MiB less, av's
libraries most), and FlashInfer as a trimmed tarball: its wheel alone (101 MB)
is over the device call's carry limit (64 MiB, the tracked tree included). The trim keeps
every Python and resource file, cccl's libcudacxx and spdlog whole, of data/csrc the top
level's headers and attention sources (the FA2/FA3 prefill and decode kernels', by name:
CSRC_KEPT), and of data/include and cutlass the headers those sources (and the ones the Python
side generates) reach through their #includes (reached()). It drops the other kernels' sources
(the rest of data/csrc, *.cu outside data/), cccl's cub and thrust, and unreached headers.

    python -m bench.gpu_smoke.bundle build [--dest .gpu]   # pip download + trim, once (a few minutes)
    python -m bench.gpu_smoke.bundle size  [--dest .gpu]   # tree + carried bytes against the limit

`size` measures the built bundle, or, where none is built, adds up the sizes recorded below (a
CI run does not download 140 MB to learn them) and says which it did.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import lzma
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_DEST = ROOT / ".gpu"
CARRY_LIMIT = 64 << 20  # the device tool's carry: tracked tree + carried paths
MIB = 1 << 20


@dataclass(frozen=True, slots=True)
class Carried:
    requirement: str  # what pip downloads
    file: str  # its path under the bundle
    size: int  # bytes as downloaded (2026-12-06)
    sha256: str  # of the download
    why: str
    packed: int = 0  # bytes carried, once repacked (repack()); 0: carried as downloaded

    @property
    def carried(self) -> int:
        return self.packed or self.size


WHEELS = (
    Carried("av==19.0.2", "whl/av-19.0.2-cp312-abi3-manylinux_2_28_x86_64.whl", 34_990_159,
            "9c1da7aad0fa6c13b4a5c1e7985be0d13f8526a96284573acaf3d55ead6d3fe8",
            "omni/shared/media: imported by the server and every worker", packed=26_088_671),
    Carried("llguidance==1.6.1", "whl/llguidance-1.6.1-cp39-abi3-manylinux_2_28_x86_64.whl", 3_072_845,
            "5b8b755c1af85df8496f0d5404fc43d49220d039aa9eda22adad72c2f2acacec", "omni/text/constrained",
            packed=1_978_104),
    Carried("msgspec==0.23.0",
            "whl/msgspec-0.23.0-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.manylinux_2_28_x86_64.whl",
            236_624, "c08f294663135183bd633efd843645687285a445054a876c37506d4e9de7d80b", "omni/errors.py, the request Structs",
            packed=203_735),
    Carried("orjson==3.13.0", "whl/orjson-3.13.0-cp312-cp312-manylinux_2_17_x86_64.manylinux2014_x86_64.whl", 130_612,
            "bceadfd314bd238f584fc229a4bbaf0e573597e7a026dec5429fbf29fd66c641", "server, workers, omni-bench",
            packed=106_899),
    Carried("apache-tvm-ffi==0.1.15.post2",
            "whl/apache_tvm_ffi-0.1.15.post2-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl", 3_312_304,
            "059eed9bfc94bcd41650fb8eefde74040a1bc7e7b1a6f0a8ff897b02b118875b", "import flashinfer (jit/core.py)",
            packed=2_683_146),
)  # fmt: skip
FLASHINFER_VERSION = "0.7.4"
FLASHINFER_WHEEL = Carried(
    f"flashinfer-python=={FLASHINFER_VERSION}", f"flashinfer_python-{FLASHINFER_VERSION}-py3-none-any.whl",
    101_294_319, "a051a62e09a2738e8b0de47a1944fd2f0f3eff01b728b662141ea660cb09dd32", "downloaded, then trimmed",
)  # fmt: skip
FLASHINFER_TRIM = Carried(
    f"flashinfer-python=={FLASHINFER_VERSION} (trimmed)", f"flashinfer-{FLASHINFER_VERSION}-trim.tar.xz",
    13_871_376, "8180dd10d4e790b4759f2059139c5d19c0c770fb9bdecef3a37b249bb97506e5",
    "the attention JIT's sources and the headers they reach (xz -9e; the sha256 holds for this liblzma)",
)  # fmt: skip
CARRIED = (*WHEELS, FLASHINFER_TRIM)
PIP_PLATFORM = [
    "--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp",
    *(f"--platform={p}" for p in ("manylinux_2_28_x86_64", "manylinux_2_27_x86_64", "manylinux_2_24_x86_64",
                                  "manylinux_2_17_x86_64", "manylinux2014_x86_64")),
]  # fmt: skip
# cccl's cub and thrust (11 MB) go: no kept source reaches them through its #includes (a scan
# from the attention sources below; nvcc's own CCCL has them, should anything ask)
KEPT_DATA = ("flashinfer/data/include/", "flashinfer/data/cccl/libcudacxx/", "flashinfer/data/cutlass/",
             "flashinfer/data/spdlog/")  # fmt: skip
# data/csrc's top level: the attention JIT's sources (flashinfer/jit/attention/modules.py and
# page.py read these by name) and the headers they include; 12 MB of other kernels' sources go
CSRC_KEPT = ("batch_prefill", "batch_decode", "single_prefill", "single_decode", "batch_attention", "batch_pod",
             "pod_", "page")  # fmt: skip


def keep(name: str) -> bool:
    """Whether the trimmed FlashInfer keeps a wheel member (a path inside the wheel)."""
    if name.endswith(("/", ".pyc", "/RECORD")):
        return False
    if name.startswith("flashinfer_python-") and ".dist-info/" in name:
        return True
    if not name.startswith("flashinfer/"):
        return False
    if not name.startswith("flashinfer/data/"):
        return not name.endswith(".cu")
    if name.startswith(KEPT_DATA):
        return True
    rest = name.removeprefix("flashinfer/data/")
    if rest.startswith("csrc/"):
        file = rest.removeprefix("csrc/")
        return "/" not in file and (file.endswith((".h", ".cuh", ".hpp")) or file.startswith(CSRC_KEPT))
    return "/" not in rest  # data/*.py and the like


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


# FlashInfer's JIT include path (flashinfer/jit/env.py, cpp_ext.py), in its order
INCLUDE_DIRS = ("flashinfer/data/include", "flashinfer/data/csrc", "flashinfer/data/cutlass/include",
                "flashinfer/data/cutlass/tools/util/include", "flashinfer/data/spdlog/include",
                "flashinfer/data/cccl/libcudacxx/include")  # fmt: skip
# headers kept only when an attention source reaches them; libcudacxx and spdlog stay whole
# (cute includes libcudacxx through a macro, CUDA_STD_HEADER, that a scan cannot follow)
BY_REACH = ("flashinfer/data/include/", "flashinfer/data/cutlass/")
_INCLUDE = re.compile(rb'#\s*include\s*[<"]([^">]+)[">]')


def reached(files: dict[str, bytes]) -> set[str]:
    """The members every #include reaches, transitively, from the kept attention sources and
    the source the Python side generates (its strings' #include lines). Conditional includes
    count as taken: the scan keeps more, never less, than a build reads."""
    roots = [n for n in files if n.startswith("flashinfer/data/csrc/") or n.endswith(".py")]
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        here = name.rsplit("/", 1)[0]
        for inc in _INCLUDE.findall(files[name]):
            target = inc.decode(errors="replace")
            for d in (here, *INCLUDE_DIRS):
                candidate = posixpath.normpath(f"{d}/{target}")
                if candidate in files:
                    todo.append(candidate)
                    break
    return seen


def trim(wheel: Path, out: Path) -> int:
    """Write the trimmed tarball (members sorted, owner and mtime zeroed: the same wheel gives
    the same bytes); the number of members."""
    with zipfile.ZipFile(wheel) as z:
        files = {n: z.read(n) for n in z.namelist() if keep(n)}
    used = reached(files)
    names = sorted(n for n in files if not n.startswith(BY_REACH) or n in used)
    with lzma.open(out, "wb", preset=9 | lzma.PRESET_EXTREME) as xz, \
            tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:  # fmt: skip
        for name in names:
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(files[name]), 0o644, 0
            tar.addfile(info, io.BytesIO(files[name]))
    return len(names)


def repack(wheel: Path, out: Path) -> None:
    """The wheel again with every member LZMA-compressed, in its order, names, dates and modes:
    pip installs it and zipfile extracts it (the smoke's fallback) as the original, and av's
    shared libraries shrink by a quarter (33.4 -> 24.9 MiB). The same wheel gives the same bytes
    for one liblzma."""
    partial = out.with_suffix(".partial")
    with zipfile.ZipFile(wheel) as z, zipfile.ZipFile(partial, "w") as o:
        for member in z.infolist():
            info = zipfile.ZipInfo(member.filename, member.date_time)
            info.external_attr, info.create_system = member.external_attr, member.create_system
            info.compress_type = zipfile.ZIP_LZMA
            o.writestr(info, z.read(member))
    partial.rename(out)


def pip_download(requirements: list[str], dest: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", *PIP_PLATFORM, "-d", str(dest), *requirements],
                   check=True)  # fmt: skip


def build(dest: Path) -> dict[str, object]:
    """Download what is missing and trim FlashInfer, checking every file against its record."""
    (dest / "whl").mkdir(parents=True, exist_ok=True)
    missing = [w for w in WHEELS if not (dest / w.file).is_file() or (dest / w.file).stat().st_size != w.carried]
    if missing:
        with tempfile.TemporaryDirectory() as tmp:
            pip_download([w.requirement for w in missing], Path(tmp) / "whl")
            for w in missing:
                if sha256(Path(tmp) / w.file) != w.sha256:
                    raise SystemExit(f"{w.file}: sha256 differs from the recorded {w.sha256[:16]}")
                repack(Path(tmp) / w.file, dest / w.file)
    trimmed = dest / FLASHINFER_TRIM.file
    members = None
    if not trimmed.is_file():
        with tempfile.TemporaryDirectory() as tmp:
            pip_download([FLASHINFER_WHEEL.requirement], Path(tmp))
            wheel = Path(tmp) / FLASHINFER_WHEEL.file
            if sha256(wheel) != FLASHINFER_WHEEL.sha256:
                raise SystemExit(f"{wheel.name}: sha256 differs from the recorded {FLASHINFER_WHEEL.sha256[:16]}")
            partial = trimmed.with_suffix(".partial")
            members = trim(wheel, partial)
            partial.rename(trimmed)
    for w in WHEELS:  # each was checked as downloaded; what is carried is its repacking
        if (dest / w.file).stat().st_size != w.carried:
            raise SystemExit(f"{w.file}: {(dest / w.file).stat().st_size:,} bytes, not the recorded {w.carried:,}")
    manifest = {
        "files": {c.file: {"bytes": (dest / c.file).stat().st_size, "sha256": sha256(dest / c.file), "why": c.why}
                  for c in CARRIED},
        "flashinfer_members": members,
    }  # fmt: skip
    (dest / "MANIFEST.json").write_text(json.dumps(manifest, indent=1) + "\n")
    return manifest


def tree_bytes(root: Path = ROOT) -> int:
    """What the device tool copies besides the carried paths: tracked files and untracked ones
    git does not ignore."""
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                         check=True, capture_output=True).stdout  # fmt: skip
    return sum((root / n).stat().st_size for n in out.decode().split("\0") if n and (root / n).is_file())


def carried_bytes(dest: Path) -> tuple[int, bool]:
    """The bundle's bytes, and whether they were measured (False: the recorded sizes, no bundle here)."""
    if all((dest / c.file).is_file() for c in CARRIED):
        return sum(p.stat().st_size for p in dest.rglob("*") if p.is_file()), True
    return sum(c.carried for c in CARRIED), False


def size_line(dest: Path) -> tuple[str, bool]:
    """One line: tree + carried against the carry limit; and whether it fits."""
    tree = tree_bytes()
    carried, measured = carried_bytes(dest)
    total = tree + carried
    how = f"{dest.name}/ measured" if measured else f"recorded sizes, no {dest.name}/ built here"
    ok = total < CARRY_LIMIT
    return (f"bundle {total / MIB:.2f} MiB = tree {tree / MIB:.2f} + carried {carried / MIB:.2f} ({how}); "
            f"{'under' if ok else 'OVER'} the {CARRY_LIMIT // MIB} MiB carry limit"), ok  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("build", "size"))
    p.add_argument("--dest", type=Path, default=DEFAULT_DEST)
    a = p.parse_args(argv)
    if a.action == "build":
        if shutil.which("git") is None:
            raise SystemExit("git is needed to measure the tree")
        manifest = build(a.dest)
        for name, f in manifest["files"].items():  # type: ignore[attr-defined]
            print(f"{f['bytes']:>11,}  {f['sha256'][:16]}  {name}")
    line, ok = size_line(a.dest)
    print(line)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
