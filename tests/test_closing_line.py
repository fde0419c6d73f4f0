"""The lines printed on the way out of a chat: prompt tokens per role only for roles that sent some."""

from __future__ import annotations

from pathlib import Path

import pytest
from helpers import make_project

from taskweaver_lite.cli.chat import resume_hint
from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import Reply, ScriptedServer

pytestmark = pytest.mark.kernel


def test_no_line_of_zero_tokens_after_a_failed_first_request(tmp_path: Path) -> None:
    with ScriptedServer() as server:
        server.set_default("planner", Reply(content="", status=503, error_message="the model is loading"))
        with open_session(load_config(make_project(tmp_path, server.url, llm={"max_retries": 0}))) as session:
            try:
                rnd = session.ask("How many rows?")
                assert rnd.state != "finished", "precondition: the first request failed"
            except TaskWeaverError:
                pass
            assert session.usage_by_model(), "precondition: the failed call was counted"
            closing = resume_hint(session, None)
    assert "Prompt tokens by role" not in closing, closing
    assert f"--resume {session.id}" in closing
