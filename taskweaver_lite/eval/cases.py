"""Evaluation cases as read from disk: TaskWeaver's auto_eval case YAML and DSEval problem sets.

A TaskWeaver case is a folder holding one YAML file (its data files beside it) or the YAML file
itself: `task_description` and `scoring_points` (`score_point`, `weight`, optional `eval_code`)
are required; `config_var`, `app_dir`, `dependencies`, `data_files`, `pre_command`, `verbose`
are read as TaskWeaver reads them, and `max_rounds` (ours) caps the examiner's requests.

A DSEval problem set is a `.py` file of `# %%` sections; a section may open with a docstring of
YAML (`question`, `validator`, `data`, `execution`) before its reference code, and a section with
no question sets the scene. Its data folder is `_inputs/<set name>` or `_inputs` beside it, seen
by the code as `inputs/`. A folder of either kind is searched for cases one level down.

A case that cannot be read becomes a `BadCase` naming the file and what to fix: it is reported,
and the other cases run.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from taskweaver_lite.config.yaml_reader import parse_yaml

# DSEval's validator templates: the checks a question gets before its own settings are merged in.
TEMPLATES: dict[str, dict[str, Any]] = {
    "empty": {},
    "basic": {"crash": None},
    "intact": {"crash": None, "namespace_intact": None},
    "comparison": {"crash": None, "namespace_intact": None, "result": None},
}
SUPPORTED_VALIDATORS = frozenset({"crash", "namespace_intact", "result", "namespace_check"})


@dataclass(frozen=True)
class ScoringPoint:
    """One weighted criterion: marked by the judge model, or by `eval_code` asserts in the kernel."""

    score_point: str
    weight: float
    eval_code: str | None = None


@dataclass(frozen=True)
class TaskCase:
    """A TaskWeaver auto_eval case."""

    name: str
    path: Path
    task_description: str
    scoring_points: tuple[ScoringPoint, ...]
    config_var: Mapping[str, Any] = field(default_factory=dict)
    app_dir: str | None = None
    dependencies: tuple[str, ...] = ()
    data_files: tuple[str, ...] = ()
    pre_command: tuple[str, ...] = ()
    verbose: bool = False
    max_rounds: int | None = None

    @property
    def folder(self) -> Path:
        """Where its data files are."""
        return self.path.parent


@dataclass(frozen=True)
class Problem:
    """One DSEval section: a question with its reference code and checks, or context code (no question)."""

    reference_code: str
    question: str | None = None
    validator: Mapping[str, Any] = field(default_factory=dict)
    data: tuple[str, ...] = ()


@dataclass(frozen=True)
class ProblemSet:
    """A DSEval problem set: its sections in order and its data folder."""

    name: str
    path: Path
    problems: tuple[Problem, ...]
    data_dir: Path | None

    @property
    def questions(self) -> tuple[Problem, ...]:
        """The sections that are scored."""
        return tuple(p for p in self.problems if p.question is not None)


@dataclass(frozen=True)
class BadCase:
    """A case that could not be read: it is reported with the reason, never run."""

    name: str
    path: Path
    reason: str


Case = TaskCase | ProblemSet | BadCase


def load_cases(arguments: Sequence[str | Path]) -> list[Case]:
    """Every case the arguments name (files, case folders, folders of cases), each name made unique."""
    found: list[Case] = []
    for argument in arguments:
        found.extend(_cases_at(Path(argument)))
    return _unique(found)


def _cases_at(path: Path) -> Iterable[Case]:
    if path.is_file():
        yield load_problem_set(path) if path.suffix == ".py" else load_task_case(path)
    elif path.is_dir():
        yamls = sorted(p for p in path.glob("*.yaml") if not p.name.startswith("_"))
        sets = sorted(p for p in path.glob("*.py") if not p.name.startswith("_") and _is_problem_set(p))
        folders = sorted(p for p in path.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")) and _holds_cases(p))
        if len(yamls) == 1 and not sets and not folders:
            yield load_task_case(yamls[0])  # TaskWeaver's case folder: one YAML and its data
            return
        if not sets and not folders:
            yield BadCase(path.name, path, f"{path}: no case here (a folder with one case YAML, DSEval .py problem sets, or folders of either)")
        yield from (load_problem_set(p) for p in sets)
        for folder in folders:
            yield from _cases_at(folder)
    else:
        yield BadCase(path.name, path, f"{path}: no such case file or folder")


def _holds_cases(folder: Path) -> bool:
    """Whether a case YAML or a problem set is somewhere under `folder` (a data folder has neither)."""
    return any(folder.rglob("*.yaml")) or any(_is_problem_set(p) for p in folder.rglob("*.py"))


def _is_problem_set(path: Path) -> bool:
    """A `.py` file in a searched folder counts when it has DSEval's `# %%` sections (a folder's scripts do not)."""
    try:
        return _SECTION.search(path.read_text(encoding="utf-8", errors="replace")) is not None
    except OSError:
        return False


def load_task_case(path: Path) -> Case:
    """A TaskWeaver case from its YAML file, or a BadCase naming the key to fix."""
    name = path.parent.name if len(list(path.parent.glob("*.yaml"))) == 1 else path.stem
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return BadCase(name, path, f"{path}: cannot be read as YAML ({' '.join(str(exc).split())[:200]})")
    if not isinstance(data, dict):
        return BadCase(name, path, f"{path}: expected a mapping with task_description and scoring_points")
    try:
        return _task_case(name, path, data)
    except _Unreadable as exc:
        return BadCase(name, path, f"{path}: {exc}")


class _Unreadable(Exception):
    """What is wrong with a case file, said for the person who wrote it."""


def _task_case(name: str, path: Path, data: dict[str, Any]) -> TaskCase:
    task = data.get("task_description")
    if not isinstance(task, str) or not task.strip():
        raise _Unreadable("missing task_description: the text the examiner plays the user from")
    points = data.get("scoring_points")
    if not isinstance(points, list) or not points:
        raise _Unreadable("missing scoring_points: a list of {score_point, weight, eval_code (optional)}")
    config_var = data.get("config_var") or {}
    if not isinstance(config_var, dict):
        raise _Unreadable("config_var must be a mapping of config keys to values")
    return TaskCase(
        name=name,
        path=path,
        task_description=task,
        scoring_points=tuple(_scoring_point(number, point) for number, point in enumerate(points, 1)),
        config_var=config_var,
        app_dir=_text_or_none(data.get("app_dir")),
        dependencies=_texts(data, "dependencies"),
        data_files=_texts(data, "data_files"),
        pre_command=_texts(data, "pre_command"),
        verbose=bool(data.get("verbose", False)),
        max_rounds=_rounds(data.get("max_rounds")),
    )


def _scoring_point(number: int, point: Any) -> ScoringPoint:
    if not isinstance(point, dict):
        raise _Unreadable(f"scoring_points item {number} must be a mapping with score_point and weight")
    text, weight, code = point.get("score_point"), point.get("weight"), point.get("eval_code")
    if not isinstance(text, str) or not text.strip():
        raise _Unreadable(f"scoring_points item {number}: missing score_point (the statement to check)")
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or weight < 0:
        raise _Unreadable(f"scoring_points item {number}: weight must be a number >= 0")
    if code is not None and not isinstance(code, str):
        raise _Unreadable(f"scoring_points item {number}: eval_code must be Python text or null")
    return ScoringPoint(text.strip(), float(weight), code if code and code.strip() else None)


def _texts(data: dict[str, Any], key: str) -> tuple[str, ...]:
    value = data.get(key) or []
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Unreadable(f"{key} must be a list of strings")
    return tuple(value)


def _text_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _rounds(value: Any) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _Unreadable("max_rounds must be a whole number >= 1")
    return value


_SECTION = re.compile(r"^# %%[ \t]*$", re.M)
_SETUP = re.compile(r'^r?"""(.*?)"""\s*\n(.*)\Z', re.S)


def load_problem_set(path: Path) -> Case:
    """A DSEval problem set from its `.py` file, or a BadCase naming what to fix."""
    try:
        text = path.read_text(encoding="utf-8")
        problems = tuple(_problem(path, section.strip()) for section in _SECTION.split(text)[1:] if section.strip())
    except (OSError, UnicodeDecodeError) as exc:
        return BadCase(path.stem, path, f"{path}: cannot be read ({exc})")
    except _Unreadable as exc:
        return BadCase(path.stem, path, f"{path}: {exc}")
    if not any(p.question for p in problems):
        return BadCase(path.stem, path, f"{path}: no question in it (DSEval sections start with '# %%' and a docstring with question:)")
    data_dir = next((d for d in (path.parent / "_inputs" / path.stem, path.parent / "_inputs") if d.is_dir()), None)
    missing = [name for p in problems for name in p.data if data_dir is None or not (data_dir / name).exists()]
    if missing:
        where = data_dir or path.parent / "_inputs"
        return BadCase(path.stem, path, f"{path}: data file {', '.join(missing)} not found in {where}; put it there (nothing is downloaded)")
    return ProblemSet(path.stem, path, problems, data_dir)


def _problem(path: Path, section: str) -> Problem:
    match = _SETUP.match(section)
    if match is None:
        return Problem(reference_code=section)
    try:
        setup = parse_yaml(match.group(1)) or {}
    except yaml.YAMLError as exc:
        raise _Unreadable(f"a section's docstring is not YAML ({' '.join(str(exc).split())[:160]})") from None
    if not isinstance(setup, dict):
        raise _Unreadable("a section's docstring must be a YAML mapping (question:, validator:)")
    question = setup.get("question")
    data = setup.get("data") or {}
    return Problem(
        reference_code=match.group(2).strip(),
        question=str(question).strip() if question is not None else None,
        validator=validator_config(setup.get("validator")) if question is not None else {},
        data=tuple(data) if isinstance(data, dict) else (),
    )


def validator_config(given: Any) -> dict[str, Any]:
    """A question's checks: DSEval's template (`comparison` unless named) merged with its own settings."""
    if given is None:
        given = {}
    if not isinstance(given, dict):
        raise _Unreadable("validator must be a mapping of checks (result:, namespace_check:, ...)")
    given = dict(given)
    template = given.pop("template", "comparison")
    if template not in TEMPLATES:
        raise _Unreadable(f"validator template {template!r} is unknown; use one of {', '.join(TEMPLATES)}")
    return {**TEMPLATES[template], **given}


def _unique(cases: list[Case]) -> list[Case]:
    """Cases renamed where two share a name (a-2, a-3...), so results and resume tell them apart."""
    seen: dict[str, int] = {}
    renamed: list[Case] = []
    for case in cases:
        count = seen[case.name] = seen.get(case.name, 0) + 1
        if count > 1:
            case = replace(case, name=f"{case.name}-{count}")
        renamed.append(case)
    return renamed
