"""What a role file imports: `from taskweaver_lite.role import Attachment, Post, RoleRequest, RoleTools`.

A project role's class implements one method, `reply(self, request: RoleRequest, tools: RoleTools) -> Post`
(roles/worker.py says what each holds); this module gathers the names it needs in one place.
"""

from __future__ import annotations

from taskweaver_lite.records.conversation import Attachment, Post
from taskweaver_lite.roles.worker import RoleRequest, RoleTools

__all__ = ["Attachment", "Post", "RoleRequest", "RoleTools"]
