"""The soak's prefix reuse on an earlier commit's code: the baseline rows of `compression_bench.py reuse --before`.

Run by the bench in a child process whose import path starts with that commit's tree (extracted
with `git archive`): its own `taskweaver_lite` and `tests/soak_session.py` drive the soak at
(1, 1) under each fold schedule, and this tree's `prefix_ledger.py` counts it. Prints one JSON
object per schedule and window.

    python bench/reuse_before.py TREE ROUNDS RESERVE SCHEDULES WINDOW...   (RESERVE: tokens or "default"; SCHEDULES: rounds,pressure)
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any


def main() -> None:
    tree, rounds = Path(sys.argv[1]), int(sys.argv[2])
    reserve = None if sys.argv[3] == "default" else int(sys.argv[3])
    schedules, windows = sys.argv[4].split(","), [int(w) for w in sys.argv[5:]]
    sys.path[:0] = [str(tree), str(tree / "tests")]
    import soak_session as soak
    from prefix_ledger import PrefixLedger, as_messages

    import taskweaver_lite
    from taskweaver_lite.llm.tokens import get_tokenizer

    if not str(taskweaver_lite.__file__).startswith(str(tree)):
        raise SystemExit(f"the earlier tree's package was not the one imported: {taskweaver_lite.__file__}")
    for schedule in schedules:
        role = {"fold_schedule": schedule}
        settings: dict[str, dict[str, Any]] = {"llm": {"reply_reserve": reserve}, "planner": role, "code_generator": role}
        for window in windows:
            with tempfile.TemporaryDirectory() as root:
                run = soak.run_soak(Path(root), rounds=rounds, window=window, settings=settings)
            ledger = PrefixLedger(get_tokenizer())
            for request in run.requests:
                ledger.add(_purpose(request), as_messages(request.messages))
            tallies = {name: vars(tally) for name, tally in ledger.tallies.items()}
            over = len(soak.overflows(run.requests, window=window))
            print(json.dumps({"schedule": schedule, "window": window, "tallies": tallies, "fold_calls": soak.fold_calls(run), "over": over}))


def _purpose(request: object) -> str:
    """An earlier client's fold is told by its instructions (its system message names the role it folds)."""
    role = str(getattr(request, "role", ""))
    if role != "compression":
        return role
    system = str(getattr(request, "messages", [{}])[0].get("content", ""))
    return "compression_code_generator" if "CodeGenerator" in system else "compression_planner"


if __name__ == "__main__":
    main()
