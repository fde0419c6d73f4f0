"""Which model each part of a session calls: the clients it starts with, and `/model` changing them mid-session.

    model = role_models(config, roles=catalog.enabled)     # one openai-SDK client per distinct `<role>.llm`
    use_model(session, "gpt-4o", user="code_generator")    # from the next request on

A part is an enabled role (by its config key), the folds (`round_compressor`) or the distiller. A
role's model is its `<role>.llm` merged over `llm`; parts whose settings come out equal share one
client. Changing a model writes the choice into the session's config, so /info and the banner name
it, and swaps the clients; each role keeps its context window, and so its budget.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

from taskweaver_lite.config.settings import DISTILLER, FOLDER, Config, LLMConfig, LLMOverrides, RoleSectionConfig, merged_llm
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.llm.client import ChatModel, SettingHints
from taskweaver_lite.llm.counting import RATIOS_FILE, RatioBook
from taskweaver_lite.roles.registry import RoleSpec

if TYPE_CHECKING:
    from taskweaver_lite.session.session import Session


def role_models(config: Config, *, roles: Sequence[RoleSpec], chosen: str | None = None) -> ChatModel:
    """The openai-SDK clients a session calls: one per distinct role model (`<role>.llm`), shared when equal.

    `chosen`: the `/model` command that picked the model, which a failure then names instead of the config key.
    """
    from taskweaver_lite.llm.client import OpenAIChatModel, RoutedModel

    clients: dict[str, OpenAIChatModel] = {}
    ratios = RatioBook(lambda: config.state_dir / RATIOS_FILE)  # the token ratios measured for models, kept across sessions

    def client(llm: LLMConfig, section: str = "", overrides: LLMOverrides | None = None) -> OpenAIChatModel:
        secret = llm.api_key.get_secret_value() if llm.api_key is not None else None
        key = json.dumps([llm.model_dump(mode="json", exclude={"api_key"}), secret], sort_keys=True)
        if key not in clients:
            clients[key] = OpenAIChatModel(llm, hints=setting_hints(config, section=section, overrides=overrides, chosen=chosen), ratios=ratios)
        return clients[key]

    folder = client(config.llm_for(FOLDER), FOLDER, config.round_compressor.llm)
    by_purpose: dict[str, ChatModel] = {}
    for spec in roles:
        section = spec.section(config.role_section(spec.key))
        by_purpose[spec.key] = client(merged_llm(config.llm, section.llm), spec.key, section.llm)
        by_purpose[f"compression_{spec.key}"] = folder
    by_purpose[DISTILLER] = client(config.llm_for(DISTILLER), DISTILLER, config.experience.llm)
    return RoutedModel(by_purpose, default=client(config.llm))


def setting_hints(config: Config, *, section: str = "", overrides: LLMOverrides | None = None, chosen: str | None = None) -> SettingHints:
    """Where the user sets the model, address and key a client calls with: the project's file (and a JSON project's variables), or `/model`.

    A key the part's own `llm` overrides (`planner.llm.model`) is named there; `chosen` is the `/model` command that picked the model.
    """
    given = overrides.model_fields_set if overrides is not None else set()
    sources = config.sources

    def where(key: str, *, also: str | None = None) -> str:
        return sources.hint(f"{section}.llm.{key}" if key in given else f"llm.{key}", also=None if key in given else also)

    model = f"the name given to {chosen} (choose another with /model NAME)" if chosen else where("model")
    return SettingHints(api_key=where("api_key", also="OPENAI_API_KEY"), api_base=where("api_base", also="OPENAI_BASE_URL"), model=model)


def model_users(session: Session) -> list[str]:
    """What `use_model` accepts as `user`: the enabled roles' config keys, and round_compressor (the folds)."""
    return [*session.contexts(), FOLDER]


def use_model(session: Session, name: str, *, user: str | None = None) -> None:
    """Call model `name` from the next request on: for every part, or for one (a role's key, or round_compressor)."""
    if not session.owns_model:
        raise TaskWeaverError("This session's model was handed to it by the program that opened it; only that program can change it.")
    config = session.config
    if user is None:
        config.llm.model = name  # a part with its own `llm.model` keeps it (with its own address and key)
    else:
        section = config.round_compressor if user == FOLDER else config.role_section(user) if user in type(config).model_fields else None
        if section is None:  # a project role: its section may not be written yet
            section = config.role_sections.setdefault(user, RoleSectionConfig())
        # Assigned whole, so the section counts as set where a role's file settings are merged under it.
        section.llm = LLMOverrides.model_validate({**section.llm.model_dump(exclude_unset=True), "model": name})
    team = [active.spec for active in session.active.values()]
    for active in session.active.values():  # what /info names (each role's window, and so its budget, stays)
        active.context.llm = merged_llm(config.llm, active.spec.section(config.role_section(active.spec.key)).llm)
    session.replace_model(role_models(config, roles=team, chosen=f"/model {user} {name}" if user else f"/model {name}"))
