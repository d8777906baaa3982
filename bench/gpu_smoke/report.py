"""The smoke's rows from its checks' outputs (rows.tsv: check, status, figures, notes).

  report.py pytest XML ROWS FILE...   a row per CUDA test file from pytest's JUnit XML
  report.py bench LABEL JSON ROWS     an omni-bench summary as a row
  report.py results DIR OUT           every JSON in DIR as one results.json
"""

from __future__ import annotations

import collections
import glob
import json
import os
import sys
import xml.etree.ElementTree as ET


def add(rows: str, *cells: str) -> None:
    line = "\t".join(c.replace("\t", " ").replace("\n", " ").replace("|", "/") for c in cells)
    with open(rows, "a") as f:
        f.write(line + "\n")
    print(line)


def test_file(case: ET.Element, files: list[str]) -> str:
    """The test file a JUnit testcase came from (xunit2 names its module in classname)."""
    classname = case.get("classname", "")
    for f in files:
        module = f.removesuffix(".py").replace("/", ".")
        if classname == module or classname.startswith(module + "."):
            return f
    return classname or "(collection)"


def pytest_rows(xml: str, rows: str, files: list[str]) -> None:
    counts: dict[str, collections.Counter[str]] = {f: collections.Counter() for f in files}
    first: dict[str, str] = {}
    for case in ET.parse(xml).iter("testcase"):
        f = test_file(case, files)
        outcome = next((c for c in case if c.tag in ("failure", "error", "skipped")), None)
        kind = "passed" if outcome is None else {"failure": "failed"}.get(outcome.tag, outcome.tag)
        counts.setdefault(f, collections.Counter())[kind] += 1
        if outcome is not None and kind in ("failed", "error"):
            first.setdefault(f, f"{case.get('name')}: {outcome.get('message', '')}"[:160])
    for f, c in counts.items():
        status = "FAIL" if c["failed"] or c["error"] else "ok" if c["passed"] else "SKIP"
        figures = ", ".join(f"{n} {k}" for k, n in sorted(c.items())) or "nothing selected"
        add(rows, f"CUDA tests: {f.removeprefix('tests/')}", status, figures, first.get(f, ""))


def bench_row(label: str, path: str, rows: str) -> None:
    with open(path) as f:
        s = json.load(f)["summary"]

    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1e3 * x:.1f}"

    ok = s["num_errors"] == 0 and not s["timed_out"]
    add(rows, label, "ok" if ok else "FAIL",
        f"{s['output_throughput']:.0f} tok/s out, {s['input_throughput']:.0f} in; TTFT p50 {ms(s['ttft']['p50'])} ms; "
        f"TPOT p50 {ms(s['tpot']['p50'])} ms",
        f"{s['num_completed']}/{s['num_requests']} done, prefix hits {s['prefix_cache_hit_rate'] or 0:.0%}, "
        f"errors {dict(list(s['errors'].items())[:2])}")  # fmt: skip


def results(directory: str, out: str) -> None:
    res: dict[str, object] = {}
    for p in sorted(glob.glob(os.path.join(directory, "*.json"))):
        try:
            with open(p) as f:
                res[os.path.basename(p)] = json.load(f)
        except Exception as e:  # noqa: BLE001 - a half-written JSON is reported, not fatal
            res[os.path.basename(p)] = f"unreadable: {e}"
    with open(out, "w") as f:
        json.dump(res, f, indent=1)


def main(argv: list[str]) -> int:
    what, args = argv[0], argv[1:]
    if what == "pytest":
        pytest_rows(args[0], args[1], args[2:])
    elif what == "bench":
        bench_row(*args)
    elif what == "results":
        results(*args)
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
