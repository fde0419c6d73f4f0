"""TaskWeaver's conversation values as a TaskWeaver role class reads them: `Memory`, `Round`, `Post`, `Attachment`.

A role written for TaskWeaver gets `reply(memory)` and asks `memory.get_role_rounds(role=alias)`
for its rounds; it answers with a `Post` (usually from the event emitter's post proxy). Here those
are built fresh for each request from the role's own view of our conversation (`memory_for`: its
finished rounds, then the running one with the request last) and the reply is turned back into
our post (`our_post`). They are plain mutable dataclasses, as TaskWeaver's are, because role code
appends to them; nothing here reaches back into the session.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from taskweaver_lite.records import conversation as ours

RoleName = str


class AttachmentType(Enum):
    """The kinds of attachment TaskWeaver names; ours carry the value as their `kind`."""

    init_plan = "init_plan"
    plan = "plan"
    current_plan_step = "current_plan_step"
    plan_reasoning = "plan_reasoning"
    stop = "stop"
    thought = "thought"
    reply_type = "reply_type"
    reply_content = "reply_content"
    verification = "verification"
    code_error = "code_error"
    execution_status = "execution_status"
    execution_result = "execution_result"
    artifact_paths = "artifact_paths"
    revise_message = "revise_message"
    function = "function"
    web_exploring_plan = "web_exploring_plan"
    web_exploring_screenshot = "web_exploring_screenshot"
    web_exploring_link = "web_exploring_link"
    invalid_response = "invalid_response"
    text = "text"
    shared_memory_entry = "shared_memory_entry"
    image_url = "image_url"


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Attachment:
    """A typed piece of a post: its type, its text, and anything extra."""

    id: str
    type: AttachmentType
    content: str
    extra: Any = None

    @staticmethod
    def create(type: AttachmentType | str, content: str, id: str | None = None, extra: Any = None) -> Attachment:
        """An attachment of `type` (an AttachmentType or its value)."""
        kind = type if isinstance(type, AttachmentType) else AttachmentType(type)
        return Attachment(id=id or _new_id("atta"), type=kind, content=content, extra=extra)

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {id, type, content, extra}."""
        return {"id": self.id, "type": self.type.value, "content": self.content, "extra": self.extra}


@dataclass
class Post:
    """A message between two roles, with its attachments."""

    id: str
    send_from: RoleName
    send_to: RoleName
    message: str
    attachment_list: list[Attachment] = field(default_factory=list)

    @staticmethod
    def create(message: str | None, send_from: RoleName, send_to: RoleName = "Unknown", attachment_list: list[Attachment] | None = None) -> Post:
        """A new post."""
        return Post(id=_new_id("post"), send_from=send_from, send_to=send_to, message=message or "", attachment_list=list(attachment_list or []))

    def add_attachment(self, attachment: Attachment) -> None:
        """Append an attachment."""
        self.attachment_list.append(attachment)

    def get_attachment(self, type: AttachmentType) -> list[Attachment]:
        """The attachments of one type."""
        return [a for a in self.attachment_list if a.type == type]

    def del_attachment(self, type_list: list[AttachmentType]) -> None:
        """Drop the attachments of these types."""
        self.attachment_list = [a for a in self.attachment_list if a.type not in type_list]

    def to_dict(self) -> dict[str, Any]:
        """JSON shape: {id, message, send_from, send_to, attachment_list}."""
        return {
            "id": self.id,
            "message": self.message,
            "send_from": self.send_from,
            "send_to": self.send_to,
            "attachment_list": [a.to_dict() for a in self.attachment_list],
        }


@dataclass
class Round:
    """One user query and the posts it caused; state is created (running), finished or failed."""

    id: str
    user_query: str
    state: str
    post_list: list[Post] = field(default_factory=list)

    @staticmethod
    def create(user_query: str, id: str | None = None, state: str = "created", post_list: list[Post] | None = None) -> Round:
        """A new round."""
        return Round(id=id or _new_id("round"), user_query=user_query, state=state, post_list=list(post_list or []))

    def add_post(self, post: Post) -> None:
        """Append a post."""
        self.post_list.append(post)

    def change_round_state(self, new_state: str) -> None:
        """Set the round's state."""
        self.state = new_state


@dataclass
class Conversation:
    """The rounds, in order."""

    rounds: list[Round] = field(default_factory=list)


class Memory:
    """The conversation a role is handed: its rounds, filtered per role on request."""

    def __init__(self, session_id: str, rounds: Sequence[Round] = ()) -> None:
        self.session_id = session_id
        self.conversation = Conversation(list(rounds))

    def get_role_rounds(self, role: RoleName, include_failure_rounds: bool = False) -> list[Round]:
        """Copies of the rounds with only the posts `role` sent or received (failed rounds left out unless asked for)."""
        rounds = []
        for rnd in self.conversation.rounds:
            if rnd.state == "failed" and not include_failure_rounds:
                continue
            posts = [copy.deepcopy(p) for p in rnd.post_list if role in (p.send_from, p.send_to)]
            rounds.append(Round(id=rnd.id, user_query=rnd.user_query, state=rnd.state, post_list=posts))
        return rounds

    def get_shared_memory_entries(self, entry_type: str) -> list[Any]:
        """Entries roles share through their posts; none are kept here, so none."""
        return []


_STATES = {"running": "created", "finished": "finished", "failed": "failed"}


def memory_for(session_id: str, history: Sequence[ours.Round], current: ours.Round) -> Memory:
    """The role's view as TaskWeaver's Memory: its finished rounds, then the running one (the request its last post)."""
    return Memory(session_id, [_round(rnd) for rnd in [*history, current]])


def _round(rnd: ours.Round) -> Round:
    return Round(id=rnd.id, user_query=rnd.user_query, state=_STATES.get(rnd.state, rnd.state), post_list=[_post(p) for p in rnd.posts])


def _post(post: ours.Post) -> Post:
    attachments = [Attachment.create(_kind(a.kind), a.content) for a in post.attachments]
    return Post(id=post.id, send_from=post.send_from, send_to=post.send_to, message=post.message, attachment_list=attachments)


def _kind(kind: str) -> AttachmentType:
    try:
        return AttachmentType(kind)
    except ValueError:
        return AttachmentType.text


# Said with a reply that carries an image (TaskWeaver's ImageReader attaches one as a data URL): the Planner's
# prompt here is text, so it must not be told it was shown a picture it never saw.
IMAGE_NOT_PASSED = (
    "(The image itself was not passed on: the Planner's model here reads text only. To learn what the image holds, have the CodeInterpreter analyse the file.)"
)


def our_post(post: Post) -> ours.Post:
    """A TaskWeaver role's reply as our post: its message, and each attachment as a typed one (`kind` is its type's value).

    An `image_url` attachment keeps its text, not the image (a data URL would fill the prompt with base64);
    the message then says, in one line, that the image did not reach the Planner.
    """
    attachments = tuple(ours.Attachment(kind=a.type.value, content=str(a.content)) for a in post.attachment_list)
    images = any(a.type == AttachmentType.image_url for a in post.attachment_list)
    message = f"{post.message}\n{IMAGE_NOT_PASSED}" if images else post.message
    return ours.Post(send_from=post.send_from, send_to=post.send_to, message=message, attachments=attachments)
