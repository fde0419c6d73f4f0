"""The `echo` role: the smallest role there is, built in and off by default (`session.roles: [..., echo]`).

It answers every request with the request's own text: a way to see routing work end to end without
a model, and the example a project role's class follows (`reply(request, tools) -> Post`).
"""

from __future__ import annotations

from taskweaver_lite.records.conversation import Post
from taskweaver_lite.roles.worker import RoleRequest, RoleTools

ECHO_INTRO = "- Echo repeats the message it is sent, word for word (for trying out routing)."


class Echo:
    """Answers with the message it was sent."""

    def reply(self, request: RoleRequest, tools: RoleTools) -> Post:
        """The request's text, back to its sender."""
        return request.answer(request.message)
