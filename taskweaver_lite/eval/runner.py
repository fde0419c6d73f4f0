"""Running cases under settings: each run a fresh session of the project, up to `jobs` at a time.

An evaluation starts from a `Workspace`, as the chat and the server do: the project's config, its
store and its plugins, opened once and shared by every run. A run's config is the project's file,
then the case's `config_var` (TaskWeaver's key names translated where ours differ; keys with no
counterpart are noted, not applied), then `--set`, then the setting's keys, so a matrix row always
wins; its session opens on the workspace reconfigured to it. The store is the report folder's own
SQLite file, not the project's, unless `store.url` names a PostgreSQL store: there the sessions go,
as a team's do. Each finished run is written to results.jsonl and kept in the store as well, under
the evaluation's id (`eval_run_id`), so a team's database holds its scores beside its sessions;
its session is also written out as Markdown under `sessions/` in the report folder, beside the
examiner's transcript under `transcripts/`, and the report links both.

Whatever goes wrong in one run (a case that cannot be read, data that is missing, a model that
fails mid-run, a judge reply that is no verdict) is that run's outcome, with the reason; the other
runs go on. A case whose `session.roles` names a role this run leaves out (not in the project,
broken, or dropped by `--set`) is "not played", with the role and why: the agent could not do the
task, and a 0 would say nothing about the model. A run the model could not play (`CANNOT_PLAY`
in the conversation or a verdict) is "not played" too. A case's `pre_command` runs in TaskWeaver's
working folder, the `auto_eval/` folder that holds `cases/`, except a run of TaskWeaver's document
indexer: that one is read as the documents the built-in document_retriever answers from, and
`document_retriever.index_folder` names them (indexer_command.py).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import json
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from taskweaver_lite.config.file import is_config_key, load_config
from taskweaver_lite.config.settings import Config, LLMConfig, merged_llm
from taskweaver_lite.errors import ConfigError, StoreError, TaskWeaverError
from taskweaver_lite.eval import probe
from taskweaver_lite.eval.cases import BadCase, Case, ProblemSet, TaskCase
from taskweaver_lite.eval.dseval import SetupFailed, run_problem_set
from taskweaver_lite.eval.examiner import ExaminerFailed, RoundFailed, Transcript, examine
from taskweaver_lite.eval.indexer_command import INDEX_FOLDER, documents_folder, index_command
from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.outcome import CANNOT_PLAY, RESULTS_FILE, Outcome, PointResult, ResultsFile, eval_run_id, scored_keys
from taskweaver_lite.eval.scoring import JudgeFailed, NotAVerdict, mark, score
from taskweaver_lite.llm.client import ChatModel, MeteredModel, OpenAIChatModel
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.records.events import Event, RoundEnded
from taskweaver_lite.roles.registry import discover_roles
from taskweaver_lite.session.export import write_export
from taskweaver_lite.session.model_choice import setting_hints
from taskweaver_lite.session.session import Session
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.store.interface import Store

Progress = Callable[[str], None]

# TaskWeaver's config_var keys whose setting here has another name.
TASKWEAVER_KEYS = {
    "code_verification.code_verification_on": "code_interpreter.code_verification_on",
    "code_generator.enable_auto_plugin_selection": "code_generator.auto_plugin_selection",
}
PRE_COMMAND_TIMEOUT = 600.0
TRANSCRIPTS = "transcripts"  # in the report folder: each TaskWeaver run's conversation, as the examiner saw it
SESSIONS = "sessions"  # in the report folder: each run's stored session written out as Markdown
PROGRESS_EVERY = 10  # rounds between progress lines of a long case
_USAGE_FIELDS = ("calls", "prompt_tokens", "completion_tokens", "cached_tokens")  # of Usage, per purpose in report.json


@dataclass(frozen=True)
class EvalPlan:
    """What to run: the project, `--set` overrides, the settings, where the report goes, how many at once."""

    project: Path
    report_dir: Path
    settings: tuple[Setting, ...]
    overrides: tuple[str, ...] = ()
    jobs: int = 1
    resume: bool = False


def run_eval(cases: Sequence[Case], plan: EvalPlan, *, progress: Progress = lambda line: None) -> list[Outcome]:
    """Run every case under every setting (skipping those already scored when resuming); the outcomes, latest per run."""
    check_settings(plan)
    plan.report_dir.mkdir(parents=True, exist_ok=True)
    results = ResultsFile(plan.report_dir / RESULTS_FILE)
    earlier = results.read() if plan.resume else []
    done = scored_keys(earlier)
    runs = [(case, setting) for setting in plan.settings for case in cases]
    todo = [(case, setting) for case, setting in runs if (case.name, setting.name) not in done]
    progress(f"eval: {len(cases)} case(s) x {len(plan.settings)} setting(s) = {len(runs)} run(s), {plan.jobs} at a time; report in {plan.report_dir}")
    if len(todo) < len(runs):
        progress(f"resume: {len(runs) - len(todo)} run(s) already scored, {len(todo)} to go")
    finished: dict[tuple[str, str], Outcome] = {o.key: o for o in earlier}
    with Workspace.load(plan.project, [*plan.overrides, report_store(plan)]) as workspace:
        run_id = eval_run_id(plan.report_dir)
        progress(f"eval: each run is kept in {workspace.store.where} as eval run {run_id}")
        pool = ThreadPoolExecutor(max_workers=max(1, plan.jobs), thread_name_prefix="eval")
        stop = threading.Event()
        try:
            futures = [
                pool.submit(_in_worker, case, setting, plan, workspace, RunWatch(f"{case.name} @ {setting.name}", progress, stop)) for case, setting in todo
            ]
            for count, future in enumerate(as_completed(futures), 1):
                outcome = future.result()
                results.append(outcome)
                _keep(outcome, workspace.store, run_id=run_id, progress=progress)
                finished[outcome.key] = outcome
                progress(f"[{count}/{len(todo)}] {describe(outcome)}")
        except BaseException:
            # Ctrl-C, SIGTERM: no new run starts, those under way stop after their current request; what
            # was recorded stays in results.jsonl for --resume. They end before the store closes.
            stop.set()
            pool.shutdown(wait=False, cancel_futures=True)
            progress("eval: interrupted; the runs recorded so far are in results.jsonl: --resume goes on from there")
            pool.shutdown()
            raise
        pool.shutdown()
    order = {(case.name, setting.name): n for n, (case, setting) in enumerate(runs)}
    return sorted((o for o in finished.values() if o.key in order), key=lambda o: order[o.key])


def report_store(plan: EvalPlan) -> str:
    """The override that keeps an evaluation's sessions in its report folder's own SQLite file (unless store.url names a database)."""
    return f"store.path={json.dumps(str((plan.report_dir / 'sessions.db').resolve()))}"


def _keep(outcome: Outcome, store: Store, *, run_id: str, progress: Progress) -> None:
    """Keep a finished run in the store too, by case and setting; results.jsonl has it already, so a store that fails is told, not fatal."""
    try:
        store.save_eval_result(run_id, f"{outcome.case} @ {outcome.setting}", outcome.to_dict())
    except StoreError as exc:
        progress(f"eval: {outcome.case} @ {outcome.setting} is in results.jsonl only: {exc}")


class Interrupted(Exception):
    """The evaluation was interrupted: this run stops before its next request (and is not recorded)."""


@dataclass(frozen=True)
class RunWatch:
    """What a run reports to and listens for: progress lines, and the evaluation's stop signal."""

    where: str  # "case @ setting"
    progress: Progress
    stop: threading.Event

    def __call__(self, event: Event) -> None:
        """A session listener: a progress line every `PROGRESS_EVERY`th round."""
        if isinstance(event, RoundEnded) and event.round.index % PROGRESS_EVERY == 0:
            self.progress(f"  {self.where}: round {event.round.index}")

    def check(self) -> None:
        """Raise Interrupted once the evaluation is stopping."""
        if self.stop.is_set():
            raise Interrupted(f"{self.where}: interrupted")


def _in_worker(case: Case, setting: Setting, plan: EvalPlan, workspace: Workspace, watch: RunWatch) -> Outcome:
    """`run_one` in a pool thread, which then closes the event loop the kernel client opened in it."""
    from taskweaver_lite.kernel.executor import close_thread_loop

    try:
        return run_one(case, setting, plan, workspace, watch=watch)
    except Interrupted:
        raise
    except Exception as exc:  # noqa: BLE001 - one run's unexpected failure must not end the others; its reason is kept
        kind = "dseval" if isinstance(case, ProblemSet) else "taskweaver"
        return Outcome(case=case.name, setting=setting.name, kind=kind, status="failed", reason=f"{type(exc).__name__}: {' '.join(str(exc).split())[:500]}")
    finally:
        close_thread_loop()


def check_settings(plan: EvalPlan) -> None:
    """Every setting must make a valid config before anything runs: a typo fails the command, naming the setting."""
    for setting in plan.settings:
        try:
            config = load_config(plan.project, [*plan.overrides, *setting.overrides])
            for part in ("examiner", "judge"):
                eval_llm(config, part)
        except ConfigError as exc:
            raise ConfigError(f"setting {setting.name!r}: {exc}") from None


def describe(outcome: Outcome) -> str:
    """One progress line for a finished run."""
    where = f"{outcome.case} @ {outcome.setting}"
    if outcome.status == "skipped":
        return f"{where}: skipped: {outcome.reason}"
    if outcome.status == "not played":
        return f"{where}: not played: {outcome.reason}"
    tokens = f"{outcome.prompt_tokens:,} prompt tokens ({outcome.cached_tokens:,} cached)"
    cost = f"{outcome.rounds} round(s), {tokens}, {outcome.fold_calls} fold(s), {outcome.seconds:.1f} s"
    if outcome.status == "failed":
        return f"{where}: failed: {outcome.reason} ({cost})"
    return f"{where}: score {outcome.score:.2f} ({outcome.points:g}/{outcome.max_points:g}), {cost}"


def run_one(case: Case, setting: Setting, plan: EvalPlan, workspace: Workspace, *, watch: RunWatch | None = None) -> Outcome:
    """One case under one setting, in a session of its own on `workspace`'s store; never raises for the case's own problems.

    `watch` hears when it starts and every `PROGRESS_EVERY` rounds, and can stop it between requests.
    """
    watch = watch or RunWatch(f"{case.name} @ {setting.name}", lambda line: None, threading.Event())
    started = time.perf_counter()
    kind = "dseval" if isinstance(case, ProblemSet) else "taskweaver"
    blank = Outcome(case=case.name, setting=setting.name, kind=kind, status="skipped")
    if isinstance(case, BadCase):
        return replace(blank, reason=case.reason)
    problem = _unmet(case)
    if problem:
        return replace(blank, reason=problem)
    overrides, notes = case_overrides(case)
    try:
        config = load_config(plan.project, [*overrides, *plan.overrides, *setting.overrides, report_store(plan)])
    except ConfigError as exc:
        return replace(blank, reason=f"{case.name}: config_var: {exc}")
    left_out = missing_roles(case, config)
    if left_out:
        return replace(blank, status="not played", reason=left_out, notes=tuple(notes))
    if isinstance(case, TaskCase):
        notes += _pre_commands(case)
    watch.progress(f"  {watch.where}: started")
    name = f"{_file_name(case.name)}@{_file_name(setting.name)}"
    transcript = plan.report_dir / TRANSCRIPTS / f"{name}.json"
    outcome = _in_session(case, workspace, config, blank=replace(blank, notes=tuple(notes)), watch=watch, transcript=transcript)
    outcome = _with_record(outcome, config, report_dir=plan.report_dir, name=name)
    return replace(outcome, seconds=round(time.perf_counter() - started, 3))


def missing_roles(case: Case, config: Config) -> str:
    """Why a case cannot be played here: a role its `config_var` session.roles needs is left out of this run (and why), or ''.

    Without the role the agent cannot do what the case asks (TaskWeaver's rag case asks its
    document_retriever), so a score of 0 would measure the project's roles, not the model or the setting.
    """
    needed = case.config_var.get("session.roles") if isinstance(case, TaskCase) else None
    if not isinstance(needed, list):
        return ""
    catalog = discover_roles(config.project_dir, enabled=config.session.roles, config=config)
    enabled = {spec.name for spec in catalog.enabled}
    why = []
    for name in (str(role) for role in needed if str(role) not in enabled):
        entry = next((e for e in catalog.entries if e.name == name and e.state in ("broken", "off")), None)
        if entry is not None and entry.where != "session.roles":
            why.append(f"{name} ({entry.where}: {entry.error})")
        elif catalog.find(name) is None or entry is not None:
            why.append(f"{name} (no role of that name here: add it in {config.project_dir / 'roles' / name}/)")
        else:
            why.append(f"{name} (left out of session.roles by --set or the setting)")
    return f"the case needs the role {', '.join(why)}; without it the agent cannot do the task" if why else ""


def _with_record(outcome: Outcome, config: Config, *, report_dir: Path, name: str) -> Outcome:
    """The run with links to what it left: its transcript, and its stored session written out as Markdown beside the report."""
    transcript = report_dir / TRANSCRIPTS / f"{name}.json"
    found = replace(outcome, transcript=str(transcript.relative_to(report_dir)) if transcript.is_file() else "")
    if outcome.session_id is None:
        return found
    target = report_dir / SESSIONS / f"{name}.md"
    try:
        write_export(config, outcome.session_id, fmt="md", target=target, force=True)
    except (TaskWeaverError, OSError) as exc:
        return replace(found, notes=(*found.notes, f"the session could not be written out as Markdown: {exc}"))
    return replace(found, session_file=str(target.relative_to(report_dir)))


def case_overrides(case: Case) -> tuple[list[str], list[str]]:
    """A TaskWeaver case's `config_var` as overrides, and a note for each key with no setting here."""
    if not isinstance(case, TaskCase):
        return ([], [])
    overrides, notes = [], []
    for key, value in case.config_var.items():
        if key == "execution_service.kernel_mode":
            # TaskWeaver's container mode isolates the kernel: here that is the sandbox. Its local mode is
            # not taken to mean "no sandbox": the project's execution.sandbox stays.
            if value == "container":
                overrides.append('execution.sandbox="bubblewrap"')
            else:
                notes.append(f"config_var {key}: {value} keeps the project's execution.sandbox")
            continue
        if key == INDEX_FOLDER:  # TaskWeaver's FAISS index: here, the documents the built-in retriever indexes itself
            folder = documents_folder(str(value), case.pre_command, cwd=command_folder(case))
            overrides.append(f"document_retriever.folder={json.dumps(str(folder))}")
            continue
        ours = TASKWEAVER_KEYS.get(str(key), str(key))
        if is_config_key(ours):
            overrides.append(f"{ours}={json.dumps(value)}")
        else:
            notes.append(f"config_var {key} not applied: no such setting here")
    return (overrides, notes)


def _unmet(case: Case) -> str:
    """Why a case cannot run here (a dependency missing, a data file not there), or ''."""
    if not isinstance(case, TaskCase):
        return ""
    for requirement in case.dependencies:
        problem = dependency_problem(requirement)
        if problem:
            return problem
    missing = [name for name in case.data_files if not (case.folder / name).exists()]
    if missing:
        return f"data file {', '.join(missing)} not found in {case.folder}"
    return ""


def dependency_problem(requirement: str) -> str:
    """Why `requirement` (TaskWeaver's form: name, name>=1.2, name>1.2) is not met, or ''."""
    from packaging.version import InvalidVersion, Version

    match = re.fullmatch(r"\s*([A-Za-z0-9_.\-]+)\s*(?:(>=|>|==)\s*([\w.]+))?\s*", requirement)
    if match is None:
        return f"dependency {requirement!r} is not of the form name, name>=version or name>version"
    name, operator, wanted = match.groups()
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return f"dependency {name} is not installed (pip install {name})"
    if operator is None:
        return ""
    try:
        have, need = Version(installed), Version(wanted)
    except InvalidVersion:
        return f"dependency {requirement!r}: cannot compare versions ({installed} installed)"
    met = {">=": have >= need, ">": have > need, "==": have == need}[operator]
    return "" if met else f"dependency {requirement} not met: {name} {installed} is installed"


def command_folder(case: TaskCase) -> Path:
    """Where a case's pre_command runs: TaskWeaver's `auto_eval/` (the folder holding `cases/`, its working folder), else the case's own."""
    for folder in case.folder.resolve().parents:
        if folder.name == "cases":
            return folder.parent
    return case.folder


def _pre_commands(case: TaskCase) -> list[str]:
    """Run the case's pre_command lines where TaskWeaver runs them (`command_folder`); a note for each that fails (the case still runs).

    A run of TaskWeaver's `scripts/document_indexer.py` is not run but read (indexer_command.py), in one note.
    """
    notes = []
    cwd = command_folder(case)
    for command in case.pre_command:
        indexing = index_command(command, cwd=cwd)
        if indexing is not None:  # TaskWeaver's own indexer: read as the documents to index (case_overrides applied it)
            notes.append(indexing.line())
            continue
        try:
            done = subprocess.run(command, shell=True, cwd=cwd, capture_output=True, text=True, timeout=PRE_COMMAND_TIMEOUT, check=False)
        except subprocess.TimeoutExpired:
            notes.append(f"pre_command {command!r} did not finish in {PRE_COMMAND_TIMEOUT:g} s")
            continue
        if done.returncode != 0:
            tail = " ".join((done.stderr or done.stdout).split())[-200:]
            notes.append(f"pre_command {command!r} failed in {cwd} (exit {done.returncode})" + (f": {tail}" if tail else ""))
    return notes


def _file_name(name: str) -> str:
    """`name` as a safe file name part."""
    return re.sub(r"[^\w.,()+-]+", "_", name).strip("_") or "_"


def _in_session(case: TaskCase | ProblemSet, workspace: Workspace, config: Config, *, blank: Outcome, watch: RunWatch, transcript: Path) -> Outcome:
    """Open the session on the workspace under the run's `config`, score the case in it, and count what it cost."""
    try:
        examiner, judge = MeteredModel(_client(config, "examiner")), MeteredModel(_client(config, "judge"))
    except TaskWeaverError as exc:
        return replace(blank, status="failed", reason=f"the examiner's or the judge's model: {exc}")
    try:
        try:
            session = workspace.reconfigured(config).new_session(listeners=[watch])
        except ConfigError as exc:  # the case's config_var asks for what this project cannot be (no planner...)
            return replace(blank, reason=f"the case's config: {exc}")
        except TaskWeaverError as exc:
            return replace(blank, status="failed", reason=f"the session could not start: {exc}")
        with session:
            # A role the case enables that is broken is left out, as the chat leaves it out; the case runs without it.
            # (A name that is no role at all, like TaskWeaver's web_search here, stopped the opening: skipped above.)
            left_out = tuple(f"{line} (the case ran without it)" for line in session.role_problems)
            blank = replace(blank, notes=blank.notes + left_out)
            outcome = _scored(case, session, config, examiner=examiner, judge=judge, blank=blank, watch=watch, transcript=transcript)
            return _with_costs(outcome, session)
    finally:
        for model in (examiner, judge):
            model.close()  # the meter closes the model inside


def _scored(
    case: TaskCase | ProblemSet,
    session: Session,
    config: Config,
    *,
    examiner: MeteredModel,
    judge: MeteredModel,
    blank: Outcome,
    watch: RunWatch,
    transcript: Path,
) -> Outcome:
    """The case's score, or the reason it has none (the run's costs are added by the caller)."""
    try:
        session.executor.run(probe.install_cell(inspect.getsource(probe)))
        if isinstance(case, ProblemSet):
            details = run_problem_set(case, session=session, before_question=watch.check)
        else:
            details = _task_case(case, session, config, examiner=examiner, judge=judge, watch=watch, transcript=transcript)
    except (NotAVerdict, SetupFailed, ExaminerFailed, JudgeFailed) as exc:
        return replace(blank, status="failed", reason=str(exc), **_side_costs(examiner, judge))
    except Interrupted:
        raise
    except TaskWeaverError as exc:
        rounds = len(session.conversation.rounds)
        return replace(blank, status="failed", reason=f"the agent's model or kernel failed at request {rounds}: {exc}", **_side_costs(examiner, judge))
    except Exception as exc:  # noqa: BLE001 - one run's unexpected failure must not end the others; its reason is kept
        return replace(blank, status="failed", reason=f"{type(exc).__name__}: {exc}", **_side_costs(examiner, judge))
    unplayed = not_played(session.conversation.rounds, details)
    if unplayed:
        return replace(blank, status="not played", reason=unplayed, details=details, **_side_costs(examiner, judge))
    points, most = score(details)
    return replace(
        blank, status="scored", score=round(points / most, 4) if most else 0.0, points=points, max_points=most, details=details, **_side_costs(examiner, judge)
    )


def not_played(rounds: Sequence[Round], details: Sequence[PointResult]) -> str:
    """Why the model could not play the run (it said `CANNOT_PLAY` in a post or a verdict), or ''."""
    unanswered = [rnd.index for rnd in rounds if any(CANNOT_PLAY in post.message for post in rnd.posts)]
    verdicts = [f"scoring point {number}" for number, d in enumerate(details, 1) if CANNOT_PLAY in d.reason]
    if not unanswered and not verdicts:
        return ""
    parts = [f"it could not answer request(s) {', '.join(map(str, unanswered))}"] if unanswered else []
    parts += [f"it could not judge {', '.join(verdicts)}"] if verdicts else []
    return f"the model could not play this case: {'; '.join(parts)}; run it with real models (llm, eval.examiner.llm, eval.judge.llm) for a score"


def _task_case(
    case: TaskCase, session: Session, config: Config, *, examiner: ChatModel, judge: ChatModel, watch: RunWatch, transcript: Path
) -> tuple[PointResult, ...]:
    """A TaskWeaver case: data files in, the examiner's conversation (saved to `transcript`), then the marking."""
    for name in case.data_files:
        source = case.folder / name
        if source.is_dir():
            shutil.copytree(source, session.working_dir / source.name, dirs_exist_ok=True)
        else:
            session.executor.upload(source)

    def ask(request: str) -> str:
        watch.check()
        rnd = session.ask(request)
        if rnd.state == "failed":
            raise RoundFailed(rnd.error or "the round failed")
        return verbose_reply(rnd) if case.verbose else (rnd.answer or rnd.posts[-1].message)

    talk: Transcript = examine(case.task_description, model=examiner, ask=ask, max_rounds=case.max_rounds or config.eval.max_rounds)
    transcript.parent.mkdir(parents=True, exist_ok=True)
    saved = {"case": case.name, "rounds": talk.rounds, "chat_history": [list(record) for record in talk.records]}
    transcript.write_text(json.dumps(saved, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return mark(case.scoring_points, task_description=case.task_description, transcript=talk, judge=judge, executor=session.executor)


def verbose_reply(rnd: Round) -> str:
    """The agent's reply with every post of the round, as TaskWeaver's `verbose: true` shows the examiner."""
    lines = [f"{post.send_from} -> {post.send_to}: {post.message}" for post in rnd.posts]
    return "\n Below are conversation details inside the Agent: \n" + "\n".join(lines) + "\n"


def _with_costs(outcome: Outcome, session: Session) -> Outcome:
    """The agent's tokens (roles and folds), its fold calls and its rounds."""
    usage = session.usage()
    by_model = session.usage_by_model()
    folds = sum(u.calls for (purpose, _), u in by_model.items() if purpose.startswith("compression"))
    by_purpose: dict[str, dict[str, int]] = {}
    for (purpose, _), u in by_model.items():  # a purpose may have called more than one model
        counts = by_purpose.setdefault(purpose, dict.fromkeys(_USAGE_FIELDS, 0))
        for name in _USAGE_FIELDS:
            counts[name] += getattr(u, name)
    return replace(
        outcome,
        rounds=len(session.conversation.rounds),
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_tokens=usage.cached_tokens,
        fold_calls=folds,
        session_id=session.id,
        by_purpose=by_purpose,
    )


def _side_costs(examiner: MeteredModel, judge: MeteredModel) -> dict[str, Any]:
    return {"examiner_tokens": examiner.usage().total_tokens, "judge_tokens": judge.usage().total_tokens}


def _client(config: Config, part: str) -> ChatModel:
    """The examiner's or the judge's model: `eval.<part>.llm` over the project's `llm` (the examiner writes prose: its calls name no reply schema)."""
    return OpenAIChatModel(eval_llm(config, part), hints=setting_hints(config, section=f"eval.{part}", overrides=getattr(config.eval, part).llm))


def eval_llm(config: Config, part: str) -> LLMConfig:
    """`eval.<part>.llm` merged over `llm`; ConfigError naming the key when the result is not a valid model setting."""
    section = getattr(config.eval, part)
    try:
        llm = merged_llm(config.llm, section.llm)
    except ValueError as exc:
        raise ConfigError(f"eval.{part}.llm (over llm): {' '.join(str(exc).split())[:300]}") from None
    return llm
