"""One way in: a Workspace opens the project once, and every session it opens or resumes shares what it found."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import IdleExecutor, make_project

from taskweaver_lite.config.file import load_config
from taskweaver_lite.knowledge import experience
from taskweaver_lite.knowledge.tips import HandcraftedTips, read_handcrafted
from taskweaver_lite.session.assembly import open_session, resume_session
from taskweaver_lite.session.workspace import Workspace

pytestmark = pytest.mark.unit

NO_SERVER = "http://127.0.0.1:9/v1"  # nothing here asks a model


def test_sessions_from_one_workspace_share_its_store_roles_plugins_and_handcrafted_tips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = make_project(tmp_path, NO_SERVER)
    (project / "experience").mkdir()
    (project / "experience" / "handcrafted_exp_1.yaml").write_text("exp_id: '1'\nexperience_text: Parse dates first.\n", encoding="utf-8")
    reads: list[Path] = []

    def counted(folder: Path) -> HandcraftedTips:
        reads.append(folder)
        return read_handcrafted(folder)

    monkeypatch.setattr(experience, "read_handcrafted", counted)
    with Workspace(load_config(project)) as workspace:
        first = workspace.new_session(executor=IdleExecutor)
        second = workspace.new_session(executor=IdleExecutor, owner="ana")
        try:
            for session in (first, second):
                assert session.store is workspace.store and session.roles is workspace.roles and session.plugins is workspace.plugins
            assert second.experience.owner == "ana" and first.experience.owner is None
            assert [tip.text for tip in first.experience.all()] == [tip.text for tip in second.experience.all()] == ["Parse dates first."]
            assert len(reads) == 1, "the handcrafted files are read once for every session of the workspace"
        finally:
            first.close()
            second.close()
        assert workspace.store.load(second.id).owner == "ana", "closing a session leaves the workspace's store open"


def test_a_resume_under_the_remembered_settings_runs_on_the_same_store_which_the_workspace_alone_closes(tmp_path: Path) -> None:
    project = make_project(tmp_path, NO_SERVER)
    with Workspace(load_config(project)) as workspace:
        opened = workspace.new_session(executor=IdleExecutor)
        workspace.store.save_overrides(opened.id, ["round_compressor.rounds_to_retain=1"])
        opened.close()
        remembered = workspace.remembered_overrides(opened.id[:12])
        again = workspace.reconfigured(load_config(project, remembered))
        assert again.store is workspace.store and again.plugins is workspace.plugins
        resumed, report = again.resume_session(opened.id, executor=IdleExecutor)
        again.close()  # not the store's owner: nothing is closed
        try:
            assert report.session_id == opened.id and report.rounds == 0 and report.replayed == 0
            assert resumed.config.round_compressor.rounds_to_retain == 1 and resumed.store is workspace.store
        finally:
            resumed.close()
        assert workspace.store.overrides(opened.id) == ["round_compressor.rounds_to_retain=1"], "the store outlives the reconfigured workspace"


@pytest.mark.parametrize(("method", "assembles"), [(Workspace.new_session, open_session), (Workspace.resume_session, resume_session)])
def test_a_workspace_names_every_option_of_the_session_it_opens(method: Callable[..., object], assembles: Callable[..., object]) -> None:
    own = inspect.signature(method).parameters
    assert all(parameter.kind is not parameter.VAR_KEYWORD for parameter in own.values()), "each option is named and typed, not **options"
    given_by_the_workspace = {"config", "store", "catalogs"}
    assert set(own) - {"self"} == set(inspect.signature(assembles).parameters) - given_by_the_workspace
