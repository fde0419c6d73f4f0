"""The chat's experience commands: `/save` distils the session into tips, `/experience` lists them and deletes one."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from taskweaver_lite.records.tips import KIND_LABELS, Tip
from taskweaver_lite.safety.terminal import strip_controls
from taskweaver_lite.session.session import Session

EXPERIENCE_USAGE = "Usage: /experience (list the tips) or /experience delete ID"
PREVIEW_CHARS = 160


def save_tips(session: Session, say: Callable[[str], None]) -> None:
    """`/save`: the model distils the session into tips, which are stored and listed."""
    say("Distilling this session into tips for later sessions...")
    earlier = [tip for tip in session.experience.all() if tip.source == session.id and not tip.from_file]
    saved = session.save_experience()
    if not saved:
        kept = f"; the {len(earlier)} saved from it before stay" if earlier else ""
        say(f"The model found nothing worth keeping in this session: no tips were saved{kept}.")
        return
    replaced = f", in place of the {len(earlier)} saved from this session before" if earlier else ""
    say(f"Saved {len(saved)} tip{'s' if len(saved) != 1 else ''}{replaced} (shown to later requests they fit; /experience lists them):\n{tip_lines(saved)}")


def experience_command(session: Session, argument: str, say: Callable[[str], None]) -> None:
    """`/experience` lists every tip; `/experience delete ID` deletes a stored one."""
    words = argument.split()
    if words and words[0] == "delete" and len(words) == 2:
        tip = session.experience.delete(words[1])
        say(f"Deleted tip {tip.id}: {_preview(tip.text)}")
        return
    if words:
        say(EXPERIENCE_USAGE)
        return
    tips = session.experience.all()
    settings = session.config.experience
    state = (
        f"each request gets up to {settings.top_k} that fit, within {settings.max_tokens} tokens"
        if settings.enabled
        else "retrieval is off (experience.enabled: false)"
    )
    lines = [f"Experience: {len(tips)} tip{'s' if len(tips) != 1 else ''}; {state}."]
    empty = f"None yet: /save distils this session into tips; handcrafted ones go in {session.config.experience_dir}/*.yaml."
    lines += [tip_lines(tips) if tips else empty]
    lines += session.experience.problems()
    say("\n".join(lines))


def tip_lines(tips: Sequence[Tip]) -> str:
    """One line per tip: its id, kind, where it came from, and its text."""
    rows = []
    for tip in tips:
        origin = tip.source if tip.from_file else f"session {tip.source}"
        rows.append(f"  {'#' + tip.id if not tip.from_file else tip.id:>6}  {KIND_LABELS[tip.kind]:<16} {_preview(tip.text)}  ({origin})")
    return "\n".join(rows)


def _preview(text: str) -> str:
    line = strip_controls(" ".join(text.split()))
    return line if len(line) <= PREVIEW_CHARS else line[: PREVIEW_CHARS - 1] + "…"
