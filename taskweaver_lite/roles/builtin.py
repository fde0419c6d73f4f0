"""The two roles the session builds from its own parts: the Planner and the CodeInterpreter.

Both answer through the same one method as any role (`reply(request, tools) -> Post`); what they
need beyond their tools (the kernel, the plugins, the enabled team, the safety checks) comes in
`SessionParts`. The Planner is also the role the user talks to: it words the note of
a loaded file and the answer a request gets when it runs out of hops.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass

from taskweaver_lite.config.settings import CodeGeneratorConfig, CodeInterpreterConfig
from taskweaver_lite.kernel.interface import Executor
from taskweaver_lite.plugins.prompt import planner_line
from taskweaver_lite.records.conversation import USER, Plan, Post, Round, RoundMessages
from taskweaver_lite.records.events import Working
from taskweaver_lite.records.plugin_spec import PluginSpec
from taskweaver_lite.roles.code_generator import CodeGenerator
from taskweaver_lite.roles.examples import load_examples
from taskweaver_lite.roles.planner import Planner, Teammate
from taskweaver_lite.roles.registry import RoleSpec
from taskweaver_lite.roles.worker import RoleRequest, RoleTools
from taskweaver_lite.safety.confirm import ConfirmCell
from taskweaver_lite.safety.verification import verifier_from


@dataclass(frozen=True)
class SessionParts:
    """What the session's own roles are built from besides their tools."""

    executor: Executor
    plugins: tuple[PluginSpec, ...]
    team: tuple[RoleSpec, ...]  # the enabled roles, in session.roles order
    checks: CodeInterpreterConfig  # code_interpreter: retries and verification
    max_hops: int
    working_files: Callable[[], list[str]]
    confirm: ConfirmCell | None = None


class BuiltRole(ABC):
    """A role as the session runs it: its behaviour, and how it renders a round of its view."""

    @abstractmethod
    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """Answer `request`."""

    @abstractmethod
    def render(self, rnd: Round) -> RoundMessages:
        """One round of the role's view as its chat messages (for its folds)."""


class PlannerRole(BuiltRole):
    """The Planner as a role: plans, delegates to the team, answers the user."""

    def __init__(self, tools: RoleTools, parts: SessionParts) -> None:
        team = [_teammate(spec, parts) for spec in parts.team if spec.alias != tools.alias]
        self.planner = Planner(
            tools.model,
            key=tools.key,
            party=tools.alias,
            context=tools.context,
            examples=load_examples(tools.project_dir, tools.key, party=tools.alias, parties={tools.alias, USER, *(member.alias for member in team)}),
            on_delta=tools.on_delta,
            max_hops=parts.max_hops,
            working_files=parts.working_files,
            team=team,
        )

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The Planner's next post: to a teammate or to the User."""
        turn = request.turn
        return self.planner.reply(request.history, request.current, repairs=turn.repairs, on_repair=lambda problem: turn.notify(Working("repairing", problem)))

    def render(self, rnd: Round) -> RoundMessages:
        """The round as the Planner's prompt shows an earlier one."""
        return self.planner.rendered(rnd)

    def file_note(self, name: str) -> str:
        """The note that tells the Planner a file was loaded."""
        return self.planner.file_note(name)

    def hop_limit_post(self, *, hops: int, last: str, plan: Plan | None) -> Post:
        """The answer a request gets when it used up its hops."""
        return self.planner.hop_limit_post(hops=hops, last=last, plan=plan)


class CodeInterpreterRole(BuiltRole):
    """The CodeInterpreter as a role: writes code for a step, runs it in the kernel, revises, reports."""

    def __init__(self, tools: RoleTools, parts: SessionParts) -> None:
        section = tools.config if isinstance(tools.config, CodeGeneratorConfig) else CodeGeneratorConfig()
        checks = parts.checks
        self.code_generator = CodeGenerator(
            tools.model,
            key=tools.key,
            party=tools.alias,
            executor=parts.executor,
            context=tools.context,
            examples=load_examples(
                tools.project_dir, tools.key, party=tools.alias, parties={tools.alias, *(spec.alias for spec in parts.team if spec.builtin == "planner")}
            ),
            max_retry_count=checks.max_retry_count,
            on_delta=tools.on_delta,
            plugins=parts.plugins,
            plugin_top_k=section.auto_plugin_selection_topk if section.auto_plugin_selection else None,
            verifier=verifier_from(checks.allowed_modules, checks.blocked_functions) if checks.code_verification_on else None,
            confirm=parts.confirm,
        )

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The report on the step: the code run, its result, and the outcome."""
        turn = request.turn
        return self.code_generator.handle(
            request.post,
            history=request.history,
            current=lambda: request.current,
            add_post=turn.add_post,
            repairs=turn.repairs,
            notify=turn.notify,
        )

    def render(self, rnd: Round) -> RoundMessages:
        """The round as the CodeGenerator's prompt shows it."""
        return self.code_generator.rendered(rnd)


class WorkerRole(BuiltRole):
    """Any other role: its handler's one method, and the standard rendering of a worker's rounds."""

    def __init__(self, spec: RoleSpec, tools: RoleTools) -> None:
        if spec.handler is None:
            raise ValueError(f"role {spec.name} has nothing to build it from")
        self.handler = spec.handler()
        self._tools = tools

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The handler's reply."""
        return self.handler.reply(request, tools)

    def render(self, rnd: Round) -> RoundMessages:
        """The round as a worker's prompt shows it."""
        return self._tools.rendered(rnd)


def build_role(spec: RoleSpec, tools: RoleTools, parts: SessionParts) -> BuiltRole:
    """The running role for `spec`."""
    if spec.builtin == "planner":
        return PlannerRole(tools, parts)
    if spec.builtin == "code_interpreter":
        return CodeInterpreterRole(tools, parts)
    return WorkerRole(spec, tools)


def _teammate(spec: RoleSpec, parts: SessionParts) -> Teammate:
    plugins = tuple(planner_line(p) for p in parts.plugins) if spec.builtin == "code_interpreter" else ()
    return Teammate(alias=spec.alias, intro=spec.intro, plugins=plugins)
