"""What a role may need that not every setup has, and the reason it is off when the need is not met.

A role declares its needs once (`requires: [vision]` in its role file, `RoleSpec.requires`); the
registry checks them against the role's own model (`<role>.llm`, over `llm`) and this Python, and
lists a role whose need is unmet as off, with the reason and the setting that would turn it on,
instead of letting it fail at its first request.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskweaver_lite.config.settings import Config
from taskweaver_lite.knowledge.fts import fts5_problem

KNOWN = ("vision", "fts5")


def unmet(requires: Sequence[str], *, config: Config, key: str) -> str | None:
    """Why a role with config key `key` cannot work here (its first unmet need), or None when every need is met."""
    for need in requires:
        problem = _problem(need, config=config, key=key)
        if problem is not None:
            return problem
    return None


def _problem(need: str, *, config: Config, key: str) -> str | None:
    if need == "vision":
        llm = config.llm_for(key)
        if not llm.vision:
            return f"it needs a model that reads images, and {llm.model} is not marked as one: set {key}.llm.model to a vision model and {key}.llm.vision: true"
        return None
    if need == "fts5":
        return fts5_problem()
    return f"it requires {need!r}, which this taskweaver-lite does not know (known: {', '.join(KNOWN)})"
