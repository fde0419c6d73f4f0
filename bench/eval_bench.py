"""The evaluation harness's own cost per round, against a bare session given the same requests.

Both sides run the same session (real kernel, the openai SDK over HTTP to the scripted model of the
shipped cases, compression on): the bare side calls `Session.ask` with the running-sum requests in
a loop; the harness side lets the examiner (`eval.examiner`) send them through `examine`. On the
harness side the time inside `Session.ask` and inside the examiner's model call (a model's time,
not the harness's) are clocked, and the rest of the loop is the harness's own:

    harness's own cost = (examine loop - its asks - its examiner calls) / rounds / bare round   (target <= 5%)

Clocking the harness's own time directly keeps it apart from this shared machine's noise, which
moves whole rounds by more than the target (the end-to-end ratio is printed too). Runs alternate
(bare, harness, bare, ...); medians over them.

    python bench/eval_bench.py [--rounds 40] [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.eval.examiner import examine
from taskweaver_lite.llm.client import MeteredModel, ModelDefaults, OpenAIChatModel
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.eval_script import scripted_eval_server

TASK = "The total sum starts at 0. From round 1 to round {n}, ask the agent to add the current round number to the total sum."


def bare(project: Path, overrides: list[str], rounds: int) -> float:
    """Seconds per round of `Session.ask` with the examiner's requests, sent by a plain loop."""
    with open_session(load_config(project, overrides)) as session:
        session.executor.run("pass")  # the kernel is up before the clock starts
        started = time.perf_counter()
        for number in range(1, rounds + 1):
            session.ask(f"Round {number}: add {number} to the total sum and tell me the sum.")
        return (time.perf_counter() - started) / rounds


def harness(project: Path, overrides: list[str], rounds: int) -> tuple[float, float, float]:
    """Seconds per round through the examiner loop; of those, the examiner model's, and the harness's own."""
    config = load_config(project, overrides)
    examiner = MeteredModel(OpenAIChatModel(config.llm.model_copy(update={"structured": "off"})))
    calls: list[float] = []
    timed = _Timed(examiner, calls)
    asking: list[float] = []
    with open_session(config) as session:

        def ask(request: str) -> str:
            started = time.perf_counter()
            try:
                return session.ask(request).answer or ""
            finally:
                asking.append(time.perf_counter() - started)

        session.executor.run("pass")
        started = time.perf_counter()
        transcript = examine(TASK.format(n=rounds), model=timed, ask=ask, max_rounds=rounds)
        elapsed = time.perf_counter() - started
    assert transcript.rounds == rounds, transcript.rounds
    # The examiner is asked once more than there are rounds (its last reply is the stop word).
    return elapsed / rounds, sum(calls) / rounds, (elapsed - sum(asking) - sum(calls)) / rounds


class _Timed(ModelDefaults):
    """A chat model whose calls' wall times are collected."""

    def __init__(self, inner: MeteredModel, calls: list[float]) -> None:
        self.inner, self.calls = inner, calls

    def complete(self, messages, *, purpose, max_tokens=None, on_delta=None, schema=None):  # the ChatModel signature, as MeteredModel has it
        started = time.perf_counter()
        try:
            return self.inner.complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)
        finally:
            self.calls.append(time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with scripted_eval_server() as server, tempfile.TemporaryDirectory() as folder:
        project = Path(shutil.copytree(bundled_project(), Path(folder) / "project", ignore=shutil.ignore_patterns("sessions", "*.db*")))
        overrides = [f"llm.api_base={server.url}", "llm.api_key=bench", "llm.model=scripted", f"store.path={folder}/bench.db"]
        bares, harnesses, examiners, owns = [], [], [], []
        for _ in range(args.runs):
            bares.append(bare(project, overrides, args.rounds))
            per_round, examiner, own = harness(project, overrides, args.rounds)
            harnesses.append(per_round)
            examiners.append(examiner)
            owns.append(own)
    b, h, e, o = (statistics.median(values) for values in (bares, harnesses, examiners, owns))
    print(f"{args.rounds} rounds, {args.runs} runs each, medians (range over runs)")
    print(f"bare session round:              {b * 1000:7.2f} ms ({min(bares) * 1000:.2f}-{max(bares) * 1000:.2f})")
    print(f"harness round, end to end:       {h * 1000:7.2f} ms ({min(harnesses) * 1000:.2f}-{max(harnesses) * 1000:.2f}), {h / b:.3f}x")
    print(f"  of which the examiner's call:  {e * 1000:7.2f} ms")
    print(f"  of which the harness's own:    {o * 1000:7.3f} ms ({min(owns) * 1000:.3f}-{max(owns) * 1000:.3f})")
    print(f"harness's own cost per round: {o / b:.2%} of a bare round (target <= 5%)")


if __name__ == "__main__":
    main()
