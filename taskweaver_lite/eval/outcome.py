"""What one run of a case under one setting came to, and the results file that records each as it ends.

`results.jsonl` in the report folder gets one line per finished run, written and flushed the
moment the run ends, so an interrupted evaluation loses at most the runs still going; `--resume`
reads it back and skips the runs already scored. The store keeps each run too, under the
evaluation's id (`eval_run_id`: made with the report folder, in its `run_id` file, and read
again by `--resume`, so a resumed evaluation adds to the same record).
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

# not played: the run went through, but the model could not play part of it (the scripted model met a
# request or a statement outside its script); a score would say nothing about the setting, so there is none.
Status = Literal["scored", "failed", "skipped", "not played"]
RESULTS_FILE = "results.jsonl"
RUN_ID_FILE = "run_id"  # in the report folder: the id the store keeps the evaluation's results under
# What a model says when it cannot play a request or judge a statement (the scripted model does): the run is "not played".
CANNOT_PLAY = "The scripted model cannot play this"


@dataclass(frozen=True)
class PointResult:
    """One scoring point (TaskWeaver) or question (DSEval): hit or not, and why."""

    label: str
    weight: float
    hit: bool
    reason: str = ""
    by: str = "judge"  # judge, eval_code, or dseval


@dataclass(frozen=True)
class Outcome:
    """One case under one setting: its score, what it cost, or why it has no score."""

    case: str
    setting: str
    kind: str  # taskweaver or dseval
    status: Status
    score: float | None = None  # 0-1: the weights hit over all weights (the share of questions passed, for DSEval)
    points: float | None = None
    max_points: float | None = None
    rounds: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    fold_calls: int = 0
    seconds: float = 0.0
    examiner_tokens: int = 0  # the examiner's and the judge's calls, apart from the agent's
    judge_tokens: int = 0
    reason: str = ""  # why it was skipped, failed or not played
    notes: tuple[str, ...] = ()  # what was read but not applied, commands that failed...
    details: tuple[PointResult, ...] = ()
    session_id: str | None = None
    transcript: str = ""  # in the report folder: the examiner's conversation (a TaskWeaver case)
    session_file: str = ""  # in the report folder: the run's stored session written out as Markdown
    # The agent's calls per purpose (planner, code_generator, compression_planner...): calls, prompt, completion and cached tokens.
    by_purpose: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        """What identifies the run: case and setting."""
        return (self.case, self.setting)

    @property
    def uncached_tokens(self) -> int:
        """Prompt tokens the servers had to read afresh."""
        return self.prompt_tokens - self.cached_tokens

    def to_dict(self) -> dict[str, Any]:
        """JSON shape of results.jsonl and report.json."""
        data = asdict(self)
        data["notes"] = list(self.notes)
        data["details"] = [asdict(d) for d in self.details]
        data["by_purpose"] = {purpose: dict(counts) for purpose, counts in self.by_purpose.items()}
        data["uncached_tokens"] = self.uncached_tokens
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Outcome:
        """Inverse of `to_dict`."""
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["notes"] = tuple(known.get("notes", ()))
        known["details"] = tuple(PointResult(**d) for d in known.get("details", ()))
        return cls(**known)


@dataclass
class ResultsFile:
    """The append-only record of finished runs (one JSON object a line), safe to write from several threads."""

    path: Path
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def append(self, outcome: Outcome) -> None:
        """Record one finished run, flushed to disk before returning."""
        line = json.dumps(outcome.to_dict(), ensure_ascii=False) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as file:
            file.write(line)
            file.flush()
            os.fsync(file.fileno())

    def read(self) -> list[Outcome]:
        """Every run recorded, the latest per case and setting; a line cut off by a kill is ignored."""
        if not self.path.exists():
            return []
        latest: dict[tuple[str, str], Outcome] = {}
        for line in self.path.read_text(encoding="utf-8").splitlines():
            try:
                outcome = Outcome.from_dict(json.loads(line))
            except (ValueError, TypeError, KeyError):
                continue
            latest[outcome.key] = outcome
        return list(latest.values())


def scored_keys(outcomes: Iterable[Outcome]) -> set[tuple[str, str]]:
    """The runs `--resume` skips: those that got a score."""
    return {o.key for o in outcomes if o.status == "scored"}


def eval_run_id(report_dir: Path) -> str:
    """The evaluation's id in the store: read from the report folder, or made (date, time, a random suffix) and written there."""
    path = report_dir / RUN_ID_FILE
    if path.is_file():
        known = path.read_text(encoding="utf-8").strip()
        if known:
            return known
    made = f"eval-{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    path.write_text(made + "\n", encoding="utf-8")
    return made
