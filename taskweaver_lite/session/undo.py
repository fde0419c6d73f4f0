"""Undo: the last request taken back with everything it caused, from the prompts, the store and the kernel.

    dropped = undo(session, on_replay=lambda done, total: ...)    # /undo, and /retry before it asks again

The round leaves the conversation, each role's view and the store; the kernel restarts and the
cells that ran without error are re-run in order (as a resume rebuilds it), so its variables are
what they were before the request. Files its cells wrote stay in the working folder. A request a
role has already folded into its summary cannot be taken back: the summary holds it.
"""

from __future__ import annotations

from collections.abc import Sequence

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.session.assembly import Replayed, replay_cells
from taskweaver_lite.session.session import Session

UNDO_FOLD_WAIT = 30.0  # seconds an undo waits for a running fold (it may be folding the request being undone)


def undo(session: Session, *, on_replay: Replayed | None = None) -> Round:
    """Drop the last request with everything it caused (from the store too) and rebuild the kernel by replay; returns it.

    TaskWeaverError when there is none, or when a role's summary already holds it.
    """
    if not session.conversation.rounds:
        raise TaskWeaverError("Nothing to undo: this session has no requests yet.")
    last = session.conversation.rounds[-1]
    for role, context in session.contexts().items():
        context.wait_idle(timeout=UNDO_FOLD_WAIT)
        if context.state.folded_through >= last.index:
            raise TaskWeaverError(f"Request {last.index} is already folded into the {role} role's summary and cannot be undone; /reset starts over.")
    session.flush_record()
    if session.store is not None:
        session.store.drop_round(session.id, last.id)
    session.forget_last_round()
    cells = session.store.successful_cells(session.id) if session.store is not None else _good_cells(session.conversation.rounds)
    session.executor.restart()
    session.variables.clear()
    replay_cells(session.executor, cells, on_replay=on_replay)
    return last


def _good_cells(rounds: Sequence[Round]) -> list[str]:
    """The code of every cell that ran without error since the kernel last died, in order (the store's `successful_cells` for a session without one)."""
    cells = [post.execution for rnd in rounds for post in rnd.posts if post.execution is not None]
    since = max((number for number, cell in enumerate(cells) if cell.kernel_died), default=0)
    return [cell.code for cell in cells[since:] if cell.success]
