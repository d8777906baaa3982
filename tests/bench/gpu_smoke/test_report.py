"""bench/gpu_smoke/report.py: a row per CUDA test file from pytest's JUnit XML."""

from __future__ import annotations

from pathlib import Path

from bench.gpu_smoke import report

XML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.gpu_workers.test_staging" name="test_a[cuda]"/>
<testcase classname="tests.gpu_workers.test_staging" name="test_b"><skipped message="needs CUDA"/></testcase>
<testcase classname="tests.gpu_workers.attention.test_backends" name="test_c[flashinfer]">
<failure message="CacheContractError: head_dim 16">...</failure></testcase>
</testsuite></testsuites>"""


def test_each_file_gets_its_counts_and_first_failure(tmp_path: Path) -> None:
    xml, rows = tmp_path / "p.xml", tmp_path / "rows.tsv"
    xml.write_text(XML)
    files = ["tests/gpu_workers/test_staging.py", "tests/gpu_workers/attention/test_backends.py",
             "tests/gpu_workers/test_other.py"]  # fmt: skip
    report.pytest_rows(str(xml), str(rows), files)
    assert [line.split("\t") for line in rows.read_text().splitlines()] == [
        ["CUDA tests: gpu_workers/test_staging.py", "ok", "1 passed, 1 skipped", ""],
        ["CUDA tests: gpu_workers/attention/test_backends.py", "FAIL", "1 failed",
         "test_c[flashinfer]: CacheContractError: head_dim 16"],
        ["CUDA tests: gpu_workers/test_other.py", "SKIP", "nothing selected", ""],
    ]  # fmt: skip
