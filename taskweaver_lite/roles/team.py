"""A session's team: each enabled role with its tools (model, context, folders) and its behaviour.

    team = build_team(config, roles.enabled, parts, model=model, live_variables=..., emit=...)
    show_tips(team, experience)

Each role gets its own context: its config section over the role file's settings, its own model
settings and tokenizer, and its own compression, whose folds are reported through `emit`. Only a
role that reads the kernel (`kernel_variables`) sees its variables; only a role that streams sends
its reply to the screen as it comes. The session builds the team once and runs its turns over it,
starting each at the team's entry, the Planner.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.knowledge.experience import Experience
from taskweaver_lite.llm.client import ChatModel
from taskweaver_lite.llm.tokens import Tokenizer, get_tokenizer
from taskweaver_lite.memory.compression import ContextSettings, RoleContext
from taskweaver_lite.memory.variables import LiveVariables
from taskweaver_lite.records.events import Event, ReplyStreamed
from taskweaver_lite.roles.builtin import SessionParts, build_role, planner_for
from taskweaver_lite.roles.planner import Planner
from taskweaver_lite.roles.registry import RoleSpec
from taskweaver_lite.roles.worker import BuiltRole, RoleTools

# Experience tips take at most this fraction of a role's prompt budget (and experience.max_tokens).
EXPERIENCE_SHARE = 8


@dataclass(frozen=True)
class TeamMember:
    """An enabled role in this session: its declaration, its tools (model, context, folders) and its behaviour."""

    spec: RoleSpec
    tools: RoleTools
    role: BuiltRole

    @property
    def context(self) -> RoleContext:
        """The role's prompt history and compression."""
        return self.tools.context


@dataclass(frozen=True)
class Team:
    """The session's enabled roles by alias (in session.roles order), and the one the user talks to: the Planner."""

    members: dict[str, TeamMember]
    entry: TeamMember
    planner: Planner  # the entry's role, as the session asks it for a file's note and the hop limit's answer


def build_team(
    config: Config,
    roles: Sequence[RoleSpec],
    parts: SessionParts,
    *,
    model: ChatModel,
    live_variables: Callable[[], LiveVariables],
    emit: Callable[[Event], None],
) -> Team:
    """The enabled roles, each with its own context (its own section, model and tokenizer); ConfigError without the Planner."""
    members: dict[str, TeamMember] = {}
    entry: tuple[TeamMember, Planner] | None = None
    for spec in roles:
        tools = _tools(config, spec, parts, model=model, live_variables=live_variables, emit=emit)
        if spec.builtin == "planner" and entry is None:
            planner = planner_for(tools, parts)
            members[spec.alias] = member = TeamMember(spec, tools, planner)
            entry = (member, planner)
        else:
            members[spec.alias] = TeamMember(spec, tools, build_role(spec, tools, parts))
    if entry is None:
        raise ConfigError("session.roles must include planner: it is the role the user talks to")
    return Team(members, *entry)


def _tools(
    config: Config, spec: RoleSpec, parts: SessionParts, *, model: ChatModel, live_variables: Callable[[], LiveVariables], emit: Callable[[Event], None]
) -> RoleTools:
    section = spec.section(config.role_section(spec.key))
    settings = ContextSettings.of(config, spec.key, section=section, label=spec.label, fold_template=spec.fold_prompt)
    live = live_variables if spec.kernel_variables else None
    context = RoleContext(settings, model=model, tokenizer=tokenizer_for(model, spec.key, settings), live_variables=live, on_fold=emit)
    stream = (lambda delta: emit(ReplyStreamed(spec.key, delta, spec.alias))) if spec.streams else None
    return RoleTools(
        key=spec.key,
        alias=spec.alias,
        config=section,
        options={**spec.options, **(section.model_extra or {})},  # the role's own keys: its file's, the project config's over them
        model=model,
        context=context,
        project_dir=config.project_dir,
        working_dir=parts.executor.working_dir,
        prompt=spec.prompt,
        intro=spec.intro,
        on_delta=stream,
    )


def tokenizer_for(model: ChatModel, key: str, settings: ContextSettings) -> Tokenizer:
    """What counts a role's prompts: its model's own counting (the server's tokenizer, or a calibrated one), else `llm.tokenizer`."""
    return model.tokenizer(key) or get_tokenizer(settings.llm.tokenizer)


def show_tips(team: Team, experience: Experience) -> None:
    """The roles whose prompts show experience tips (the Planner's, the CodeGenerator's) get those that fit their request."""
    for member in team.members.values():
        member.role.take_tips(functools.partial(_tips_for, experience, member.context))


def _tips_for(experience: Experience, context: RoleContext, request: str) -> str:
    """The tips that fit `request`, as the role's prompt shows them (at most an eighth of its budget)."""
    return experience.block(request, tokenizer=context.tokenizer, max_tokens=context.budget // EXPERIENCE_SHARE)
