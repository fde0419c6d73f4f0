"""The remote executor against a real Jupyter Kernel Gateway on 127.0.0.1: cells, faults, uploads, a whole session."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from helpers import REPO, make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import ExecutionConfig, KernelGatewayConfig
from taskweaver_lite.errors import ConfigError, GatewayAuthError, GatewayUnreachableError
from taskweaver_lite.kernel.base import REPLY_WAIT
from taskweaver_lite.kernel.choice import executor_factory
from taskweaver_lite.kernel.executor import KernelExecutor
from taskweaver_lite.kernel.gateway import remote
from taskweaver_lite.kernel.gateway.kernel import GatewayKernel
from taskweaver_lite.kernel.gateway.remote import GatewayExecutor
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.testing.kernel_gateway import Gateway, Relay, free_port, kernel_gateway
from taskweaver_lite.testing.scripted_server import ScriptedServer, code_reply, planner_reply

pytestmark = pytest.mark.kernel

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    with kernel_gateway(tmp_path_factory.mktemp("gateway")) as running:
        yield running


@pytest.fixture(scope="module")
def executor(gateway: Gateway, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayExecutor]:
    """One remote kernel shared by the module's executor tests (each sets up the variables it relies on)."""
    with connect(gateway, tmp_path_factory.mktemp("sessions") / "shared") as running:
        running.wait_ready()
        yield running


def connect(gateway: Gateway, session_dir: Path, *, url: str | None = None, token: str | None = None, timeout: float = 30) -> GatewayExecutor:
    config = KernelGatewayConfig(url=url or gateway.url, token=gateway.token if token is None else token, connect_timeout=5)
    return GatewayExecutor(session_dir, config=ExecutionConfig(timeout=timeout), gateway=config)


def kernel_status(gateway: Gateway, kernel_id: str | None) -> int:
    """The HTTP status of the gateway's kernel resource (its kernel listing is off by default)."""
    return requests.get(f"{gateway.url}/api/kernels/{kernel_id}", headers={"Authorization": f"token {gateway.token}"}, timeout=5).status_code


def kernel_pid(executor: GatewayExecutor) -> int:
    return int(executor.run("import os; os.getpid()").result or "0")


def test_cells_keep_variables_in_the_sessions_folder_on_the_gateway(executor: GatewayExecutor, gateway: Gateway) -> None:
    first = executor.run("import os\nrows = [1, 2, 3]\nprint('total', sum(rows))\nlen(rows)")
    assert first.success and first.stdout == "total 6\n" and first.result == "3"
    assert first.changes.created == ("rows",) and [v.name for v in executor.variables()] == ["rows"]
    second = executor.run("rows.append(4); os.chdir('/'); os.getcwd()")
    assert second.success and second.changes.changed == ("rows",)
    home = gateway.root / "taskweaver_sessions" / "shared"
    assert executor.home == str(home) and any("set back to" in n for n in second.notices)
    assert executor.run("os.getcwd()").result == repr(str(home))


def test_the_gateway_kernels_libraries_are_asked_at_its_start(gateway: Gateway, tmp_path: Path) -> None:
    with connect(gateway, tmp_path / "fresh") as fresh:
        fresh.wait_ready()  # started, and nothing asked of it since
        assert fresh.libraries[:3] == ("pandas", "numpy", "matplotlib"), "the kernel's libraries were not asked when it started"
        environment = fresh.environment()
    assert environment.libraries == fresh.libraries and environment.mounts == ()


def test_an_error_comes_back_with_its_traceback_and_the_snapshot_stays_current(executor: GatewayExecutor) -> None:
    result = executor.run("made_before_error = 5\n1 / 0")
    assert not result.success and result.error is not None and result.error.name == "ZeroDivisionError"
    assert "made_before_error" in result.changes.created


def test_output_is_bounded_for_prompts_with_the_whole_of_it_in_the_local_session_folder(executor: GatewayExecutor) -> None:
    result = executor.run("for i in range(20000):\n    print('line', i)")
    assert result.success and result.full_output_path is not None and "line 19999" in result.stdout
    assert len(result.stdout) < 20000 * 10 and Path(result.full_output_path).parent == executor.session_dir / "outputs"
    assert "line 10000\n" in Path(result.full_output_path).read_text(encoding="utf-8")


def test_a_timeout_interrupts_the_cell_and_keeps_the_variables(executor: GatewayExecutor) -> None:
    executor.run("kept = 'yes'")
    result = executor.run("import time\ntime.sleep(30)", timeout=1)
    assert result.timed_out and not result.kernel_died and result.elapsed < 5
    assert executor.run("kept").result == "'yes'"


def test_interrupt_from_another_thread_stops_the_cell(executor: GatewayExecutor) -> None:
    threading.Timer(0.7, executor.interrupt).start()
    result = executor.run("import time\ntime.sleep(30)")
    assert result.interrupted and not result.timed_out and result.elapsed < 5


def test_a_plot_comes_back_as_a_file_in_the_local_session_folder(executor: GatewayExecutor) -> None:
    result = executor.run("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()")
    assert result.success and len(result.artifacts) == 1
    path = executor.artifact(Path(result.artifacts[0]).name)
    assert path.parent == executor.session_dir / "artifacts" and path.read_bytes().startswith(PNG_MAGIC)


def test_upload_streams_a_file_into_the_kernels_folder_in_chunks(executor: GatewayExecutor, tmp_path: Path) -> None:
    data = os.urandom(2 * remote.UPLOAD_CHUNK + 123)  # three chunks, the last one short
    source = tmp_path / "blob.bin"
    source.write_bytes(data)
    assert executor.upload(source, name="copy.bin") == "copy.bin"
    digest = executor.run("import hashlib\nhashlib.sha256(open('copy.bin', 'rb').read()).hexdigest()").result
    assert digest == repr(hashlib.sha256(data).hexdigest())
    assert not (Path(executor.home) / "copy.bin.part").exists()


def failing_cell_of_another_client(gateway: Gateway, kernel_id: str) -> GatewayKernel:
    """A second client of the kernel (a notebook, say) runs a cell that fails after a second, with `stop_on_error` as front ends send it.

    Returns once the kernel has begun that cell: what arrives meanwhile queues behind it, and ipykernel
    aborts it when the cell fails.
    """
    other = GatewayKernel(KernelGatewayConfig(url=gateway.url, token=gateway.token, connect_timeout=5))
    assert other.attach(kernel_id)
    other.connect()
    content = {"code": "import time\ntime.sleep(1)\n1 / 0", "silent": False, "user_expressions": {}, "allow_stdin": False, "stop_on_error": True}
    msg_id = other.send("shell", "execute_request", content)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        msg = other.receive(1.0)
        if msg is not None and msg.get("msg_type") == "execute_input" and msg["parent_header"].get("msg_id") == msg_id:
            return other
    raise AssertionError("the other client's cell did not start")


def test_an_upload_and_a_cell_queued_behind_another_clients_failed_cell_are_sent_again_or_named_not_run(gateway: Gateway, tmp_path: Path) -> None:
    data = os.urandom(remote.UPLOAD_CHUNK + 5)
    source = tmp_path / "blob.bin"
    source.write_bytes(data)
    with connect(gateway, tmp_path / "shared-kernel") as executor:
        executor.wait_ready()
        assert executor.kernel_id is not None
        other = failing_cell_of_another_client(gateway, executor.kernel_id)
        assert executor.upload(source, name="copy.bin") == "copy.bin", "an upload the kernel dropped unrun was not sent again"
        assert (Path(executor.home) / "copy.bin").read_bytes() == data
        other.disconnect()
        other = failing_cell_of_another_client(gateway, executor.kernel_id)
        result = executor.run("made = 1")
        other.disconnect()
        assert not result.success and result.error is not None and "did not run" in result.error.value and "None" not in result.error.value
        assert executor.run("made = 2; made").result == "2"


def test_a_kernel_killed_mid_cell_is_noticed_restarted_and_the_lost_variables_named(gateway: Gateway, tmp_path: Path) -> None:
    with connect(gateway, tmp_path / "killed") as executor:
        executor.run("precious = 42")
        pid = kernel_pid(executor)
        threading.Timer(0.5, os.kill, (pid, signal.SIGKILL)).start()
        result = executor.run("import time\ntime.sleep(30)")
        assert result.kernel_died and "precious" in result.lost_variables and result.elapsed < 10
        after = executor.run("fresh = 1")
        assert after.success and [v.name for v in after.variables] == ["fresh"], "the helpers are loaded again in the new kernel"
        assert kernel_pid(executor) != pid


def test_a_kernel_killed_between_cells_is_named_on_the_next_cell(gateway: Gateway, tmp_path: Path) -> None:
    with connect(gateway, tmp_path / "killed-idle") as executor:
        executor.run("precious = 42")
        os.kill(kernel_pid(executor), signal.SIGKILL)
        time.sleep(4)  # the gateway checks its kernels every 3 s
        result = executor.run("1 + 1")
        assert result.kernel_died and "precious" in result.lost_variables and result.result == "2"


def test_restart_names_the_lost_variables_and_shutdown_ends_the_kernel(gateway: Gateway, tmp_path: Path) -> None:
    executor = connect(gateway, tmp_path / "restart")
    executor.run("a = 1\nb = 2")
    assert executor.restart() == ("a", "b") and executor.variables() == ()
    assert executor.run("c = 3").variables[0].name == "c"
    kernel_id = executor.kernel.kernel_id
    assert kernel_status(gateway, kernel_id) == 200
    executor.shutdown()
    assert kernel_status(gateway, kernel_id) == 404


def test_extra_headers_reach_both_the_rest_calls_and_the_websocket(gateway: Gateway, tmp_path: Path) -> None:
    config = KernelGatewayConfig(url=gateway.url, headers={"Authorization": f"token {gateway.token}"})
    with GatewayExecutor(tmp_path / "headers", config=ExecutionConfig(), gateway=config) as executor:
        assert executor.run("6 * 7").result == "42"


def test_a_wrong_token_says_so(gateway: Gateway, tmp_path: Path) -> None:
    with connect(gateway, tmp_path / "bad-token", token="not-the-token") as executor, pytest.raises(GatewayAuthError) as caught:
        executor.wait_ready()
    assert f"The kernel gateway {gateway.url} refused the token (HTTP 401)" in str(caught.value)
    assert "execution.kernel_gateway.token" in str(caught.value)


def test_an_unreachable_gateway_names_the_url(gateway: Gateway, tmp_path: Path) -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    with connect(gateway, tmp_path / "nowhere", url=nowhere) as executor, pytest.raises(GatewayUnreachableError) as caught:
        executor.wait_ready()
    assert str(caught.value).startswith(f"Cannot reach the kernel gateway {nowhere} (")
    assert "execution.kernel_gateway.url" in str(caught.value)


@pytest.fixture
def relay(gateway: Gateway) -> Iterator[Relay]:
    through = Relay(int(gateway.url.rsplit(":", 1)[1]))
    yield through
    through.close()


def test_a_connection_dropped_mid_cell_reconnects_and_the_cell_finishes(gateway: Gateway, relay: Relay, tmp_path: Path) -> None:
    with connect(gateway, tmp_path / "dropped", url=f"http://127.0.0.1:{relay.port}") as executor:
        executor.run("kept = 1")
        threading.Timer(0.5, relay.drop).start()
        result = executor.run("import time\ntime.sleep(1.5)\nprint('after the drop')\nkept + 1")
        assert result.success and result.stdout == "after the drop\n" and result.result == "2"


def test_a_gateway_that_stops_answering_during_a_cell_ends_the_request_and_the_session_goes_on_after(gateway: Gateway, relay: Relay, tmp_path: Path) -> None:
    with connect(gateway, tmp_path / "cut", url=f"http://127.0.0.1:{relay.port}") as executor:
        executor.run("kept = 1")

        def cut() -> None:
            relay.refuse = True
            relay.drop()

        threading.Timer(0.5, cut).start()
        with pytest.raises(GatewayUnreachableError) as raised:
            executor.run("import time\ntime.sleep(1.5)")
        assert f"The kernel gateway http://127.0.0.1:{relay.port} stopped answering during this cell, so its outcome is unknown" in str(raised.value)
        relay.refuse = False
        assert executor.run("kept + 1").result == "2", "the next cell reconnects to the same kernel"


def test_a_session_runs_loads_and_resumes_on_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    settings = {"kernel_gateway": {"url": gateway.url, "token": gateway.token}}
    with ScriptedServer() as server:
        project = make_project(tmp_path, server.url, execution=settings)
        config = load_config(project)
        server.enqueue("planner", planner_reply("Sum the column."), planner_reply("The total is 6.", send_to="User"))
        server.enqueue("code_generator", code_reply("import pandas as pd\ntable = pd.read_csv('numbers.csv')\ntotal = int(table['n'].sum())\nprint(total)"))
        data = tmp_path / "numbers.csv"
        data.write_text("n\n1\n2\n3\n", encoding="utf-8")
        with open_session(config) as session:
            assert isinstance(session.executor, GatewayExecutor)
            session.load_file(data)
            rnd = session.ask("What is the total of numbers.csv?")
            assert rnd.state == "finished" and rnd.answer == "The total is 6."
            assert any("numbers.csv" in m["content"] for r in server.requests if r.role == "planner" for m in r.messages)
            home = Path(session.executor.home)
        assert (home / "numbers.csv").read_text(encoding="utf-8") == "n\n1\n2\n3\n"
        resumed, report = resume_session(config, "last")
        with resumed:
            assert report.replayed == 1 and report.replay_failures == 0
            assert {"table", "total"} <= {v.name for v in resumed.executor.variables()}


def test_sigterm_to_the_owning_process_shuts_the_kernel_down_on_the_gateway(gateway: Gateway, tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from taskweaver_lite.config.settings import ExecutionConfig, KernelGatewayConfig
        from taskweaver_lite.kernel.gateway.remote import GatewayExecutor
        gateway = KernelGatewayConfig(url={gateway.url!r}, token={gateway.token!r})
        executor = GatewayExecutor(Path({str(tmp_path)!r}), config=ExecutionConfig(), gateway=gateway)
        executor.wait_ready()
        print(executor.kernel.kernel_id, flush=True)
        time.sleep(60)
        """
    )
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) as owner:
        assert owner.stdout is not None
        kernel_id = owner.stdout.readline().strip()
        assert kernel_status(gateway, kernel_id) == 200
        owner.send_signal(signal.SIGTERM)
        assert owner.wait(timeout=10) == -signal.SIGTERM
    assert kernel_status(gateway, kernel_id) == 404


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"url": "bigbox:8888"}, "key 'execution.kernel_gateway.url': value error, expected an http:// or https:// address such as http://bigbox:8888"),
        ({"url": "http://bigbox:8888", "connect_timeout": 0}, "execution.kernel_gateway.connect_timeout"),
        ({"token": "t"}, "execution.kernel_gateway.url"),
    ],
)
def test_gateway_settings_are_checked_with_the_key_named(tmp_path: Path, settings: dict[str, object], message: str) -> None:
    project = make_project(tmp_path, "http://127.0.0.1:9/v1", execution={"kernel_gateway": settings})
    with pytest.raises(ConfigError) as caught:
        load_config(project)
    assert message in str(caught.value)


def test_no_gateway_means_the_local_kernel(tmp_path: Path) -> None:
    config = load_config(make_project(tmp_path, "http://127.0.0.1:9/v1"))
    assert config.execution.kernel_gateway is None
    executor = executor_factory(config)(tmp_path / "local")
    try:
        assert isinstance(executor, KernelExecutor)
    finally:
        executor.shutdown()


def test_plugins_are_loaded_on_the_gateways_kernel_and_come_back_after_a_restart(gateway: Gateway, tmp_path: Path) -> None:
    from taskweaver_lite.plugins.catalog import discover

    plugins = discover(REPO / "project").enabled
    assert {p.name for p in plugins} >= {"sql_pull", "anomaly_detection"}
    settings = KernelGatewayConfig(url=gateway.url, token=gateway.token)
    with GatewayExecutor(tmp_path / "session", config=ExecutionConfig(timeout=30), gateway=settings, plugins=plugins) as executor:
        shown = executor.run("print(type(anomaly_detection).__name__, callable(sql_pull))")
        assert shown.success and shown.stdout.split() == ["AnomalyDetection", "True"], shown.prompt_text()
        assert executor.plugin_failures == ()
        assert "anomaly_detection" not in {v.name for v in executor.variables()}, "plugins are not user variables"
        executor.restart()
        assert executor.run("callable(anomaly_detection)").result == "True", "plugins come back after a restart"


def test_a_cell_after_the_gateway_pinged_an_idle_kernel_runs_at_once(tmp_path: Path) -> None:
    (tmp_path / "gateway").mkdir()
    with kernel_gateway(tmp_path / "gateway", options=["--KernelGatewayApp.ws_ping_interval=1"]) as pinging:
        executor = connect(pinging, tmp_path / "s")
        try:
            assert executor.run("x = 1").success
            time.sleep(2.5)  # idle: the gateway's pings wait on the socket, and nothing after them
            started = time.monotonic()
            assert executor.run("print(x + 1)").stdout.strip() == "2"
            waited = time.monotonic() - started
            assert waited < REPLY_WAIT, f"the cell waited {waited:.1f} s behind a ping for a message that never came"
        finally:
            executor.shutdown()


def test_a_copy_brought_up_to_date_reads_what_the_other_copy_ran_and_its_next_cells_output_arrives_even_after_a_restart(
    gateway: Gateway, tmp_path: Path
) -> None:
    # Two replicas' copies of one session, each on its own connection to the one kernel.
    config = KernelGatewayConfig(url=gateway.url, token=gateway.token, connect_timeout=5)
    first = GatewayExecutor(tmp_path / "session", config=ExecutionConfig(timeout=30), gateway=config, kernel=remote.KernelHandover(keep=True))
    try:
        first.run("a = 1")
        second = GatewayExecutor(
            tmp_path / "copy" / "session",
            config=ExecutionConfig(timeout=30),
            gateway=config,
            kernel=remote.KernelHandover(reuse=first.kernel_id, keep=True, cells_before=1),
        )
        try:
            assert second.kept_variables()
            first.run("b = 2\nprint('from the first copy')")  # what its connection hears meanwhile is dropped
            assert second.catch_up(first.kernel_id, cells_before=2)
            assert {"a", "b"} <= {v.name for v in second.variables()}, "the variables the other copy made"
            assert second.run("print('after', a + b)").stdout.strip() == "after 3", "and the next cell's output comes back"
            first.restart()  # the other copy restarts the kernel: its output channel is remade
            assert second.catch_up(first.kernel_id, cells_before=3)
            assert not {"a", "b"} & {v.name for v in second.variables()}
            for n in range(3):
                assert second.run(f"print('cell', {n})").stdout.strip() == f"cell {n}", "no output lost after the restart"
        finally:
            second.shutdown()
    finally:
        first.handover = remote.KernelHandover()  # end the kernel with the first copy
        first.shutdown()
