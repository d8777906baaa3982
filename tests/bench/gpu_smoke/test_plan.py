"""bench/gpu_smoke/plan.py: the phases fit the budget, and the smoke script names only phases
the plan has."""

from __future__ import annotations

import re
from pathlib import Path

from bench.gpu_smoke import plan

SCRIPT = Path(__file__).resolve().parents[3] / "bench" / "gpu_smoke.sh"


def test_the_foreground_phases_fit_the_default_budget() -> None:
    assert plan.planned() == sum(p.cap for p in plan.PHASES if not (p.background or p.optional))
    assert plan.planned() <= plan.DEFAULT_BUDGET_S
    assert plan.main(["check", str(plan.DEFAULT_BUDGET_S)]) == 0
    assert plan.main(["check", str(plan.planned() - 1)]) == 1


def test_the_script_reads_caps_of_phases_the_plan_has() -> None:
    text = SCRIPT.read_text()
    calls = re.findall(r"\$\(cap ([a-z_]+)\)|\bdue ([a-z_]+)|CAP_([a-z_]+)", text)
    used = {name for groups in calls for name in groups if name}
    assert used and used <= set(plan.BY_NAME)


def test_shell_lines_are_assignments(capsys) -> None:  # type: ignore[no-untyped-def]
    plan.main(["shell"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1] == f"PLANNED={plan.planned()}"
    assert all(re.fullmatch(r"[A-Z]+_?[a-z_]*=\d+", x) for x in lines)
