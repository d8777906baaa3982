"""Whether another thread runs during a large join: join_str against the plain "".join.

A thread waits for the GIL while this one joins 48 MB; the switch interval is made longer than
any copy, so it can run during the join only if the join lets go of the GIL itself. The plain
join never does; join_str copies with the GIL released, so the other thread runs as soon as the
OS gives it a core (on a loaded machine, not within every copy). Printed: in how many of the
tries it ran during each join. tests/omni/shared/test_gil_free.py checks the deterministic
half (the plain join holds the GIL; every byte of join_str's copy goes through a foreign call).

    .venv/bin/python bench/gil_free_join.py --tries 20
"""

from __future__ import annotations

import argparse
import sys
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from omni.shared.gil_free import join_str  # noqa: E402

PIECE = "All work and no play makes Jack a dull boy. " * ((1 << 20) // 44)


def ran_during(join: Callable[[list[str]], str], pieces: list[str]) -> bool:
    go = threading.Event()
    state = {"joining": True, "ran_during": False}

    def other() -> None:
        go.wait()
        state["ran_during"] = state["joining"]

    thread = threading.Thread(target=other)
    thread.start()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        go.set()  # the other thread now wants the GIL, which this one holds
        join(pieces)
        state["joining"] = False
    finally:
        sys.setswitchinterval(interval)
    thread.join()
    return state["ran_during"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tries", type=int, default=10)
    args = parser.parse_args()
    pieces = [PIECE for _ in range(48)]
    for name, join in (('"".join', "".join), ("join_str", join_str)):
        ran = sum(ran_during(join, pieces) for _ in range(args.tries))
        print(f"{name}: the other thread ran during {ran} of {args.tries} joins")


if __name__ == "__main__":
    main()
