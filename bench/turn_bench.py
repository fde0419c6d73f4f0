"""The framework's overhead per user turn, and how fast `taskweaver-lite --help` answers.

One turn = Planner call, CodeGenerator call, kernel runs `x = 1`, Planner call, answer; the
scripted model answers at once. Overhead = turn wall time minus the time spent inside the kernel
executor. Baseline, measured in the same run: the same three chat calls made with the bare openai
SDK against the same server, plus one `execute` of `x = 1` through bare jupyter-client.

A third role: the framework's own cost per turn, as CPU time of the turn's thread (so that other
programs on a shared machine do not blur it) minus the CPU time spent inside the model client and
the executor, with a model-only project role enabled beside the Planner and the CodeInterpreter,
against the two roles alone. The three setups run in the same process, their turns in rotation:
the third role idle (the same turn), and the third role consulted in every turn (then per post,
the posts counted from each turn's round). The executor passes the cell's live output on, as in the CLI.

A fourth: tracing. The same framework CPU per turn with `tracing.enabled: false` against the code path
with the tracing hooks taken out (each traced method swapped for its untraced body, the tracing helpers
for do-nothing ones: the code as it was before tracing), and with tracing on, its spans exported over
OTLP/HTTP to a receiver in this process (taskweaver_lite/testing/otlp_receiver.py), against off. The
three sessions take their turns in rotation. Beside it, the off path's hooks of one turn timed alone.

    python bench/turn_bench.py [--turns 40] [--tracing]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import openai
from jupyter_client.manager import KernelManager
from openai.types.chat import ChatCompletionSystemMessageParam

from taskweaver_lite.cli.demo import bundled_project
from taskweaver_lite.config.file import load_config
from taskweaver_lite.kernel.base import SessionKernel
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.interface import Executor, OutputSink
from taskweaver_lite.llm.client import DeltaSink, MeteredModel, ModelDefaults, OpenAIChatModel
from taskweaver_lite.llm.replies import ReplySchema
from taskweaver_lite.records.execution import ExecutionResult, KernelEnvironment, Variable
from taskweaver_lite.records.model_calls import Completion, Message
from taskweaver_lite.session.session import Session
from taskweaver_lite.telemetry import tracing
from taskweaver_lite.telemetry.spans import NO_SPAN
from taskweaver_lite.testing.otlp_receiver import OtlpReceiver
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply, summary_reply


class TimedExecutor:
    """Counts the wall time spent inside the real executor, so it can be subtracted."""

    def __init__(self, inner: Executor) -> None:
        self.inner = inner
        self.seconds = 0.0
        self.cpu = 0.0  # CPU time of the calling thread inside run()

    @property
    def working_dir(self) -> Path:
        return self.inner.working_dir

    def upload(self, source: Path, *, name: str | None = None) -> str:
        return self.inner.upload(source, name=name)

    def artifact(self, name: str) -> Path:
        return self.inner.artifact(name)

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        started, cpu = time.perf_counter(), time.thread_time()
        try:
            return self.inner.run(code, timeout=timeout, on_output=on_output)  # the live-output path the CLI takes
        finally:
            self.seconds += time.perf_counter() - started
            self.cpu += time.thread_time() - cpu

    def interrupt(self) -> None:
        self.inner.interrupt()

    def kept_variables(self) -> bool:
        return False

    def catch_up(self, kernel_id: str | None, *, cells_before: int) -> bool:
        return False

    def start(self) -> None:
        pass

    def still_there(self) -> bool:
        return True

    def known_there(self) -> bool:
        return True

    def variables(self) -> tuple[Variable, ...]:
        return self.inner.variables()

    def environment(self) -> KernelEnvironment:
        return self.inner.environment()

    def restart(self) -> tuple[str, ...]:
        return self.inner.restart()

    def shutdown(self) -> None:
        self.inner.shutdown()


def enqueue_turn(server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("Set x to 1."), planner_reply("x is 1.", send_to="User"))
    server.enqueue("code_generator", code_reply("x = 1"))


def bare_sdk_calls(server: ScriptedServer, turns: int) -> list[float]:
    client = openai.OpenAI(base_url=server.url, api_key="bench")
    system: ChatCompletionSystemMessageParam = {"role": "system", "content": "schema: init_plan"}
    coder: ChatCompletionSystemMessageParam = {"role": "system", "content": "schema: reply_content"}
    times = []
    for _ in range(turns):
        enqueue_turn(server)
        started = time.perf_counter()
        for sys_msg in (system, coder, system):
            client.chat.completions.create(model="m", messages=[sys_msg, {"role": "user", "content": "x"}], response_format={"type": "json_object"})
        times.append(time.perf_counter() - started)
    return times


def bare_kernel_execute(turns: int) -> list[float]:
    km = KernelManager()
    km.start_kernel()
    client = km.client()
    client.start_channels()
    client.wait_for_ready(timeout=60)
    times = []
    try:
        for _ in range(turns):
            started = time.perf_counter()
            client.execute_interactive("x = 1", output_hook=lambda msg: None, timeout=30)
            times.append(time.perf_counter() - started)
    finally:
        client.stop_channels()
        km.shutdown_kernel(now=True)
    return times


def our_turns(server: ScriptedServer, turns: int) -> tuple[list[float], list[float]]:
    project = Path(tempfile.mkdtemp(prefix="turn-bench-"))
    config = load_config(bundled_project(), [f"llm.api_base={server.url}", "llm.api_key=bench", "execution.timeout=30"])
    config.project_dir = project
    executor = TimedExecutor(KernelExecutor(project / "sessions" / "bench", config=config.execution))
    session = Session(config, model=OpenAIChatModel(config.llm), executor=executor, session_id="bench")
    server.set_default("compression", summary_reply("The user set x to 1 several times.", [{"name": "x", "type": "int", "description": "1"}]))
    overheads, walls = [], []
    try:
        for number in range(turns + 3):
            enqueue_turn(server)
            executor.seconds = 0.0
            started = time.perf_counter()
            session.ask("Set x to 1, please.")
            wall = time.perf_counter() - started
            if number >= 3:  # warm-up: kernel start, first imports
                walls.append(wall)
                overheads.append(wall - executor.seconds)
    finally:
        session.close()
    return overheads, walls


class TimedModel(ModelDefaults):
    """Counts the CPU time of the model calls made on the turn's own thread (background folds are not on its path)."""

    def __init__(self, inner: OpenAIChatModel) -> None:
        self.inner = inner
        self.seconds = 0.0

    def complete(
        self, messages: Sequence[Message], *, purpose: str, max_tokens: int | None = None, on_delta: DeltaSink | None = None, schema: ReplySchema | None = None
    ) -> Completion:
        started = time.thread_time()
        try:
            return self.inner.complete(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)
        finally:
            if threading.current_thread() is threading.main_thread():
                self.seconds += time.thread_time() - started


ANALYST_ROLE = "alias: Analyst\nintro: |-\n  - Analyst explains what a result means.\nprompt: You are the {{ alias }}. Explain briefly.\n"


class RoleSetup:
    """One session with `roles` enabled; `consult`: the Planner asks the Analyst first in every turn; `settings`: more --set overrides."""

    def __init__(self, server: ScriptedServer, *, roles: list[str], consult: bool, settings: Sequence[str] = ()) -> None:
        project = Path(tempfile.mkdtemp(prefix="role-bench-"))
        (project / "roles" / "analyst").mkdir(parents=True)
        (project / "roles" / "analyst" / "analyst.role.yaml").write_text(ANALYST_ROLE, encoding="utf-8")
        overrides = [f"llm.api_base={server.url}", "llm.api_key=bench", "execution.timeout=30", f"session.roles=[{', '.join(roles)}]", *settings]
        config = load_config(project, overrides)
        self.server, self.consult = server, consult
        self.executor = TimedExecutor(KernelExecutor(project / "sessions" / "bench", config=config.execution))
        self.model = TimedModel(OpenAIChatModel(config.llm))
        self.session = Session(config, model=self.model, executor=self.executor, session_id="bench")
        self.costs: list[float] = []
        self.walls: list[float] = []
        self.posts: list[int] = []  # posts each kept turn added, counted from its round

    def turn(self, *, keep: bool) -> None:
        """One turn; its framework cost (and wall time) is kept unless it is a warm-up turn."""
        if self.consult:
            self.server.enqueue("planner", planner_reply("Is setting x to 1 safe?", send_to="Analyst"))
        enqueue_turn(self.server)
        self.executor.seconds = self.executor.cpu = self.model.seconds = 0.0
        started, wall = time.thread_time(), time.perf_counter()
        rnd = self.session.ask("Set x to 1, please.")
        cost = time.thread_time() - started - self.executor.cpu - self.model.seconds
        wall = time.perf_counter() - wall
        for context in self.session.contexts().values():
            context.wait_idle(timeout=30)  # a fold of this setup must not run into the next setup's turn
        if keep:
            self.costs.append(cost)
            self.walls.append(wall)
            self.posts.append(len(rnd.posts))


def role_turns(server: ScriptedServer, turns: int) -> tuple[list[float], list[float]]:
    """Median framework cost per turn: two roles, a third idle, a third in every turn; turns taken in rotation so load hits all alike."""
    server.set_default("compression", summary_reply("The user set x to 1 several times.", [{"name": "x", "type": "int", "description": "1"}]))
    server.set_default("other", "Setting x to 1 is harmless.")
    two_and_three = ["planner", "code_interpreter"], ["planner", "code_interpreter", "analyst"]
    setups = [
        RoleSetup(server, roles=two_and_three[0], consult=False),
        RoleSetup(server, roles=two_and_three[1], consult=False),
        RoleSetup(server, roles=two_and_three[1], consult=True),
    ]
    try:
        for number in range(turns + 3):
            for setup in setups[number % 3 :] + setups[: number % 3]:
                setup.turn(keep=number >= 3)  # warm-up: kernel start, first imports
    finally:
        for setup in setups:
            setup.session.close()
    costs = [statistics.median(setup.costs) for setup in setups]
    posts = [statistics.median(setup.posts) for setup in setups]
    return costs, posts


@contextlib.contextmanager
def tracing_absent() -> Iterator[None]:
    """The code path as it was before tracing: each traced method's untraced body called directly, the helpers doing nothing."""

    def complete(
        self: MeteredModel,
        messages: Sequence[Message],
        *,
        purpose: str,
        max_tokens: int | None = None,
        on_delta: DeltaSink | None = None,
        schema: ReplySchema | None = None,
    ) -> Completion:
        return self._metered(messages, purpose=purpose, max_tokens=max_tokens, on_delta=on_delta, schema=schema)

    def run(self: SessionKernel, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        return self._run(code, timeout=timeout, on_output=on_output)

    nothing = contextlib.nullcontext(NO_SPAN)
    swaps: list[tuple[object, str, object]] = [
        (MeteredModel, "complete", complete),
        (SessionKernel, "run", run),
        (tracing, "turn", lambda tracer, **_: nothing),
        (tracing, "role_reply", lambda **_: nothing),
        (tracing, "fold", lambda **_: contextlib.nullcontext(tracing.Fold(NO_SPAN))),
        (tracing, "carried", lambda target: target),
    ]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in swaps]
    for owner, name, value in swaps:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in saved:
            setattr(owner, name, value)


def tracing_turns(server: ScriptedServer, turns: int) -> tuple[list[float], list[float]]:
    """Median framework CPU and wall time per turn: tracing absent, off, and on (exported to a receiver in this process)."""
    server.set_default("compression", summary_reply("The user set x to 1 several times.", [{"name": "x", "type": "int", "description": "1"}]))
    roles = ["planner", "code_interpreter"]
    with OtlpReceiver() as receiver:
        on = ["tracing.enabled=true", f"tracing.endpoint={receiver.url}"]
        absent, off, traced = (RoleSetup(server, roles=roles, consult=False, settings=settings) for settings in ([], [], on))
        setups = [absent, off, traced]
        try:
            for number in range(turns + 3):
                for setup in setups[number % 3 :] + setups[: number % 3]:
                    with tracing_absent() if setup is absent else contextlib.nullcontext():
                        setup.turn(keep=number >= 3)  # warm-up: kernel start, first imports
        finally:
            for setup in setups:
                setup.session.close()
        assert traced.session.tracer is not None and traced.session.tracer.flush()
        assert len(receiver.spans) >= 6 * turns, f"the traced session's spans reached the receiver ({len(receiver.spans)})"
    return [statistics.median(setup.costs) for setup in setups], [statistics.median(setup.walls) for setup in setups]


def off_hooks_per_turn(runs: int = 20_000) -> float:
    """Seconds the untraced path's hooks of one turn take alone: the turn, three role replies, three model calls, a cell, two folds handed on."""

    def fold() -> None:
        pass

    started = time.perf_counter()
    for _ in range(runs):
        with tracing.turn(None, session_id="bench", request="x") as span:
            for _ in range(3):
                with tracing.role_reply(alias="Planner", key="planner"):
                    tracing.active()  # the model call's check
            tracing.active()  # the cell's
            span.set({"taskweaver.round.index": 1, "taskweaver.round.state": "finished"})
        tracing.carried(fold)
        tracing.carried(fold)
    return (time.perf_counter() - started) / runs


def help_time(runs: int = 21) -> tuple[float, float]:
    def timed(args: list[str]) -> float:
        samples = []
        for _ in range(runs):
            started = time.perf_counter()
            subprocess.run(args, check=True, capture_output=True)
            samples.append(time.perf_counter() - started)
        return statistics.median(samples)

    return timed([sys.executable, "-m", "taskweaver_lite", "--help"]), timed([sys.executable, "-c", "pass"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--tracing", action="store_true", help="only the tracing measures")
    args = parser.parse_args()
    print(f"{'measure':<62}{'ours':>12}{'baseline':>12}{'ratio':>8}")
    if not args.tracing:
        turn_measures(args.turns)
    tracing_measures(args.turns)


def turn_measures(turns: int) -> None:
    """A turn against bare SDK calls and a bare kernel, a third role against two, and `--help`."""
    with ScriptedServer() as server:
        sdk = statistics.median(bare_sdk_calls(server, turns))
        overheads, walls = our_turns(server, turns)
        (two, idle, busy), (two_posts, _, busy_posts) = role_turns(server, turns)
    kernel = statistics.median(bare_kernel_execute(turns))
    overhead = statistics.median(overheads)
    wall = statistics.median(walls)
    help_s, python_s = help_time()
    print(f"{'turn wall time (3 model calls + x = 1)':<62}{wall * 1e3:>10.1f}ms{(sdk + kernel) * 1e3:>10.1f}ms{wall / (sdk + kernel):>8.2f}")
    print(f"{'framework overhead = turn - kernel (target < 15 ms)':<62}{overhead * 1e3:>10.1f}ms{sdk * 1e3:>10.1f}ms{overhead / sdk:>8.2f}")
    print(f"{'  of which not the 3 HTTP calls (overhead - bare SDK)':<62}{(overhead - sdk) * 1e3:>10.1f}ms{'':>12}{'':>8}")
    print(f"{'framework CPU/turn, 3rd role idle vs 2 roles':<62}{idle * 1e3:>10.2f}ms{two * 1e3:>10.2f}ms{idle / two:>8.2f}")
    # Per post: each turn's cost over the posts its round holds (counted, not assumed).
    per_post = f"framework CPU/post, 3rd role in every turn vs 2 ({busy_posts:g} vs {two_posts:g} posts)"
    print(f"{per_post:<62}{busy / busy_posts * 1e3:>10.2f}ms{two / two_posts * 1e3:>10.2f}ms{busy / busy_posts / (two / two_posts):>8.2f}")
    print(f"{'taskweaver-lite --help vs python -c pass':<62}{help_s * 1e3:>10.1f}ms{python_s * 1e3:>10.1f}ms{help_s / python_s:>8.2f}")


def tracing_measures(turns: int) -> None:
    """Tracing off against the code without it, on against off, and the off path's hooks alone."""
    with ScriptedServer() as server:
        (absent, off, on), (absent_wall, off_wall, on_wall) = tracing_turns(server, turns)
    hooks = off_hooks_per_turn()
    print(f"{'framework CPU/turn, tracing off vs tracing absent':<62}{off * 1e3:>10.2f}ms{absent * 1e3:>10.2f}ms{off / absent:>8.2f}")
    print(f"{'  the hooks of one turn with tracing off, alone, vs the turn':<62}{hooks * 1e6:>10.2f}us{off * 1e3:>10.2f}ms{hooks / off:>8.4f}")
    print(f"{'framework CPU/turn, tracing on (OTLP/HTTP, local) vs off':<62}{on * 1e3:>10.2f}ms{off * 1e3:>10.2f}ms{on / off:>8.2f}")
    wall_label = f"turn wall time, tracing on vs off (absent: {absent_wall * 1e3:.1f} ms)"
    print(f"{wall_label:<62}{on_wall * 1e3:>10.1f}ms{off_wall * 1e3:>10.1f}ms{on_wall / off_wall:>8.2f}")


if __name__ == "__main__":
    main()
