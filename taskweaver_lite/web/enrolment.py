"""Users an identity provider vouches for: who may come in, added at their first sign-in, their admin flag kept in step.

Single sign-on (an OpenID Connect provider: oidc.py; or a trusted proxy's user and groups headers:
auth.py) names a person and their groups. `admitted` says whether the settings let them in
(`allowed_domains`, `allowed_groups`) and whether they are an admin (`admin_groups`); `enrol` finds
them among the store's users, adding them at their first sign-in, unless they were removed (the audit
trail says so): a removed user stays out until an administrator adds them again with `users add`.
Every addition, promotion and demotion is written to the audit trail, by the provider.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.interface import Actor, Store, User
from taskweaver_lite.store.users import check_name


@dataclass(frozen=True)
class Admission:
    """A person the provider vouched for and the settings let in: their name here, and whether they are an admin (None: not decided by groups)."""

    name: str
    admin: bool | None


def admitted(
    name: str,
    *,
    groups: Sequence[str],
    email: str | None = None,
    allowed_domains: Sequence[str] = (),
    allowed_groups: Sequence[str] = (),
    admin_groups: Sequence[str] = (),
) -> Admission | str:
    """Whether the settings let this person in (an Admission), or the one line saying why not.

    `email` is the provider's verified address (None: none verified), checked against `allowed_domains`.
    """
    try:
        check_name(name)
    except ValueError as exc:
        return f"The provider names you {name!r}, which is no usable user name here ({exc})."
    if allowed_domains:
        domain = email.rsplit("@", 1)[1].lower() if email and "@" in email else None
        if domain not in {entry.lower().lstrip("@") for entry in allowed_domains}:
            return f"{name} may not sign in here: only addresses at {', '.join(allowed_domains)} may (a verified email is needed)."
    if allowed_groups and not set(groups) & set(allowed_groups):
        return f"{name} may not sign in here: only members of {', '.join(allowed_groups)} may."
    admin = bool(set(groups) & set(admin_groups)) if admin_groups else None
    return Admission(name, admin)


def enrol(store: Store, admission: Admission, *, by: Actor) -> User | str:
    """The store's user for `admission`: added at their first sign-in, their admin flag set to match; the line saying why not when they were removed."""
    user = store.user_by_name(admission.name)
    if user is None:
        if store.was_removed(admission.name):
            return f"{admission.name} was removed from this service: an administrator adds them again with `taskweaver-lite users add {admission.name}`."
        with contextlib.suppress(StoreError):  # added a moment ago by another replica's sign-in: theirs is read below
            store.add_user(admission.name, admin=bool(admission.admin), by=by, detail="first sign-in, by " + by.name)
        user = store.user_by_name(admission.name)
        if user is None:
            return f"{admission.name} was removed while signing in."
        return user
    if admission.admin is not None and admission.admin != user.admin:
        store.set_admin(user.name, admin=admission.admin, by=by)
        user = store.user_by_name(admission.name) or user
    return user
