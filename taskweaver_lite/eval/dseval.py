"""Scoring a DSEval problem set in one session: each question asked in turn, checked against its reference solution.

The set's data folder is copied to the working folder as `inputs/`. Context sections run in both
the user's namespace and a reference namespace of their own; for each question, the agent answers,
then the reference code runs beside it and DSEval's validators compare: `crash` (the round's last
cell ran without error), `namespace_intact` (the agent changed or deleted no variable the reference
left alone), `result` (the value the agent's last cell showed equals the reference's), and
`namespace_check` (named variables equal the reference's). A question whose checks include
others (`table_test`, `model`, `stream`), or whose reference solution fails here (a package it
needs is not installed), is asked but not scored, and the report says so.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.eval.cases import SUPPORTED_VALIDATORS, Problem, ProblemSet
from taskweaver_lite.eval.outcome import PointResult
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.session.session import Session


class SetupFailed(TaskWeaverError):
    """The problem set's own code failed (a context section, a reference solution): the set is at fault, not the agent."""


def run_problem_set(problems: ProblemSet, *, session: Session, before_question: Callable[[], None] = lambda: None) -> tuple[PointResult, ...]:
    """Ask every question of the set in `session` and check each answer (`before_question` may raise to stop)."""
    if problems.data_dir is not None:
        shutil.copytree(problems.data_dir, session.working_dir / "inputs", dirs_exist_ok=True)
    results = []
    for problem in problems.problems:
        if problem.question is None:
            _run(session, f"_twl_eval.problems.context({problem.reference_code!r})", what="a context section")
        else:
            before_question()
            results.append(_answer(problem, problem.question, session=session))
    return tuple(results)


def _answer(problem: Problem, question: str, *, session: Session) -> PointResult:
    """One question: the agent answers, the validators judge."""
    _run(session, "_twl_eval.problems.begin()", what="the namespace snapshot")
    rnd = session.ask(question)
    unsupported = sorted(set(problem.validator) - SUPPORTED_VALIDATORS)
    crashed, why = _crash(rnd)
    cell = f"_twl_eval.problems.judge({problem.reference_code!r}, {json.dumps(dict(problem.validator))!r}, {crashed!r}, {why!r})"
    try:
        output = _run(session, cell, what="the reference solution")
    except SetupFailed as exc:  # a package the reference needs is missing here, say: this question only
        return PointResult(question, 0.0, False, f"not scored: {exc}", by="dseval")
    verdict = json.loads(output.strip().splitlines()[-1])
    if unsupported:
        return PointResult(question, 0.0, False, f"not scored: validator {', '.join(unsupported)} is not supported", by="dseval")
    return PointResult(question, 1.0, bool(verdict["correct"]), "; ".join(verdict["reasons"]), by="dseval")


def _crash(rnd: Round) -> tuple[bool, str]:
    """Whether the agent's work on a question crashed: the round failed, or its last cell did."""
    if rnd.state == "failed":
        return (True, rnd.error or "the round failed")
    cells = [post.execution for post in rnd.posts if post.execution is not None]
    if cells and not cells[-1].success:
        error = cells[-1].error
        return (True, f"{error.name}: {error.value}" if error else "the last cell failed")
    return (False, "")


def _run(session: Session, cell: str, *, what: str) -> str:
    """Run one of our cells in the session's kernel; its stdout, or SetupFailed naming `what` failed."""
    result = session.executor.run(cell)
    if not result.success:
        error = result.error
        detail = f"{error.name}: {error.value}" if error is not None else (result.refused or "it did not finish")
        raise SetupFailed(f"{what} failed in the kernel: {detail}")
    return result.stdout
