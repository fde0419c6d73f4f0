"""Prompt caching through the real Session: each role's prompts extend each other between folds,
and the cached tokens the server reports are stored and shown (/context, /info, the closing line, serve)."""

from __future__ import annotations

import itertools
import re
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from soak_session import markers_in, run_soak, user_request

from taskweaver_lite.cli.chat import SlashCommands, resume_hint
from taskweaver_lite.store.database import SessionStore
from taskweaver_lite.testing.scripted_server import ScriptedRequest, last_user_text

pytestmark = pytest.mark.kernel

MEMORY = ("## Summary of earlier rounds", "## Variables in the kernel")


def memory_of(request: ScriptedRequest) -> str:
    return next((str(m["content"]) for m in request.messages if m["role"] == "user" and str(m["content"]).startswith(MEMORY)), "")


def extends(old: Sequence[dict[str, Any]], new: Sequence[dict[str, Any]]) -> bool:
    """`new` starts with `old`, but for `old`'s last message, which `new` may hold without its tail (a report's code)."""
    if list(new[: len(old)]) == list(old):
        return True
    *head, last = old
    if list(new[: len(head)]) != head or len(new) <= len(head):
        return False
    mine = new[len(head)]
    return bool(mine["role"] == last["role"] and str(last["content"]).startswith(str(mine["content"])))


@pytest.mark.parametrize("schedule", ["rounds", "pressure"])
def test_between_folds_every_role_prompt_extends_the_one_before_it(tmp_path: Path, schedule: str) -> None:
    role = {"fold_schedule": schedule}
    run = run_soak(tmp_path, rounds=9, settings={"planner": role, "code_generator": role})
    assert not run.failed_rounds, run.failed_rounds
    for name in ("planner", "code_generator"):
        requests = [r for _, r in run.prompts(name)]
        pairs = list(itertools.pairwise(requests))
        # Round 1's prompts carry the examples, left out once the role has a round of its own: a change once per session.
        kept = [(a, b) for a, b in pairs if memory_of(a) == memory_of(b) and max(markers_in(last_user_text(a.messages))) > 1]
        assert kept, f"precondition: the {name} made calls without a fold between them"
        broken = [n for n, (a, b) in enumerate(kept) if not extends(a.messages, b.messages)]
        assert not broken, f"{len(broken)} of the {name}'s prompts changed before the current request with no fold between (e.g. pair {broken[0]})"


def test_cached_tokens_are_stored_per_call_and_shown_per_role(tmp_path: Path) -> None:
    from soak_session import SoakModel, open_soak_session

    from taskweaver_lite.testing.scripted_server import ScriptedServer

    said: list[str] = []
    with ScriptedServer() as server:
        SoakModel().install(server)
        with open_soak_session(tmp_path, server) as session:
            for n in (1, 2, 3):
                session.ask(user_request(n))
            commands = SlashCommands(session, say=said.append)
            commands.run("/context")
            commands.run("/info")
            closing = resume_hint(session, None)
            session_id, store_path = session.id, session.config.store_path
            by_model = session.usage_by_model()
    cached = sum(part.cached_tokens for part in by_model.values())
    assert cached > 0, "precondition: the scripted server reported cached tokens"
    with sqlite3.connect(store_path) as db:
        stored = db.execute("SELECT purpose, cached_tokens FROM model_calls WHERE session_id = ?", (session_id,)).fetchall()
    assert sum(tokens for _, tokens in stored) == cached, "each call's cached tokens go to the store"
    assert any(purpose == "planner" and tokens > 0 for purpose, tokens in stored)
    store = SessionStore(store_path)
    try:
        assert store.load(session_id).usage.cached_tokens == cached, "a resumed session's usage counts them"
    finally:
        store.close()
    context = "\n".join(said)
    assert "planner's calls:" in context and " cached, " in context and " uncached" in context, context
    assert re.search(r"planner on \S+: [\d,]+ in \([\d,]+ cached, [\d,]+ uncached\)", context), "/info shows them per role and model"
    assert re.match(r"Prompt tokens by role: planner [\d,]+ \([\d,]+ cached, [\d,]+ uncached\)", closing), closing


def test_once_a_fold_lands_earlier_rounds_show_what_their_code_printed_cut_head_and_tail(tmp_path: Path) -> None:
    run = run_soak(tmp_path, rounds=7)  # round 5 prints 300 lines (soak_session.LONG_OUTPUT_EVERY), about 9,000 characters
    assert not run.failed_rounds, run.failed_rounds

    def report(request: ScriptedRequest) -> str:
        """The message with round 5's output (not the code that printed it)."""
        return next((str(m["content"]) for m in request.messages if m["role"] == "user" and "report for REQ-0005" in str(m["content"])), "")

    for name in ("planner", "code_generator"):
        requests = [r for _, r in run.prompts(name)]
        earlier = [report(r) for r in requests if max(markers_in(last_user_text(r.messages))) == 6]
        assert earlier and earlier[0], f"precondition: the {name}'s round 6 prompt shows round 5 (a fold landed at its first request)"
        lean = earlier[0]
        assert len(lean) < 1_500, f"the {name}'s view of an earlier round keeps {len(lean):,} characters of its output after a fold landed"
        assert "row 299" in lean and "left out here" in lean, f"the {name}'s earlier view keeps the output's head and tail, with a marker"
        assert "Full output saved to" in lean, f"the {name}'s earlier view names the file with the whole output"
    planner = [report(r) for _, r in run.prompts("planner") if max(markers_in(last_user_text(r.messages))) == 5]
    assert len(max(planner, key=len)) > 1_500, "while round 5 is current the Planner reads its output within the cell's share, not cut further"
