"""A TaskWeaver project moves in unchanged: its role classes run, its role settings are read, and a typo in session.roles stops early.

TaskWeaver's own `echo.py` and `echo.role.yaml` (tests/data/taskweaver_roles, MIT) are copied into
a project's `roles/echo/` as they are; a second role is written the way TaskWeaver's documentation
shows one (injected config, logger, tracing, emitter, entry and LLMApi; a post proxy with an
attachment). Sessions run with a real kernel and the openai client against the scripted server.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from helpers import REPO, make_project, run_cli

from taskweaver_lite.config.file import load_config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.records.events import Event, Working
from taskweaver_lite.roles.registry import RoleCatalog, discover_roles
from taskweaver_lite.session.assembly import open_session
from taskweaver_lite.testing.scripted_server import ScriptedServer, planner_reply

pytestmark = pytest.mark.kernel

ECHO = REPO / "tests" / "data" / "taskweaver_roles" / "echo"

# Written as TaskWeaver's documentation writes a role (website/docs/concepts/role.md), with the LLMApi
# as its image_reader asks for it: its own setting, its own model call, a status line and an attachment.
SUMMARIZER_PY = """
from injector import inject

from taskweaver.llm import LLMApi, format_chat_message
from taskweaver.logging import TelemetryLogger
from taskweaver.memory import Memory, Post
from taskweaver.memory.attachment import AttachmentType
from taskweaver.module.event_emitter import SessionEventEmitter
from taskweaver.module.tracing import Tracing, tracing_decorator
from taskweaver.role import Role
from taskweaver.role.role import RoleConfig, RoleEntry


class SummarizerConfig(RoleConfig):
    def _configure(self):
        self.style = self._get_str("style", "plain")
        self.max_words = self._get_int("max_words", 10)


class Summarizer(Role):
    @inject
    def __init__(
        self,
        config: SummarizerConfig,
        logger: TelemetryLogger,
        tracing: Tracing,
        event_emitter: SessionEventEmitter,
        role_entry: RoleEntry,
        llm_api: LLMApi,
    ):
        super().__init__(config, logger, tracing, event_emitter, role_entry)
        self.llm_api = llm_api

    @tracing_decorator
    def reply(self, memory: Memory, **kwargs) -> Post:
        rounds = memory.get_role_rounds(role=self.alias, include_failure_rounds=False)
        last_post = rounds[-1].post_list[-1]
        post_proxy = self.event_emitter.create_post_proxy(self.alias)
        post_proxy.update_send_to(last_post.send_from)
        post_proxy.update_status("summarizing")
        self.logger.info("asked: %s", last_post.message)
        response = self.llm_api.chat_completion(
            [
                format_chat_message("system", f"Summarize in at most {self.config.max_words} words, {self.config.style}."),
                format_chat_message("user", last_post.message),
            ]
        )
        post_proxy.update_attachment(message=f"{len(rounds)} round(s) seen", type=AttachmentType.text)
        post_proxy.update_message(response["content"])
        return post_proxy.end()
"""
SUMMARIZER_YAML = """\
alias: Summarizer
module: taskweaver.ext_role.summarizer.summarizer.Summarizer
intro : |-
  - Summarizer condenses a text.
"""
UNPROVIDED_PY = """
from injector import inject

from taskweaver.memory import Memory, Post
from taskweaver.module.prompt_util import PromptUtil
from taskweaver.role import Role


class Cutter(Role):
    def reply(self, memory: Memory, **kwargs) -> Post:
        return PromptUtil.remove_all_delimiters("x")
"""
REGISTERS_PY = """
from injector import inject

from taskweaver.logging import TelemetryLogger
from taskweaver.memory import Memory, Post
from taskweaver.module.event_emitter import SessionEventEmitter
from taskweaver.module.tracing import Tracing
from taskweaver.role import Role
from taskweaver.role.role import RoleConfig, RoleEntry


class ListenerConfig(RoleConfig):
    pass


class Listener(Role):
    @inject
    def __init__(self, config: ListenerConfig, logger: TelemetryLogger, tracing: Tracing, event_emitter: SessionEventEmitter, role_entry: RoleEntry):
        super().__init__(config, logger, tracing, event_emitter, role_entry)

    def reply(self, memory: Memory, **kwargs) -> Post:
        self.event_emitter.register(object())
        return self.event_emitter.create_post_proxy(self.alias).end()
"""


def add_role(project: Path, name: str, code: str, yaml_text: str) -> None:
    folder = project / "roles" / name
    folder.mkdir(parents=True)
    (folder / f"{name}.py").write_text(code, encoding="utf-8")
    (folder / f"{name}.role.yaml").write_text(yaml_text, encoding="utf-8")


def taskweaver_project(tmp_path: Path, server: ScriptedServer, **settings: object) -> Path:
    """A project as TaskWeaver keeps one: taskweaver_config.json with flat keys, TaskWeaver's echo in roles/echo/."""
    project = make_project(tmp_path, server.url)
    (project / "taskweaver_config.yaml").unlink()
    keys = {"llm.api_base": server.url, "llm.api_key": "test-key", "llm.model": "scripted", "session.roles": ["planner", "echo"], **settings}
    (project / "taskweaver_config.json").write_text(json.dumps(keys), encoding="utf-8")
    shutil.copytree(ECHO, project / "roles" / "echo")
    return project


def listed(found: RoleCatalog, name: str) -> list[tuple[str, str, str]]:
    return [(e.state, e.where, e.error) for e in found.entries if e.name == name]


@pytest.mark.unit
def test_taskweavers_echo_copied_unchanged_is_listed_once_and_enabled(tmp_path: Path) -> None:
    project = tmp_path / "project"
    shutil.copytree(ECHO, project / "roles" / "echo")
    rows = listed(discover_roles(project, enabled=["planner", "echo"]), "echo")
    assert rows == [("enabled", str(project / "roles" / "echo" / "echo.role.yaml"), "")], "the project's echo takes the built-in one's place"


def test_taskweavers_echo_answers_with_its_decorator_read_from_taskweavers_json(tmp_path: Path, server: ScriptedServer) -> None:
    project = taskweaver_project(tmp_path, server, **{"echo.decorator": "**"})
    config = load_config(project)
    assert not any("echo.decorator" in notice for notice in config.notices), config.notices
    server.enqueue("planner", planner_reply("hello there", send_to="Echo"), planner_reply("Echo said it.", send_to="User"))
    with open_session(config) as session:
        assert session.role_problems == []
        rnd = session.ask("Have Echo say hello there.")
    assert [(p.send_from, p.send_to, p.message) for p in rnd.posts[1:3]] == [("Planner", "Echo", "hello there"), ("Echo", "Planner", "**hello there**")]
    assert rnd.state == "finished" and rnd.answer == "Echo said it."


@pytest.mark.unit
def test_a_roles_own_key_is_accepted_in_the_yaml_and_by_set(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "echo"]}, echo={"decorator": "~"})
    shutil.copytree(ECHO, project / "roles" / "echo")
    assert load_config(project).role_section("echo").model_extra == {"decorator": "~"}
    assert load_config(project, ["echo.decorator==="]).role_section("echo").model_extra == {"decorator": "=="}


def test_a_role_written_as_taskweavers_docs_show_calls_its_own_model_and_attaches(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "summarizer"]}, summarizer={"style": "in French", "llm": {"timeout": 20}})
    add_role(project, "summarizer", SUMMARIZER_PY, SUMMARIZER_YAML)
    server.enqueue("planner", planner_reply("Summarize: the sales rose in May and fell in June.", send_to="Summarizer"), planner_reply("Done.", send_to="User"))
    server.enqueue("other", "Ventes en hausse puis en baisse.")
    seen: list[Event] = []
    with open_session(load_config(project), listeners=[seen.append]) as session:
        assert session.role_problems == []
        rnd = session.ask("Summarize the sales note.")
    assert Working("role_working", "Summarizer (summarizing)") in seen, "update_status shows as the role's progress line"
    reply = rnd.posts[2]
    assert (reply.send_from, reply.message) == ("Summarizer", "Ventes en hausse puis en baisse.")
    assert [(a.kind, a.content) for a in reply.attachments] == [("text", "1 round(s) seen")]
    call = next(r for r in server.requests if r.role == "other").messages
    assert call[0] == {"role": "system", "content": "Summarize in at most 10 words, in French."}, "its config read summarizer.style, max_words kept its default"
    assert call[1]["content"] == "Summarize: the sales rose in May and fell in June."
    assert session.usage_by_model().get(("summarizer", "scripted")) is not None, "its call is counted under the role's key"


@pytest.mark.unit
def test_without_injector_a_taskweaver_role_is_broken_with_one_line_naming_the_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "injector", None)  # `import injector` fails as if it were not installed
    project = tmp_path / "project"
    shutil.copytree(ECHO, project / "roles" / "echo")
    found = discover_roles(project, enabled=["planner", "echo"])
    [(state, _, error), (builtin_state, _, _)] = listed(found, "echo")
    assert (state, builtin_state) == ("broken", "replaced"), "the built-in echo stays listed, as replaced"
    assert "(TaskWeaver's roles are built by the package injector, which is not installed: pip install 'taskweaver-lite[taskweaver]')" in error
    entry = found.find("echo")
    assert entry is not None and found.problems == [entry.line()] and "\n" not in found.problems[0]


@pytest.mark.unit
def test_a_role_importing_what_is_not_provided_gets_one_line_saying_what_to_port(tmp_path: Path) -> None:
    project = tmp_path / "project"
    add_role(project, "cutter", UNPROVIDED_PY, "alias: Cutter\nmodule: cutter.Cutter\nintro: cuts\n")
    [(state, _, error)] = listed(discover_roles(project, enabled=["planner", "cutter"]), "cutter")
    assert state == "broken"
    assert (
        "TaskWeaver's taskweaver.module.prompt_util is not provided here: port that part of the role to reply(request, tools) "
        "(docs/taskweaver-roles.md, 'Porting to reply()')"
    ) in error


def test_a_role_calling_what_is_not_provided_tells_the_planner_what_to_port(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "listener"]})
    add_role(project, "listener", REGISTERS_PY, "alias: Listener\nmodule: listener.Listener\nintro: listens\n")
    server.enqueue("planner", planner_reply("listen", send_to="Listener"), planner_reply("It could not.", send_to="User"))
    with open_session(load_config(project)) as session:
        rnd = session.ask("Ask the Listener.")
    said = rnd.posts[2].message
    assert "TaskWeaver's SessionEventEmitter.register is not provided here: port that part of the role to reply(request, tools)" in said


@pytest.mark.unit
def test_a_typo_in_session_roles_stops_before_any_model_call_naming_the_closest_role(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "code_interpeter"]})
    with pytest.raises(ConfigError) as caught:
        open_session(load_config(project))
    assert str(caught.value).startswith("session.roles: no role is called 'code_interpeter'; did you mean 'code_interpreter'? known roles: ")
    assert server.requests == []


@pytest.mark.cli
def test_chat_with_a_typo_in_session_roles_exits_with_one_line(tmp_path: Path, server: ScriptedServer) -> None:
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "code_interpeter"]})
    done = run_cli("chat", "-p", str(project), stdin="What is 2 + 2?\n")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "did you mean 'code_interpreter'?" in lines[0], done.stderr
    assert server.requests == []


def test_the_ported_echo_of_the_docs_answers_as_taskweavers_does(tmp_path: Path, server: ScriptedServer) -> None:
    page = (REPO / "docs" / "taskweaver-roles.md").read_text(encoding="utf-8")
    ported = page.split("## Porting to reply()", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "echo"]}, echo={"decorator": "**"})
    add_role(project, "echo", ported, (ECHO / "echo.role.yaml").read_text(encoding="utf-8"))
    server.enqueue("planner", planner_reply("hello there", send_to="Echo"), planner_reply("Echo said it.", send_to="User"))
    with open_session(load_config(project)) as session:
        assert session.role_problems == []
        rnd = session.ask("Have Echo say hello there.")
    assert (rnd.posts[2].send_from, rnd.posts[2].message) == ("Echo", "**hello there**")


def test_a_role_class_with_no_constructor_or_config_class_of_its_own_is_built_with_the_base_ones(tmp_path: Path, server: ScriptedServer) -> None:
    plain = (
        "from taskweaver.memory import Memory, Post\nfrom taskweaver.role import Role\n\n\n"
        "class Plain(Role):\n"
        "    def reply(self, memory: Memory, **kwargs) -> Post:\n"
        "        last = memory.get_role_rounds(self.alias)[-1].post_list[-1]\n"
        "        proxy = self.event_emitter.create_post_proxy(self.alias)\n"
        "        proxy.update_message(f'{self.name}/{self.alias}: {last.message}')\n"
        "        return proxy.end()\n"
    )
    project = make_project(tmp_path, server.url, session={"roles": ["planner", "plain"]})
    add_role(project, "plain", plain, "alias: Plain\nmodule: plain.Plain\nintro: plain\n")
    server.enqueue("planner", planner_reply("hi", send_to="Plain"), planner_reply("ok", send_to="User"))
    with open_session(load_config(project)) as session:
        rnd = session.ask("Ask Plain.")
    assert (rnd.posts[2].send_from, rnd.posts[2].message) == ("Plain", "plain/Plain: hi")


@pytest.mark.unit
def test_an_image_a_taskweaver_role_attaches_is_said_not_to_reach_the_planner() -> None:
    from taskweaver_lite.compat.taskweaver.memory import Attachment, AttachmentType, Post, our_post

    # What TaskWeaver's ImageReader answers: a message, and the image as a data URL in an image_url attachment.
    post = Post.create("I have read the image path from the message. The image is attached below.", "ImageReader", "Planner")
    post.add_attachment(Attachment.create(AttachmentType.image_url, "Image from chart.png encoded as a Base64 data URL.", extra={"image_url": "data:..."}))
    ours = our_post(post)
    assert ours.message.splitlines()[-1] == (
        "(The image itself was not passed on: the Planner's model here reads text only. "
        "To learn what the image holds, have the CodeInterpreter analyse the file.)"
    )
    assert [(a.kind, a.content) for a in ours.attachments] == [("image_url", "Image from chart.png encoded as a Base64 data URL.")]
    text = Post.create("plain", "Echo", "Planner")
    assert our_post(text).message == "plain", "a reply with no image is passed on as it is"
