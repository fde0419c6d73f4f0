"""A turn, hop by hop, through the real openai client, a scripted server and a real kernel."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig
from taskweaver_lite.errors import LLMUnreachableError
from taskweaver_lite.kernel.interface import OutputSink
from taskweaver_lite.records.events import Event, Folded, PostAdded
from taskweaver_lite.records.execution import ExecutionResult, KernelEnvironment, Variable
from taskweaver_lite.session import assembly
from taskweaver_lite.session.session import Session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply, summary_reply, text_reply

pytestmark = pytest.mark.kernel


def open_session(tmp_path: Path, server: ScriptedServer, **sections: Mapping[str, object]) -> Session:
    project = make_project(tmp_path, server.url, **sections)
    return assembly.open_session(load_config(project))


def calls(server: ScriptedServer, role: str) -> list[list[dict]]:
    return [r.messages for r in server.requests if r.role == role]


def last_user(messages: list[dict]) -> str:
    return next(m["content"] for m in reversed(messages) if m["role"] == "user")


def test_planner_delegates_code_runs_and_the_result_reaches_the_planner_and_user(tmp_path: Path, server: ScriptedServer) -> None:
    step = "Compute 6 times 7, store it in answer, and print it."
    server.enqueue("planner", planner_reply(step), planner_reply("The answer is 42.", send_to="User"))
    server.enqueue("code_generator", code_reply("answer = 6 * 7\nprint('value:', answer)\nanswer + 1"))
    with open_session(tmp_path, server) as session:
        rnd = session.ask("What is six times seven?")
    assert rnd.state == "finished" and rnd.answer == "The answer is 42."
    planner_calls, coder_calls = calls(server, "planner"), calls(server, "code_generator")
    assert "What is six times seven?" in last_user(planner_calls[0])
    assert "init_plan" in planner_calls[0][0]["content"]
    assert step in last_user(coder_calls[0]) and "reply_content" in coder_calls[0][0]["content"]
    report = last_user(planner_calls[1])
    assert "value: 42" in report and "43" in report, "the Planner must see the printed output and the result value"


def test_the_planner_keeps_an_earlier_requests_code_until_a_fold_lands(tmp_path: Path, server: ScriptedServer) -> None:
    first_code, second_code = "first_total = sum(range(10))\nprint('first:', first_total)", "second_total = 2 ** 10\nprint('second:', second_total)"
    server.enqueue("planner", planner_reply("Sum 0..9."), planner_reply("It is 45.", send_to="User"))
    server.enqueue("planner", planner_reply("Compute 2 ** 10."), planner_reply("It is 1024.", send_to="User"))
    server.enqueue("code_generator", code_reply(first_code), code_reply(second_code))
    with open_session(tmp_path, server, round_compressor={"rounds_to_compress": 2, "rounds_to_retain": 3}) as session:
        session.ask("Add up 0 to 9.")
        session.ask("What is 2 to the 10th?")
    planner_calls = calls(server, "planner")
    prompt = "\n".join(m["content"] for m in planner_calls[-1])
    assert "first: 45" in prompt and "first_total" in prompt, "an earlier request's output and variables must stay in the Planner's view"
    assert first_code in prompt, "with no fold since, an earlier request's code stays, so the prompt extends the one before it"
    assert planner_calls[1][-1] in planner_calls[2], "the first request's report must reach the next request's prompt byte for byte"
    assert second_code in prompt and "second: 1024" in prompt, "the current request's code and output must be in the Planner's prompt"
    assert "The execution succeeded." not in prompt, "the report already says the code ran; the plain outcome line is not repeated"


def test_an_earlier_requests_code_leaves_the_planners_prompt_when_a_fold_lands(tmp_path: Path, server: ScriptedServer) -> None:
    codes = [f"total_{n} = {n} * 10\nprint('total {n}:', total_{n})" for n in range(3)]
    for n in range(3):
        server.enqueue("planner", planner_reply(f"Compute {n} * 10."), planner_reply(f"It is {n * 10}.", send_to="User"))
    server.enqueue("code_generator", *(code_reply(code) for code in codes))
    server.set_default("compression", summary_reply("The user asked for products of ten.", []))
    sections = {"round_compressor": {"rounds_to_compress": 1, "rounds_to_retain": 1}}
    with open_session(tmp_path, server, **sections) as session:
        for n in range(3):
            session.ask(f"What is {n} times ten?")
            assert session.contexts()["planner"].wait_idle(timeout=10)
    prompt = "\n".join(m["content"] for m in calls(server, "planner")[-1])
    assert "total 1: 10" in prompt, "the retained round's output stays"
    assert codes[1] not in prompt, "a fold rewrote the prompt from the memory on, so the retained round goes without its code"
    assert codes[2] in prompt, "the current request's code stays"


def test_code_that_fails_is_revised_with_its_traceback(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("Print the total of [1, 2, 3]."), planner_reply("The total is 6.", send_to="User"))
    server.enqueue("code_generator", code_reply("print(totl)"), code_reply("print(sum([1, 2, 3]))"))
    with open_session(tmp_path, server) as session:
        rnd = session.ask("Add up 1, 2 and 3.")
    coder_calls = calls(server, "code_generator")
    assert len(coder_calls) == 2
    retry = last_user(coder_calls[1])
    assert "NameError" in retry and "Print the total of [1, 2, 3]." in retry
    report = last_user(calls(server, "planner")[1])
    assert "after 1 fixes" in report and "6" in report
    assert "Errors fixed on the way: NameError" in report, "the Planner hears what was fixed, in one line"
    assert "Traceback" not in report and "print(totl)" not in report, "but not the failed attempts themselves"
    assert rnd.answer == "The total is 6."


def test_after_the_last_retry_the_failure_goes_to_the_planner(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("Divide 1 by 0."), planner_reply("It cannot be done: division by zero.", send_to="User"))
    server.enqueue("code_generator", code_reply("1 / 0"), code_reply("1 // 0"))
    with open_session(tmp_path, server, code_interpreter={"max_retry_count": 1}) as session:
        session.ask("What is 1 divided by 0?")
    report = last_user(calls(server, "planner")[1])
    assert "still failed after 2 attempts" in report and "ZeroDivisionError" in report


def test_a_malformed_reply_gets_a_repair_turn_that_names_the_problem(tmp_path: Path, server: ScriptedServer) -> None:
    bad = '{"response": {"init_plan": "1. answer", "plan": "1. answer", "current_plan_step": "1", "send_to": "Boss", "message": "hi"}}'
    server.enqueue("planner", bad, planner_reply("Hello!", send_to="User"))
    with open_session(tmp_path, server) as session:
        rnd = session.ask("Say hello.")
    repair = last_user(calls(server, "planner")[1])
    assert "send_to" in repair and "Boss" in repair
    assert rnd.answer == "Hello!"


def test_repairs_run_out_the_round_fails_and_the_session_goes_on(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", *["this is not json"] * 3, planner_reply("Fine now.", send_to="User"))
    with open_session(tmp_path, server, session={"max_repair_attempts": 2}) as session:
        failed = session.ask("First request.")
        assert failed.state == "failed" and "repair turns" in (failed.error or "")
        ok = session.ask("Second request.")
    assert ok.state == "finished" and ok.answer == "Fine now."
    prompt = calls(server, "planner")[-1]
    assert not any("First request." in m["content"] for m in prompt), "failed rounds stay out of prompts"


def test_the_hop_limit_stops_the_turn_and_tells_the_user_why(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", *[planner_reply("Print 1.")] * 3)
    server.enqueue("code_generator", *[code_reply("print(1)")] * 2)
    with open_session(tmp_path, server, session={"max_internal_hops": 2}) as session:
        rnd = session.ask("Loop forever.")
    assert rnd.state == "finished"
    assert "stopped after 2 steps" in (rnd.answer or "") and "max_internal_hops" in (rnd.answer or "")


def test_a_text_reply_from_the_code_generator_goes_to_the_planner(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("Explain what a DataFrame is."), planner_reply("Explained.", send_to="User"))
    server.enqueue("code_generator", text_reply("A DataFrame is a table with labelled columns."))
    with open_session(tmp_path, server) as session:
        session.ask("What is a DataFrame?")
    assert "A DataFrame is a table with labelled columns." in last_user(calls(server, "planner")[1])


def test_the_code_generator_sees_the_kernels_live_variables(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue(
        "planner",
        planner_reply("Make a DataFrame df with columns a and b."),
        planner_reply("Done.", send_to="User"),
        planner_reply("Show df."),
        planner_reply("Shown.", send_to="User"),
    )
    server.enqueue("code_generator", code_reply("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [0.5, 1.5, 2.5]})"), code_reply("df"))
    with open_session(tmp_path, server) as session:
        session.ask("Make a small table.")
        session.ask("Show it.")
    prompt = "\n".join(m["content"] for m in calls(server, "code_generator")[1])
    assert "- df (pandas.DataFrame): shape (3, 2); columns: a int64, b float64" in prompt, prompt


def test_a_loaded_file_is_copied_and_announced_to_the_planner(tmp_path: Path, server: ScriptedServer) -> None:
    data = tmp_path / "numbers.csv"
    data.write_text("n\n1\n2\n")
    server.enqueue("planner", planner_reply("Got it.", send_to="User"))
    with open_session(tmp_path, server) as session:
        target = session.load_file(data)
        session.ask("I loaded some numbers.")
    assert target.read_text() == "n\n1\n2\n" and target.parent == session.working_dir
    prompt = calls(server, "planner")[0]
    assert "numbers.csv" in last_user(prompt)
    assert last_user(prompt).endswith("[Files in the working folder now: numbers.csv (6 B)]"), "the files are listed with the request"
    assert "numbers.csv" not in prompt[0]["content"], "a file saved must not change the system message (the cached prefix)"


def test_a_model_that_cannot_be_reached_fails_the_round_and_keeps_the_history(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", planner_reply("Hi.", send_to="User"))
    events: list[Event] = []
    with open_session(tmp_path, server, llm={"max_retries": 0, "timeout": 2}) as session:
        session.add_listener(events.append)
        assert session.ask("Hello.").answer == "Hi."
        server.stop()
        with pytest.raises(LLMUnreachableError) as error:
            session.ask("Are you there?")
        assert "127.0.0.1" in str(error.value)
        first, second = session.conversation.rounds
    assert first.state == "finished" and second.state == "failed"
    assert any(isinstance(e, PostAdded) and e.post.message == "Hi." for e in events)


def test_slow_and_failing_endpoints_are_retried_by_the_sdk(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue("planner", Reply(status=429), Reply(status=500), planner_reply("Made it.", send_to="User"))
    with open_session(tmp_path, server) as session:
        assert session.ask("Hello?").answer == "Made it."
        assert session.usage().calls == 1


def test_old_rounds_fold_in_the_background_and_the_summary_replaces_them(tmp_path: Path, server: ScriptedServer) -> None:
    from taskweaver_lite.testing.scripted_server import summary_reply

    for n in range(1, 4):
        server.enqueue("planner", planner_reply(f"Answer number {n}.", send_to="User"))
    server.set_default("compression", summary_reply("The user greeted us twice.", []))
    folds: list[Event] = []
    sections: dict[str, dict[str, object]] = {
        "round_compressor": {"rounds_to_compress": 1, "rounds_to_retain": 1},
        "code_generator": {"prompt_compression": False},
    }
    with open_session(tmp_path, server, **sections) as session:
        session.add_listener(folds.append)
        session.ask("Hello, first request.")
        session.ask("Hello, second request.")
        assert session.contexts()["planner"].wait_idle(timeout=10)
        session.ask("Third request.")
    compression = [r for r in server.requests if r.role == "compression"]
    folded = "\n".join(m["content"] for m in compression[0].messages)  # the Planner's prompt up to the folded round, then the ask
    assert "Hello, first request." in folded
    assert "Hello, second request." not in folded, "the retained round is not folded"
    third = calls(server, "planner")[-1]
    text = "\n".join(m["content"] for m in third)
    assert "The user greeted us twice." in third[1]["content"], "the summary goes into the memory message after the instructions"
    assert "Hello, first request." not in text and "Hello, second request." in text
    assert any(isinstance(e, Folded) and "Planner: folded round" in e.describe() for e in folds)


def test_a_dead_kernel_is_reported_and_the_code_generator_is_told_what_was_lost(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue(
        "planner",
        planner_reply("Set a = 1 and b = 2."),
        planner_reply("Set.", send_to="User"),
        planner_reply("Crash the kernel."),
        planner_reply("It crashed.", send_to="User"),
        planner_reply("Print a."),
        planner_reply("Done.", send_to="User"),
    )
    server.enqueue("code_generator", code_reply("a = 1\nb = 2"), code_reply("import os\nos._exit(1)"), code_reply("a = 1\nprint(a)"))
    with open_session(tmp_path, server) as session:
        session.ask("Make two variables.")
        session.ask("Crash it.")
        session.ask("Print a again.")
    crash_report = last_user(calls(server, "planner")[3])
    assert "kernel died" in crash_report and "a, b" in crash_report
    system = "\n".join(m["content"] for m in calls(server, "code_generator")[2])
    assert "Lost in a kernel restart (recompute before use): a, b" in system


def test_a_resume_brings_back_only_the_variables_the_stored_session_still_had_after_its_kernel_died(tmp_path: Path, server: ScriptedServer) -> None:
    steps = [("Set a = 1 and b = 2.", "a = 1\nb = 2"), ("Crash the kernel.", "import os\nos._exit(1)"), ("Set c = 3.", "c = 3")]
    for step, code in steps:
        server.enqueue("planner", planner_reply(step), planner_reply("Done.", send_to="User"))
        server.enqueue("code_generator", code_reply(code))
    with open_session(tmp_path, server) as session:
        for step, _ in steps:
            session.ask(step)
        had = {v.name for v in session.executor.variables()}
        session_id, config = session.id, session.config
    assert had == {"c"}, "precondition: the kernel that died took a and b with it"
    resumed, report = assembly.resume_session(config, session_id)
    with resumed:
        assert {v.name for v in resumed.executor.variables()} == had, "a resume rebuilds the kernel as the session had it, not as it was before the crash"
    assert report.replayed == 1


def test_a_repair_turn_keeps_the_planners_step_verbatim_in_the_last_user_message(tmp_path: Path, server: ScriptedServer) -> None:
    step = "  Print the sum of [1, 2].\n"  # surrounding whitespace must survive too
    server.enqueue("planner", planner_reply(step), planner_reply("3.", send_to="User"))
    server.enqueue("code_generator", "I think the answer is print(3)", code_reply("print(sum([1, 2]))"))
    with open_session(tmp_path, server) as session:
        session.ask("  Sum one and two.  ")
    first, repair = calls(server, "code_generator")
    assert step in last_user(first) and step in last_user(repair)
    assert "  Sum one and two.  " in last_user(calls(server, "planner")[0])


def test_a_reply_cut_off_at_the_output_limit_is_not_run_but_repaired(tmp_path: Path, server: ScriptedServer) -> None:
    cut = '{"response": {"thought": "loop", "reply_type": "python", "reply_content": "for x in range(3):'
    server.enqueue("planner", planner_reply("Print 0..2."), planner_reply("Printed.", send_to="User"))
    server.enqueue("code_generator", Reply(content=cut, finish_reason="length"), code_reply("for x in range(3):\n    print(x)"))
    with open_session(tmp_path, server) as session:
        rnd = session.ask("Count to two.")
    assert rnd.answer == "Printed."
    repair = last_user(calls(server, "code_generator")[1])
    assert "cut off" in repair
    report = last_user(calls(server, "planner")[1])
    assert "0\n1\n2" in report and "SyntaxError" not in report


def test_the_code_generator_sees_its_earlier_code_and_results_in_later_requests(tmp_path: Path, server: ScriptedServer) -> None:
    server.enqueue(
        "planner",
        planner_reply("Set total = 40 + 2 and print it."),
        planner_reply("42.", send_to="User"),
        planner_reply("Print total doubled."),
        planner_reply("84.", send_to="User"),
    )
    server.enqueue("code_generator", code_reply("total = 40 + 2\nprint('total is', total)"), code_reply("print(total * 2)"))
    with open_session(tmp_path, server) as session:
        session.ask("Make a total.")
        session.ask("Double it.")
    second = calls(server, "code_generator")[1]
    history = "\n".join(m["content"] for m in second[1:-1])
    assert "Set total = 40 + 2 and print it." in history, "the earlier step"
    assert "total = 40 + 2" in history and "total is 42" in history, "the earlier code and what it printed"
    assert [m["role"] for m in second[-4:]] == ["user", "assistant", "user", "user"], "step, code, result, then the new step"


class CountingExecutor:
    """Another executor behind the `Executor` protocol: the real kernel, with every call it gets counted."""

    def __init__(self, session_dir: Path, *, seen: list[str]) -> None:
        from taskweaver_lite.kernel.executor import KernelExecutor

        self.inner = KernelExecutor(session_dir, config=ExecutionConfig(timeout=30))
        self.seen = seen

    @property
    def working_dir(self) -> Path:
        return self.inner.working_dir

    def upload(self, source: Path, *, name: str | None = None) -> str:
        self.seen.append(f"upload {source.name}")
        return self.inner.upload(source, name=name)

    def artifact(self, name: str) -> Path:
        return self.inner.artifact(name)

    def run(self, code: str, *, timeout: float | None = None, on_output: OutputSink | None = None) -> ExecutionResult:
        self.seen.append(f"run {code}")
        return self.inner.run(code, timeout=timeout, on_output=on_output)

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
        self.seen.append("shutdown")
        self.inner.shutdown()


def test_a_caller_passes_its_own_executor_and_the_session_uses_only_the_protocol(tmp_path: Path, server: ScriptedServer) -> None:
    seen: list[str] = []
    server.enqueue("planner", planner_reply("Set n = 5."), planner_reply("n is 5.", send_to="User"))
    server.enqueue("code_generator", code_reply("n = 5"))
    data = tmp_path / "numbers.csv"
    data.write_text("a\n1\n", encoding="utf-8")
    config = load_config(make_project(tmp_path, server.url))
    with assembly.open_session(config, executor=lambda folder: CountingExecutor(folder, seen=seen)) as session:
        loaded = session.load_file(data)
        assert session.ask("Make n.").answer == "n is 5."
        assert [v.name for v in session.live_variables().variables] == ["n"]
        assert loaded == session.working_dir / "numbers.csv" and loaded.is_file()
    assert seen == ["upload numbers.csv", "run n = 5", "shutdown"]
