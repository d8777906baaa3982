"""The smoke's phases and their time caps: one deadline, SMOKE_BUDGET_S (560 s, under a
600 s device call). bench/gpu_smoke.sh reads the caps from here (`shell`), and the dry run
checks that the foreground phases' caps fit the budget (`check`).

Each phase runs under `timeout min(cap, time left - finish's cap)`; one whose time is gone is
a SKIP row. Background phases overlap the foreground (FlashInfer's JIT builds, the omni
server's start) and are bounded by the phases that wait for them; optional ones run only with
their cap left.

    python -m bench.gpu_smoke.plan shell          # CAP_<name>=seconds lines, PLANNED=...
    python -m bench.gpu_smoke.plan check [BUDGET]  # the table; exit 1 when it does not fit
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

DEFAULT_BUDGET_S = 560


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    cap: int  # seconds, at most
    what: str
    background: bool = False  # overlaps the foreground: not counted
    optional: bool = False  # only when its cap is left: not counted


PHASES = (
    Phase("setup", 30, "install the carried wheels, unpack FlashInfer, the machine's facts"),
    Phase("imports", 30, "imports.py: the server and every runner under the machine's torch"),
    Phase("fi", 330, "fi_check.py short and long: import, FA2/FA3 JIT, our backend against the reference",
          background=True),
    Phase("ckpt", 50, "the 100M checkpoint (bf16, 32k context) and the omni-tiny default"),
    Phase("omni_start", 150, "the embedded default starting on cuda:0 while graph runs", background=True),
    Phase("graph", 120, "graph_check.py: KV copy over warm-up, compiled against eager, ms per step"),
    Phase("omni", 60, "http_checks.py omni: chat with an image, 2 images, speech, its transcription"),
    Phase("pytest", 60, "the CUDA test files in one run, a row per file"),
    Phase("fi_wait", 20, "FlashInfer's rows: its builds have until the text phase is due, then stop"),
    Phase("text", 160, "the 100M model served (auto attention, compiled decode): start with its CUDA graphs, "
          "load, a ~31k-token prompt, A3"),
    Phase("probe", 50, "gpu_step_probe.py, eager decode: wall against GPU-busy", optional=True),
    Phase("finish", 10, "summary.md, rows.tsv, results.json, facts.txt, logs.tgz into $OUT"),
)  # fmt: skip
BY_NAME = {p.name: p for p in PHASES}


def planned() -> int:
    """Seconds the foreground phases may take, at their caps."""
    return sum(p.cap for p in PHASES if not p.background and not p.optional)


def summary(budget: int) -> str:
    optional = " + ".join(f"{p.name} {p.cap} s" for p in PHASES if p.optional)
    return f"phases planned {planned()} s of the {budget} s budget (+ {optional} if time is left)"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("action", choices=("shell", "check"))
    p.add_argument("budget", type=int, nargs="?", default=int(os.environ.get("SMOKE_BUDGET_S", DEFAULT_BUDGET_S)))
    a = p.parse_args(argv)
    if a.action == "shell":
        for ph in PHASES:
            print(f"CAP_{ph.name}={ph.cap}")
        print(f"PLANNED={planned()}")
        return 0
    for ph in PHASES:
        kind = "background" if ph.background else "optional" if ph.optional else ""
        print(f"  {ph.name:<11} {ph.cap:>4} s  {kind:<10} {ph.what}")
    fits = planned() <= a.budget
    print(f"{summary(a.budget)}: {'fits' if fits else 'OVER BUDGET'}")
    return 0 if fits else 1


if __name__ == "__main__":
    sys.exit(main())
