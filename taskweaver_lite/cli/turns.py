"""The chat's commands that change the course of a session: /undo, /retry, /model, /open.

`TurnCommands` is mixed into the chat's `SlashCommands`; each handler takes the text after the
command and returns False only to end the chat. /retry hands its request back to the chat loop
(`take_request`), which asks it like a typed line.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.records.conversation import Round
from taskweaver_lite.session.model_choice import model_users, use_model
from taskweaver_lite.session.session import Session
from taskweaver_lite.session.undo import undo


def session_artifacts(rounds: list[Round]) -> list[Path]:
    """Every file the session's cells produced, in order: /open's numbering."""
    return [Path(path) for rnd in rounds for post in rnd.posts if post.execution is not None for path in post.execution.artifacts]


def saved_files(working_dir: Path, *, loaded: set[str], known: list[Path]) -> list[Path]:
    """Files the cells wrote into the working folder (`plt.savefig`, `to_csv`), oldest first: not loaded by the user, not listed yet."""
    try:
        found = [path for path in working_dir.iterdir() if path.is_file() and not path.is_symlink() and not path.name.startswith(".")]
    except OSError:  # a working folder on another machine (a gateway kernel) or gone
        return []
    names = {path.name for path in known}
    return sorted((path for path in found if path.name not in loaded and path.name not in names), key=lambda path: path.stat().st_mtime)


def viewer_command(path: Path) -> list[str] | None:
    """The system's command that opens `path` in its default viewer, or None where there is none."""
    if sys.platform == "darwin":
        return ["open", str(path)]
    opener = shutil.which("xdg-open")
    return [opener, str(path)] if opener else None


class TurnCommands:
    """/undo, /retry, /model and /open for a chat over `session`."""

    session: Session
    say: Callable[[str], None]
    _retry_text: str | None = None
    _remember: Callable[[str], None] | None = None  # stores a --set value with the session (resume re-applies it)

    def take_request(self) -> str | None:
        """The request /retry asked to send again (once), for the chat loop."""
        text, self._retry_text = self._retry_text, None
        return text

    def _undo(self, _: str) -> bool:
        dropped = undo(self.session, on_replay=self._replayed)
        self.say(
            f"Undid request {dropped.index} ({dropped.user_query!r}): it is gone from the prompts and the store, and the kernel "
            "was rebuilt by re-running the earlier cells. Files its cells wrote stay in the working folder."
        )
        return True

    def _retry(self, _: str) -> bool:
        rounds = self.session.conversation.rounds
        if not rounds:
            self.say("Nothing to retry: this session has no requests yet.")
            return True
        dropped = undo(self.session, on_replay=self._replayed)
        self.say(f"Retrying request {dropped.index} ({dropped.user_query!r}): its answer is dropped and the request is asked again.")
        self._retry_text = dropped.user_query
        return True

    def _replayed(self, done: int, total: int) -> None:
        if done == total:
            self.say(f"Re-ran {total} cell{'' if total == 1 else 's'}.")

    def _model(self, argument: str) -> bool:
        parts, users = argument.split(), model_users(self.session)
        if not parts:
            models = ", ".join(f"{user} {self.session.config.llm_for(user).model}" for user in users)
            self.say(f"Models now: {models}. Switch with /model NAME (every part) or /model ROLE NAME.")
            return True
        if len(parts) > 2 or (len(parts) == 2 and parts[0] not in users):
            self.say(f"Usage: /model NAME, or /model ROLE NAME with ROLE one of {', '.join(users)}")
            return True
        user = parts[0] if len(parts) == 2 else None
        name = parts[-1]
        use_model(self.session, name, user=user)
        key = f"{user}.llm.model" if user else "llm.model"
        if self._remember is not None:
            self._remember(f"{key}={name}")
        own = [part for part in users if user is None and self._own_model(part)]
        kept = f" ({', '.join(own)} keep{'s' if len(own) == 1 else ''} {'its' if len(own) == 1 else 'their'} own model: /model ROLE NAME)" if own else ""
        self.say(f"The {user or 'session'}'s model is now {name} from the next request on{kept}.")
        return True

    def _own_model(self, user: str) -> bool:
        config = self.session.config
        return config.llm_for(user).model != config.llm.model

    def _open(self, argument: str) -> bool:
        files = session_artifacts(self.session.conversation.rounds)  # numbered first, as the chat named them when they were shown
        files += saved_files(self.session.working_dir, loaded={load.name for load in self.session.loads}, known=files)
        if not argument:
            listed = [f"  {number}. {path}" for number, path in enumerate(files, 1)]
            self.say("\n".join(["Files the cells produced (/open N shows one):", *listed]) if files else "No plots or files yet.")
            return True
        if not argument.isdigit() or not 1 <= int(argument) <= len(files):
            self.say(f"Usage: /open N, N from 1 to {len(files)} (/open lists them)" if files else "No plots or files yet.")
            return True
        path = files[int(argument) - 1]
        if not path.is_file():
            raise TaskWeaverError(f"{path} is no longer there")
        command = viewer_command(path)
        if command is None:
            self.say(f"No viewer found (xdg-open is not installed); the file is {path}")
            return True
        subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=os.environ.copy())
        self.say(f"Opened {path}")
        return True
