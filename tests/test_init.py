"""`taskweaver-lite init`: a project folder with everything a first session needs, never over an existing one."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import run_cli

from taskweaver_lite.config.file import load_config

pytestmark = pytest.mark.cli


def test_init_creates_a_commented_project_with_examples_plugins_and_sample_data(tmp_path: Path) -> None:
    target = tmp_path / "myproject"
    done = run_cli("init", str(target), timeout=30)
    assert done.returncode == 0, done.stderr
    config_text = (target / "taskweaver_config.yaml").read_text(encoding="utf-8")
    assert config_text.startswith("#") and "OLLAMA_CONTEXT_LENGTH" in config_text
    assert isinstance(yaml.safe_load(config_text)["llm"], dict), "nested keys, as the README shows them"
    assert sorted(p.parent.name for p in target.glob("examples/*/*.yaml")) == ["code_generator", "planner"]
    assert (target / "plugins").is_dir() and (target / "sample_data" / "sales.csv").is_file()
    assert ".chat_history" in (target / ".gitignore").read_text(encoding="utf-8")
    assert not list(target.rglob("sessions*")) and not list(target.rglob("__init__.py"))
    assert load_config(target).llm.model == "gpt-4o-mini"
    assert f"taskweaver-lite chat -p {target}" in done.stdout


def test_init_in_the_current_folder_defaults_to_project(tmp_path: Path) -> None:
    done = run_cli("init", timeout=30, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "project" / "taskweaver_config.yaml").is_file()
    assert "taskweaver-lite chat\n" in done.stdout, "the default project needs no -p"


def test_init_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "myproject"
    assert run_cli("init", str(target), timeout=30).returncode == 0
    (target / "taskweaver_config.yaml").write_text("llm:\n  model: mine\n")
    again = run_cli("init", str(target), timeout=30)
    assert again.returncode == 1 and "already a project" in again.stderr
    assert (target / "taskweaver_config.yaml").read_text() == "llm:\n  model: mine\n"
    busy = tmp_path / "notes"
    busy.mkdir()
    (busy / "todo.txt").write_text("x")
    refused = run_cli("init", str(busy), timeout=30)
    assert refused.returncode == 1 and "exists and is not empty" in refused.stderr
    assert sorted(p.name for p in busy.iterdir()) == ["todo.txt"]
