"""Replies held to their schema on a real model: `json_object` against `json_schema`, side by side in one run.

SmolLM2-135M-Instruct on llama.cpp's own server (`.ci/llama-server.sh`, `.ci/smollm2.sh`) writes every
reply of a chat of three requests on the bundled sample data (`tests/real_chat.py`: the bundled
project as shipped, its few-shot examples included, the real Session, client and kernel), once with
`llm.structured: json_object` (any JSON object: the older JSON mode, the baseline) and once with
`json_schema` (each role's schema, which the server turns into a grammar). Per setting: repair turns
and requests failed on their format, each per request, the cells that reached the kernel, and the
time. The server samples as it does by default (unseeded), so `--runs` repeats the pair.

Run: .venv/bin/python bench/structured_bench.py [--runs 1]   (tens of minutes on two cores; needs a kernel)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from taskweaver_lite.testing.llama_server import built_server, llama_server, missing, smollm2

SETTINGS = ("json_object", "json_schema")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1, help="chats per setting (the model samples: more runs, steadier figures)")
    args = parser.parse_args()
    binary, model = built_server(), smollm2()
    if binary is None or model is None:
        sys.exit(missing())
    import real_chat  # from tests/, put on sys.path above

    totals = {setting: {"requests": 0, "repairs": 0, "failed": 0, "other": 0, "cells": 0, "seconds": 0.0} for setting in SETTINGS}
    with llama_server(binary, model, slots=2) as server, tempfile.TemporaryDirectory() as scratch:
        for run in range(1, args.runs + 1):
            for setting in SETTINGS:
                project = real_chat.sample_project(Path(scratch) / f"{setting}-{run}", server, structured=setting)
                chat = real_chat.run_chat(project)
                total = totals[setting]
                total["requests"] += len(chat.rounds)
                total["repairs"] += chat.repair_turns
                total["failed"] += len(chat.format_and_cut_off)  # the repair turns used up: a broken format, or replies cut off
                total["other"] += len(chat.other_failures)
                total["cells"] += chat.cells
                total["seconds"] += chat.seconds
                print(
                    f"run {run} {setting:<11} repair turns {chat.repair_turns}, failed on format {len(chat.format_failures)}"
                    f" or cut off {len(chat.cut_off_failures)} of {len(chat.rounds)}, "
                    f"other failures {len(chat.other_failures)}, cells run {chat.cells}, {chat.seconds:.0f} s",
                    flush=True,
                )
    print(f"\nSmolLM2-135M-Instruct (Q4_1) on llama-server, {args.runs} chat(s) of {len(real_chat.REQUESTS)} requests per setting")
    print(f"{'llm.structured':<14} {'requests':>8} {'repairs/request':>16} {'failed/request':>15} {'cells':>6} {'s/request':>10}")
    for setting, total in totals.items():
        requests = max(1, int(total["requests"]))
        print(
            f"{setting:<14} {int(total['requests']):>8} {total['repairs'] / requests:>16.2f} {total['failed'] / requests:>15.2f} "
            f"{int(total['cells']):>6} {total['seconds'] / requests:>10.0f}"
        )
    base, new = totals["json_object"], totals["json_schema"]
    print(
        f"\njson_schema against json_object: failed requests {int(new['failed'])} against {int(base['failed'])}, "
        f"repair turns {int(new['repairs'])} against {int(base['repairs'])} "
        f"(ratio {new['repairs'] / base['repairs']:.2f})"
        if base["repairs"]
        else ""
    )


if __name__ == "__main__":
    main()
