"""Tracing: one trace per request with GenAI spans for model calls, folds in the request's trace, content only when asked,
serve continuing a caller's traceparent, and nothing of OpenTelemetry loaded with tracing off.

Spans go over the real exporter to an OTLP/HTTP receiver in a thread (taskweaver_lite/testing/otlp_receiver.py);
tests/test_tracing_phoenix.py sends them to Arize Phoenix and reads them back from it.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import REPO, IdleExecutor, make_project
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from taskweaver_lite import telemetry
from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import TracingConfig
from taskweaver_lite.errors import ConfigError, LLMAuthError
from taskweaver_lite.eval.cases import load_cases
from taskweaver_lite.eval.matrix import Setting
from taskweaver_lite.eval.runner import EvalPlan, run_eval
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.records.model_calls import Usage
from taskweaver_lite.session.workspace import Workspace
from taskweaver_lite.store.interface import User
from taskweaver_lite.telemetry import otel, tracing
from taskweaver_lite.testing import eval_script
from taskweaver_lite.testing.otlp_receiver import OtlpReceiver, ReceivedSpan
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer, code_reply, planner_reply, summary_reply
from taskweaver_lite.web.trace_context import TraceMiddleware

pytestmark = pytest.mark.unit

REQUEST = "Compute the zebra-quartz total"  # words no prompt or reply contains unless the request put them there
CODE = "zebra_quartz_total = 41 + 1"
CLIENT_SPAN, SERVER_SPAN = 3, 2


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as rec:
        yield rec


def traced_turn(
    tmp_path: Path, server: ScriptedServer, receiver: OtlpReceiver, *, content: bool, **sections: dict[str, object]
) -> tuple[list[ReceivedSpan], Usage]:
    """One request (Planner -> CodeInterpreter -> Planner), its folds waited for; the spans the receiver got, and the session's usage."""
    project = make_project(tmp_path, server.url, tracing={"enabled": True, "endpoint": receiver.url, "content": content}, **sections)
    server.enqueue("planner", planner_reply("Add the numbers."), planner_reply("The total is 42.", send_to="User"))
    server.enqueue("code_generator", code_reply(CODE))
    server.set_default("compression", summary_reply("The user totalled numbers.", [{"name": "zebra_quartz_total", "type": "int", "description": "42"}]))
    with Workspace(load_config(project)) as workspace:
        session = workspace.new_session(executor=IdleExecutor)
        try:
            assert session.ask(REQUEST).answer == "The total is 42."
            for context in session.contexts().values():
                assert context.wait_idle(timeout=30)
            assert session.tracer is not None and session.tracer.flush()
            usage = session.usage()
        finally:
            session.close()
    return receiver.wait_for("turn"), usage


def test_a_request_is_one_trace_with_a_genai_span_per_model_call_and_no_prompt_text(tmp_path: Path, server: ScriptedServer, receiver: OtlpReceiver) -> None:
    spans, usage = traced_turn(tmp_path, server, receiver, content=False)
    (turn,) = [span for span in spans if span.name == "turn"]
    assert {span.trace_id for span in spans} == {turn.trace_id}, "every span of the request shares its trace"
    assert turn.parent_span_id == "" and turn.attributes["taskweaver.round.state"] == "finished"
    calls = [span for span in spans if span.name == "chat scripted"]
    assert [call.attributes["taskweaver.role"] for call in calls] == ["planner", "code_generator", "planner"]
    for call in calls:
        assert call.kind == CLIENT_SPAN and call.attributes["gen_ai.operation.name"] == "chat"
        assert call.attributes["gen_ai.request.model"] == "scripted" and call.attributes["gen_ai.provider.name"] == "openai"
        assert call.attributes["gen_ai.usage.input_tokens"] > 0 and call.attributes["gen_ai.usage.output_tokens"] > 0
        assert 0 <= call.attributes["gen_ai.usage.cache_read.input_tokens"] <= call.attributes["gen_ai.usage.input_tokens"]
    assert sum(call.attributes["gen_ai.usage.input_tokens"] for call in calls) == usage.prompt_tokens
    assert sum(call.attributes["gen_ai.usage.output_tokens"] for call in calls) == usage.completion_tokens
    assert sum(call.attributes["gen_ai.usage.cache_read.input_tokens"] for call in calls) == usage.cached_tokens > 0, "the server's cache hits"
    agents = {span.span_id: span.attributes["gen_ai.agent.name"] for span in spans if span.name.startswith("invoke_agent ")}
    assert [agents[call.parent_span_id] for call in calls] == ["Planner", "CodeInterpreter", "Planner"], "each call sits under the role that made it"
    assert turn.service == "taskweaver-lite" and all(span.attributes.get("taskweaver.session.id") for span in spans if span.name == "turn")
    wire = b"".join(receiver.bodies)
    # The request, the code, the replies and the system prompt: none of it left the process.
    for text in ("zebra", "quartz", "Add the numbers", "The total is 42", "You are the Planner"):
        assert text.encode() not in wire, f"{text!r} was sent with tracing.content off"


def test_a_fold_is_a_span_in_the_trace_of_the_request_whose_rounds_it_folds(tmp_path: Path, server: ScriptedServer, receiver: OtlpReceiver) -> None:
    spans, _ = traced_turn(tmp_path, server, receiver, content=False, round_compressor={"rounds_to_compress": 1, "rounds_to_retain": 0})
    (turn,) = [span for span in spans if span.name == "turn"]
    folds = [span for span in spans if span.name == "fold planner"]
    assert len(folds) == 1, [span.name for span in spans]
    assert folds[0].trace_id == turn.trace_id, "the fold's thread stays in the request's trace"
    assert folds[0].attributes["taskweaver.fold.ok"] is True and folds[0].attributes["taskweaver.role"] == "planner (fold)"
    (fold_call,) = [span for span in spans if span.parent_span_id == folds[0].span_id]
    assert fold_call.name == "chat scripted" and fold_call.attributes["taskweaver.role"] == "planner (fold)"


def test_content_on_records_the_request_the_prompts_and_the_replies(tmp_path: Path, server: ScriptedServer, receiver: OtlpReceiver) -> None:
    spans, _ = traced_turn(tmp_path, server, receiver, content=True)
    (turn,) = [span for span in spans if span.name == "turn"]
    assert turn.attributes["taskweaver.request"] == REQUEST
    first = next(span for span in spans if span.name == "chat scripted")
    prompt = json.loads(first.attributes["gen_ai.input.messages"])
    assert prompt[-1]["role"] == "user" and REQUEST in prompt[-1]["parts"][0]["content"]
    reply = json.loads(first.attributes["gen_ai.output.messages"])
    assert reply[0]["role"] == "assistant" and "Add the numbers." in reply[0]["parts"][0]["content"]


def test_a_failed_model_call_marks_its_span_with_the_error_class_only(tmp_path: Path, server: ScriptedServer, receiver: OtlpReceiver) -> None:
    project = make_project(tmp_path, server.url, tracing={"enabled": True, "endpoint": receiver.url}, llm={"max_retries": 0})
    server.enqueue("planner", Reply(status=401, error_message="the key zebra-quartz is wrong"))
    with Workspace(load_config(project)) as workspace:
        session = workspace.new_session(executor=IdleExecutor)
        try:
            with pytest.raises(LLMAuthError):
                session.ask(REQUEST)
            assert session.tracer is not None and session.tracer.flush()
        finally:
            session.close()
    spans = receiver.wait_for("turn")
    (call,) = [span for span in spans if span.name == "chat scripted"]
    assert call.status_code == 2 and call.attributes["error.type"] == "LLMAuthError"
    assert b"zebra" not in b"".join(receiver.bodies), "an error's message can quote the prompt: it goes out only with content on"


@pytest.mark.kernel
def test_a_cell_is_a_span_naming_its_session_with_its_code_and_output_only_with_content_on(kernel_executor: KernelExecutor, receiver: OtlpReceiver) -> None:
    for content in (False, True):
        tracer = otel.tracer(TracingConfig(enabled=True, endpoint=receiver.url, content=content))
        with tracing.turn(tracer, session_id="cells", request="r"):
            assert kernel_executor.run("zebra_quartz = 41 + 1\nprint(zebra_quartz)").stdout == "42\n"
            assert not kernel_executor.run("1 / 0").success
        assert tracer.flush()
        if not content:
            assert b"zebra" not in b"".join(receiver.bodies), "the cells run with content off sent no code"
    cells = [span for span in receiver.wait_for("cell") if span.name == "cell"]
    assert [(cell.attributes["taskweaver.cell.success"], cell.attributes.get("taskweaver.cell.error")) for cell in cells] == [
        (True, None),
        (False, "ZeroDivisionError"),
    ] * 2
    assert {cell.attributes["taskweaver.session.id"] for cell in cells} == {kernel_executor.session_dir.name}
    assert [cell.attributes.get("taskweaver.cell.code") for cell in cells] == [None, None, "zebra_quartz = 41 + 1\nprint(zebra_quartz)", "1 / 0"]
    assert cells[2].attributes["taskweaver.cell.output"] == "42\n" and "division by zero" in cells[3].attributes["taskweaver.cell.error_message"]


@pytest.mark.kernel
def test_each_turn_of_an_eval_case_is_a_trace_of_its_own(tmp_path: Path, receiver: OtlpReceiver) -> None:
    settings = {"enabled": True, "endpoint": receiver.url}
    with eval_script.scripted_eval_server() as scripted:
        project = make_project(tmp_path, scripted.url, llm={"max_retries": 0}, tracing=settings)
        [outcome] = run_eval(
            load_cases([REPO / "tests" / "data" / "taskweaver_cases" / "calc_mean"]), EvalPlan(project, tmp_path / "report", (Setting("project"),))
        )
    assert outcome.status == "scored" and outcome.rounds == 1, outcome.reason
    assert otel.tracer(TracingConfig(**settings)).flush()
    spans = receiver.wait_for("turn")
    (turn,) = [span for span in spans if span.name == "turn"]
    calls = [span for span in spans if span.name.startswith("chat ")]
    assert calls and {call.trace_id for call in calls} == {turn.trace_id}, "the case's turn is one trace with its model calls"
    assert turn.attributes["taskweaver.session.id"] == outcome.session_id


def test_serve_continues_the_traceparent_a_request_carries_into_the_thread_that_answers_it(receiver: OtlpReceiver) -> None:
    tracer = otel.tracer(TracingConfig(enabled=True, endpoint=receiver.url))
    done = threading.Event()

    async def ask(request: Request) -> JSONResponse:
        request.state.user = User(name="ana", admin=False, created_at=0.0, id="3f2a")  # as the sign-in check leaves it

        def answer() -> None:  # the request's turn runs on its own thread, as web/live.py starts it
            with tracing.turn(tracing.active(), session_id="s", request="hidden"):
                done.set()

        threading.Thread(target=tracing.carried(answer)).start()
        return JSONResponse({})

    routes = [Route("/api/sessions/{id}/messages", ask, methods=["POST"]), Route("/healthz", ask)]
    app = Starlette(routes=routes)
    app.add_middleware(TraceMiddleware, tracer=tracer, routes=routes)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with TestClient(app) as client:
        assert client.post("/api/sessions/abc/messages", headers={"traceparent": f"00-{trace_id}-{parent}-01"}).status_code == 200
        assert client.get("/healthz").status_code == 200
    assert done.wait(10) and tracer.flush()
    spans = receiver.wait_for("turn")
    (served,) = [span for span in spans if span.kind == SERVER_SPAN]
    assert served.name == "POST /api/sessions/{id}/messages" and served.attributes["http.response.status_code"] == 200
    assert served.trace_id == trace_id and served.parent_span_id == parent, "the caller's trace goes on"
    assert served.attributes["enduser.id"] == "ana", "who asked, by name"
    assert served.resource["service.instance.id"] == f"{socket.gethostname()}:{os.getpid()}", "which replica answered"
    (turn,) = [span for span in spans if span.name == "turn"]
    assert turn.trace_id == trace_id and turn.parent_span_id == served.span_id
    assert len(spans) == 2, "/healthz is not traced"


@pytest.mark.cli  # a fresh interpreter, started as a command: not the quick tier
def test_with_tracing_off_nothing_of_opentelemetry_is_loaded() -> None:
    probe = (
        "import sys\n"
        "import taskweaver_lite.web.app, taskweaver_lite.session.session, taskweaver_lite.eval.runner, taskweaver_lite.cli.main\n"
        "from taskweaver_lite.config.settings import Config\n"
        "from taskweaver_lite.telemetry import tracing\n"
        "assert tracing.tracer_for(Config().tracing) is None\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry') or m == 'taskweaver_lite.telemetry.otel'))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == "[]"


def test_tracing_on_without_the_extra_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "taskweaver_lite.telemetry.otel", raising=False)
    monkeypatch.delattr(telemetry, "otel", raising=False)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)  # as if not installed: importing it raises ImportError
    with pytest.raises(ConfigError) as caught:
        tracing.tracer_for(TracingConfig(enabled=True))
    message = str(caught.value)
    assert "\n" not in message and "tracing.enabled" in message and "pip install 'taskweaver-lite[tracing]'" in message, message


@pytest.mark.parametrize(("text", "problem"), [("endpoint: 127.0.0.1:4318", "http:// or https://"), ("enabled: maybe", "boolean"), ("colour: red", "")])
def test_a_bad_tracing_setting_is_one_line_naming_the_file_and_the_key(tmp_path: Path, text: str, problem: str) -> None:
    (tmp_path / "taskweaver_config.yaml").write_text(f"tracing:\n  {text}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path)
    message = str(caught.value)
    key = "tracing." + text.partition(":")[0]
    assert "\n" not in message and "taskweaver_config.yaml" in message and key in message and problem in message, message


def test_an_endpoint_is_a_base_address_under_which_traces_go_to_v1_traces() -> None:
    assert otel.traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces"
    assert otel.traces_url("http://collector:4318/") == "http://collector:4318/v1/traces"
    assert otel.traces_url("https://collector/otlp/v1/traces") == "https://collector/otlp/v1/traces", "a full traces address is taken as it is"
    assert otel.traces_url(None) is None, "unset: the exporter reads OTEL_EXPORTER_OTLP_ENDPOINT"
