"""The roles as the session runs them (`BuiltRole`): the Planner and the CodeInterpreter built from the session's parts, any other role around its handler.

The Planner and the CodeGenerator answer through the same one method as any role (`reply(request,
tools) -> Post`); what they need beyond their tools (the kernel, the plugins, the enabled team, the
safety checks) comes in `SessionParts`. The Planner is also the role the user talks to: it words the
note of a loaded file and the answer a request gets when it runs out of hops (roles/team.py hands it
to the session as the team's entry).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from taskweaver_lite.config.settings import CodeGeneratorConfig, CodeInterpreterConfig
from taskweaver_lite.kernel.interface import Executor
from taskweaver_lite.plugins.prompt import planner_line
from taskweaver_lite.records.conversation import USER, Post, Round, RoundMessages
from taskweaver_lite.records.plugin_spec import PluginSpec
from taskweaver_lite.roles.code_generator import CodeGenerator
from taskweaver_lite.roles.examples import load_examples
from taskweaver_lite.roles.planner import Planner, Teammate
from taskweaver_lite.roles.registry import RoleSpec
from taskweaver_lite.roles.worker import BuiltRole, RoleRequest, RoleTools
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


def planner_for(tools: RoleTools, parts: SessionParts) -> Planner:
    """The Planner with its tools: it plans, delegates to the rest of the team, and answers the user."""
    team = [_teammate(spec, parts) for spec in parts.team if spec.alias != tools.alias]
    return Planner(
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


def code_generator_for(tools: RoleTools, parts: SessionParts) -> CodeGenerator:
    """The CodeInterpreter's CodeGenerator with its tools: writes code for a step, runs it in the kernel, revises, reports."""
    section = tools.config if isinstance(tools.config, CodeGeneratorConfig) else CodeGeneratorConfig()
    checks = parts.checks
    return CodeGenerator(
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


class WorkerRole:
    """Any other role: its handler's one method, and the standard rendering of a worker's rounds (a `BuiltRole`)."""

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

    def take_tips(self, tips: Callable[[str], str]) -> None:
        """A worker's prompt shows no experience tips."""


def build_role(spec: RoleSpec, tools: RoleTools, parts: SessionParts) -> BuiltRole:
    """The running role for `spec`."""
    if spec.builtin == "planner":
        return planner_for(tools, parts)
    if spec.builtin == "code_interpreter":
        return code_generator_for(tools, parts)
    return WorkerRole(spec, tools)


def _teammate(spec: RoleSpec, parts: SessionParts) -> Teammate:
    plugins = tuple(planner_line(p) for p in parts.plugins) if spec.builtin == "code_interpreter" else ()
    return Teammate(alias=spec.alias, intro=spec.intro, plugins=plugins)
