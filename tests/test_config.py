"""The typed configuration: settings that cannot hold together are refused, each pair in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taskweaver_lite.config.file import load_config
from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError

pytestmark = pytest.mark.unit

GATEWAY = "execution:\n  kernel_gateway: {url: 'http://bigbox:8888'}\n"


def project_with(tmp_path: Path, text: str) -> Path:
    project = tmp_path / "project"
    project.mkdir()
    (project / "taskweaver_config.yaml").write_text(text)
    return project


@pytest.mark.parametrize(
    ("text", "overrides", "named"),
    [
        (GATEWAY, ["execution.sandbox=bubblewrap"], ["--set execution.sandbox=bubblewrap", "execution.sandbox: bubblewrap and execution.kernel_gateway"]),
        (GATEWAY + "  network: true\n", [], ["taskweaver_config.yaml", "execution.network: true and execution.kernel_gateway"]),
        (GATEWAY + "  memory_limit: 4GB\n", [], ["execution.memory_limit: 4GB and execution.kernel_gateway"]),
        (GATEWAY + "  max_processes: 64\n", [], ["execution.max_processes: 64 and execution.kernel_gateway"]),
        (GATEWAY + "  disk_limit: 2GB\n", [], ["execution.disk_limit: 2GB and execution.kernel_gateway"]),
        ("planner:\n  prompt_compression: false\n  strategy: summary_buffer\n", [], ["planner.prompt_compression: false and planner.strategy: summary_buffer"]),
        (GATEWAY + "  kernel: python3\n", [], ["execution.kernel and execution.kernel_gateway", "kernel_gateway.kernel_name"]),
        (GATEWAY + "  mounts: [/usr/share]\n", [], ["execution.mounts and execution.kernel_gateway"]),
        (
            "execution: {sandbox: none}\n",
            ["execution.mounts=[/usr/share]"],
            ["--set execution.mounts=[/usr/share]", "execution.mounts and execution.sandbox: none"],
        ),
    ],
)
def test_conflicting_settings_are_refused_in_one_line_naming_both(tmp_path: Path, text: str, overrides: list[str], named: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(project_with(tmp_path, text), overrides)
    message = str(caught.value)
    assert "\n" not in message and "conflict" in message and "remove " in message
    for fragment in named:
        assert fragment in message, message


def test_settings_that_agree_with_a_gateway_are_accepted(tmp_path: Path) -> None:
    # `auto` (the default, written out) and a planner that keeps its default strategy are not conflicts.
    config = load_config(project_with(tmp_path, GATEWAY + "  sandbox: auto\nplanner: {prompt_compression: false}\n"))
    assert config.execution.kernel_gateway is not None and not config.planner.prompt_compression


def test_mounts_are_paths_or_path_and_mode_and_read_only_by_default(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    text = f"execution:\n  mounts: [{tmp_path / 'data'}, {{path: '~', mode: rw}}]\n"
    mounts = load_config(project_with(tmp_path, text)).execution.mounts
    assert [(m.path, m.mode) for m in mounts] == [(str(tmp_path / "data"), "ro"), (str(Path.home()), "rw")]


@pytest.mark.parametrize(
    ("mount", "problem"),
    [
        ("data", "'data' is not an absolute path"),
        ("/no/such/folder", "/no/such/folder does not exist on this machine"),
        ("{path: /usr, mode: write}", "'ro' or 'rw'"),
    ],
)
def test_a_bad_mount_is_one_line_naming_the_key(tmp_path: Path, mount: str, problem: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(project_with(tmp_path, f"execution:\n  mounts: [{mount}]\n"))
    assert "\n" not in str(caught.value) and "execution.mounts.0" in str(caught.value) and problem in str(caught.value), caught.value


def test_the_reply_reserve_unless_set_is_a_quarter_of_the_window_at_most_4096() -> None:
    def reserve(llm: dict[str, Any], **roles: dict[str, Any]) -> int:
        return Config.model_validate({"llm": llm, **roles}).llm.reply_reserve

    assert reserve({"context_window": 128_000}) == 4_096
    assert reserve({"context_window": 8_000}) == 2_000, "an 8k model's replies took half its window"
    assert reserve({"context_window": 4_096}) == 1_024, "a 4k window failed to load with a fixed 4,096 reserve"
    assert reserve({"context_window": 8_000, "reply_reserve": 3_000}) == 3_000, "a reserve that is set wins"
    assert reserve({"context_window": 8_000, "reply_reserve": None}) == 2_000
    config = Config.model_validate({"llm": {"context_window": 128_000}, "planner": {"llm": {"context_window": 8_000}}})
    assert config.llm_for("planner").reply_reserve == 2_000, "a role's own window gets its own default reserve"
    config = Config.model_validate({"llm": {"context_window": 128_000, "reply_reserve": 1_000}, "planner": {"llm": {"context_window": 8_000}}})
    assert config.llm_for("planner").reply_reserve == 1_000, "a reserve set at the top level holds for every role"


@pytest.mark.parametrize("value", ["0", "-3", "many", "2.5", "true"])
def test_a_bad_session_limit_is_one_line_naming_the_file_the_key_and_the_fix(tmp_path: Path, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(project_with(tmp_path, f"serve:\n  max_sessions_per_user: {value}\n"))
    message = str(caught.value)
    assert "\n" not in message and "taskweaver_config.yaml, line 2" in message and "serve.max_sessions_per_user" in message, message
    assert "1 or more, or null for no limit" in message, message
    (tmp_path / "ok").mkdir()
    (tmp_path / "default").mkdir()
    assert load_config(project_with(tmp_path / "ok", "serve:\n  max_sessions_per_user: 3\n")).serve.max_sessions_per_user == 3
    assert load_config(project_with(tmp_path / "default", "")).serve.max_sessions_per_user is None, "no limit unless set"


def test_a_gateway_token_left_null_is_read_from_kg_auth_token_as_the_gateway_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    gateway = Config.model_validate({"execution": {"kernel_gateway": {"url": "http://gw:8888", "headers": {"X-Proxy": "p"}}}}).execution.kernel_gateway
    assert gateway is not None
    monkeypatch.delenv("KG_AUTH_TOKEN", raising=False)
    assert gateway.request_headers() == {"X-Proxy": "p"}, "no token anywhere: none is sent"
    monkeypatch.setenv("KG_AUTH_TOKEN", "from-env")
    assert gateway.request_headers() == {"X-Proxy": "p", "Authorization": "token from-env"}
    configured = Config.model_validate({"execution": {"kernel_gateway": {"url": "http://gw:8888", "token": "from-file"}}}).execution.kernel_gateway
    assert configured is not None and configured.request_headers() == {"Authorization": "token from-file"}, "the config's token wins"
