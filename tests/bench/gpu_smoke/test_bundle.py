"""bench/gpu_smoke/bundle.py: what the trimmed FlashInfer keeps, and the size sum. No download."""

from __future__ import annotations

import io
import lzma
import stat
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

from bench.gpu_smoke import bundle


@pytest.mark.parametrize(
    ("name", "kept"),
    [
        ("flashinfer/__init__.py", True),
        ("flashinfer/jit/attention/modules.py", True),
        ("flashinfer/data/include/flashinfer/attention/prefill.cuh", True),
        ("flashinfer/data/cutlass/include/cute/tensor.hpp", True),
        ("flashinfer/data/cccl/libcudacxx/include/cuda/std/tuple", True),
        ("flashinfer/data/spdlog/include/spdlog/spdlog.h", True),
        ("flashinfer/data/cccl/thrust/thrust/sort.h", False),  # no attention source reaches it
        ("flashinfer/data/cccl/cub/cub/cub.cuh", False),
        ("flashinfer/data/csrc/batch_prefill.cu", True),  # the prefill JIT's sources sit at csrc's top
        ("flashinfer/data/csrc/batch_prefill_paged_sm90_kernel_inst.jinja", True),
        ("flashinfer/data/csrc/batch_decode.cu", True),
        ("flashinfer/data/csrc/tvm_ffi_utils.h", True),  # a header the sources include
        ("flashinfer/data/csrc/fused_moe/moe_kernels.cu", False),  # another kernel's folder
        ("flashinfer/data/csrc/bmm_fp8.cu", False),  # another kernel, at the top level
        ("flashinfer/data/build_backend.py", True),
        ("flashinfer/some_kernel.cu", False),  # sources outside data/
        ("flashinfer/__pycache__/x.cpython-312.pyc", False),
        ("flashinfer_python-0.7.4.dist-info/METADATA", True),
        ("flashinfer_python-0.7.4.dist-info/RECORD", False),  # lists files the trim dropped
        ("other/thing.py", False),
    ],
)
def test_the_trim_keeps_the_jit_sources_and_drops_other_kernels(name: str, kept: bool) -> None:
    assert bundle.keep(name) is kept


def test_the_trimmed_tarball_is_the_same_bytes_for_the_same_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("flashinfer/__init__.py", "x = 1\n")
        z.writestr("flashinfer/data/csrc/batch_prefill.cu", "// a\n")
        z.writestr("flashinfer/data/csrc/moe/b.cu", "// b\n")
    a, b = tmp_path / "a.tar.xz", tmp_path / "b.tar.xz"
    assert bundle.trim(wheel, a) == 2 and bundle.trim(wheel, b) == 2
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(a.read_bytes()))) as tar:
        assert tar.getnames() == ["flashinfer/__init__.py", "flashinfer/data/csrc/batch_prefill.cu"]


def test_a_repacked_wheel_is_the_same_wheel_lzma_compressed_and_pip_installs_it(tmp_path: Path) -> None:
    wheel = tmp_path / "dl" / "demo_pkg-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    record = "demo_pkg/__init__.py,,\ndemo_pkg/lib.so,,\ndemo_pkg-1.0.dist-info/METADATA,,\n"
    members = {
        "demo_pkg/__init__.py": b"ANSWER = 42\n",
        "demo_pkg/lib.so": bytes(range(256)) * 64,  # a stand-in binary, executable
        "demo_pkg-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.0\n",
        "demo_pkg-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        "demo_pkg-1.0.dist-info/RECORD": (
            record + "demo_pkg-1.0.dist-info/WHEEL,,\ndemo_pkg-1.0.dist-info/RECORD,,\n"
        ).encode(),
    }
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            info = zipfile.ZipInfo(name, (2026, 12, 6, 12, 0, 0))
            info.external_attr = (stat.S_IFREG | (0o755 if name.endswith(".so") else 0o644)) << 16
            z.writestr(info, data, zipfile.ZIP_DEFLATED)
    a, b = tmp_path / "a" / wheel.name, tmp_path / "b" / wheel.name
    for out in (a, b):
        out.parent.mkdir()
        bundle.repack(wheel, out)
    assert a.read_bytes() == b.read_bytes()  # the same wheel, the same bytes
    with zipfile.ZipFile(wheel) as original, zipfile.ZipFile(a) as packed:
        assert [i.filename for i in packed.infolist()] == [i.filename for i in original.infolist()]
        for o, p in zip(original.infolist(), packed.infolist(), strict=True):
            assert p.compress_type == zipfile.ZIP_LZMA
            assert (p.date_time, p.external_attr) == (o.date_time, o.external_attr)
            assert packed.read(p) == original.read(o)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                    "--target", str(site), str(a)], check=True)  # fmt: skip
    assert (site / "demo_pkg" / "__init__.py").read_bytes() == b"ANSWER = 42\n"
    assert (site / "demo_pkg" / "lib.so").stat().st_mode & 0o111  # still executable


def test_without_a_built_bundle_the_recorded_sizes_are_summed(tmp_path: Path) -> None:
    carried, measured = bundle.carried_bytes(tmp_path / "absent")
    assert (carried, measured) == (sum(c.carried for c in bundle.CARRIED), False)
    assert carried < sum(c.size for c in bundle.CARRIED)  # the wheels are carried repacked, smaller
    line, ok = bundle.size_line(tmp_path / "absent")
    assert "recorded sizes" in line and ok == (bundle.tree_bytes() + carried < bundle.CARRY_LIMIT)


def test_a_built_bundle_is_measured(tmp_path: Path) -> None:
    for c in bundle.CARRIED:
        (tmp_path / c.file).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / c.file).write_bytes(b"x" * 10)
    assert bundle.carried_bytes(tmp_path) == (10 * len(bundle.CARRIED), True)


def test_only_the_headers_the_attention_sources_reach_are_kept(tmp_path: Path) -> None:
    inc, cute = "flashinfer/data/include/flashinfer", "flashinfer/data/cutlass/include/cute"
    members = {
        "flashinfer/data/csrc/batch_prefill.cu": '#include "tvm_ffi_utils.h"\n#include <flashinfer/attention/prefill.cuh>\n',
        "flashinfer/data/csrc/tvm_ffi_utils.h": "",
        f"{inc}/attention/prefill.cuh": '#include "../utils.cuh"\n#if X\n#include <cute/tensor.hpp>\n#endif\n',
        f"{inc}/utils.cuh": "",
        f"{inc}/attention/variants.cuh": "",  # reached from a Python string only
        f"{inc}/gemm/gemm.cuh": "",  # nothing includes it
        f"{cute}/tensor.hpp": "#include CUDA_STD_HEADER(tuple)\n",
        f"{cute}/unused.hpp": "",
        "flashinfer/data/cccl/libcudacxx/include/cuda/std/tuple": "",  # kept whole, reached or not
        "flashinfer/jit/attention/variants.py": 'DECL = "#include<flashinfer/attention/variants.cuh>"\n',
    }
    wheel = tmp_path / "w.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for name, text in members.items():
            z.writestr(name, text)
    out = tmp_path / "t.tar.xz"
    bundle.trim(wheel, out)
    with tarfile.open(fileobj=io.BytesIO(lzma.decompress(out.read_bytes()))) as tar:
        names = set(tar.getnames())
    assert names == set(members) - {f"{inc}/gemm/gemm.cuh", f"{cute}/unused.hpp"}
