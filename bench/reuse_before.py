"""The soak's prefix reuse on an earlier commit's code: the baseline row of `compression_bench.py reuse --before`.

Run by the bench in a child process whose import path starts with that commit's tree (extracted
with `git archive`): its own `taskweaver_lite` and `tests/soak_session.py` drive the soak at
(1, 1), and this tree's `prefix_ledger.py` counts it. Prints one JSON object per window.

    python bench/reuse_before.py TREE ROUNDS WINDOW...
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path


def main() -> None:
    tree, rounds, windows = Path(sys.argv[1]), int(sys.argv[2]), [int(w) for w in sys.argv[3:]]
    sys.path[:0] = [str(tree), str(tree / "tests")]
    import soak_session as soak
    from prefix_ledger import PrefixLedger, as_messages

    import taskweaver_lite
    from taskweaver_lite.llm.tokens import get_tokenizer

    if not str(taskweaver_lite.__file__).startswith(str(tree)):
        raise SystemExit(f"the earlier tree's package was not the one imported: {taskweaver_lite.__file__}")
    for window in windows:
        with tempfile.TemporaryDirectory() as root:
            run = soak.run_soak(Path(root), rounds=rounds, window=window)
        ledger = PrefixLedger(get_tokenizer())
        for request in run.requests:
            ledger.add(_purpose(request), as_messages(request.messages))
        tallies = {role: vars(tally) for role, tally in ledger.tallies.items()}
        print(json.dumps({"window": window, "tallies": tallies, "fold_calls": soak.fold_calls(run), "over": len(soak.overflows(run.requests, window=window))}))


def _purpose(request: object) -> str:
    """An earlier client sends no cache key: a fold's role is read from its instructions."""
    role = str(getattr(request, "role", ""))
    if role != "compression":
        return role
    system = str(getattr(request, "messages", [{}])[0].get("content", ""))
    return "compression_code_generator" if "CodeGenerator" in system else "compression_planner"


if __name__ == "__main__":
    main()
