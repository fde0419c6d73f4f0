"""Marking a TaskWeaver case's scoring points: `eval_code` asserts run in the session's kernel, the rest by the judge model.

A point's weight counts when it is hit; the score is the weights hit over all weights. The judge
answers {"reason", "is_hit": "yes"|"no"} (a bare yes or no is taken too); anything else is not a
verdict, and the case is marked with that reason rather than guessed at.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from taskweaver_lite.errors import ReplyFormatError, TaskWeaverError
from taskweaver_lite.eval.cases import ScoringPoint
from taskweaver_lite.eval.examiner import Transcript
from taskweaver_lite.eval.outcome import PointResult
from taskweaver_lite.kernel.interface import Executor
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.llm.replies import FieldSpec, ReplySchema, extract_json
from taskweaver_lite.llm.templates import load_prompt

# What the judge's prompt asks for: where the endpoint constrains replies (llm.structured), it cannot answer otherwise.
VERDICT_SCHEMA = ReplySchema(name="Verdict", wrapper=None, fields={"reason": FieldSpec(), "is_hit": FieldSpec(choices=("yes", "no"))})


class NotAVerdict(Exception):
    """The judge's reply says neither yes nor no."""


class JudgeFailed(TaskWeaverError):
    """The judge's model failed (unreachable, the conversation too long for it): the run has no score."""


@dataclass(frozen=True)
class Verdict:
    """The judge's answer for one statement."""

    hit: bool
    reason: str


def mark(points: Sequence[ScoringPoint], *, task_description: str, transcript: Transcript, judge: ChatModel, executor: Executor) -> tuple[PointResult, ...]:
    """Every point marked in order; NotAVerdict for a judge reply that is none."""
    results = []
    for number, point in enumerate(points, 1):
        if point.eval_code is not None:
            results.append(run_eval_code(point, transcript=transcript, executor=executor))
            continue
        try:
            verdict = ask_judge(judge, task_description=task_description, transcript=transcript, statement=point.score_point)
        except NotAVerdict as exc:
            raise NotAVerdict(f"the judge's reply on scoring point {number} is not a verdict: {exc}") from None
        results.append(PointResult(point.score_point, point.weight, verdict.hit, verdict.reason, by="judge"))
    return tuple(results)


def run_eval_code(point: ScoringPoint, *, transcript: Transcript, executor: Executor) -> PointResult:
    """Run the point's `eval_code` in the session's kernel (its working folder, its sandbox): hit when nothing is raised."""
    cell = f"_twl_eval.run_eval_code({point.eval_code!r}, {transcript.records_json()!r})"
    result = executor.run(cell)
    if result.success:
        return PointResult(point.score_point, point.weight, True, "", by="eval_code")
    error = result.error
    why = f"{error.name}: {error.value}" if error is not None else (result.refused or result.stderr or "the cell did not finish")
    return PointResult(point.score_point, point.weight, False, why.strip()[:500], by="eval_code")


def ask_judge(judge: ChatModel, *, task_description: str, transcript: Transcript, statement: str) -> Verdict:
    """One statement put to the judge model."""
    prompt = load_prompt("eval_judge")
    user = prompt.render("user", task_description=task_description, conversation=transcript.conversation_json(), statement=statement)
    try:
        reply = judge.complete(
            [{"role": "system", "content": prompt.render("system")}, {"role": "user", "content": user}], purpose="judge", schema=VERDICT_SCHEMA
        ).text
    except TaskWeaverError as exc:
        raise JudgeFailed(f"the judge's model failed: {exc}") from exc
    return read_verdict(reply)


def read_verdict(reply: str) -> Verdict:
    """A verdict from the judge's reply: its JSON's is_hit, or a bare yes/no; NotAVerdict otherwise."""
    bare = reply.strip().strip(".!\"'`").lower()
    if bare in ("yes", "no"):
        return Verdict(bare == "yes", "")
    try:
        data = extract_json(reply)
    except ReplyFormatError:
        data = None
    if isinstance(data, dict):
        answer = data.get("is_hit")
        if isinstance(answer, bool):
            return Verdict(answer, str(data.get("reason", "")))
        if isinstance(answer, str) and answer.strip().lower() in ("yes", "no"):
            return Verdict(answer.strip().lower() == "yes", str(data.get("reason", "")))
    preview = " ".join(reply.split())[:120]
    raise NotAVerdict(f'expected {{"is_hit": "yes" or "no"}}, got {preview!r}')


def score(results: Sequence[PointResult]) -> tuple[float, float]:
    """The weights hit, and all the weights."""
    return (sum(r.weight for r in results if r.hit), sum(r.weight for r in results))
