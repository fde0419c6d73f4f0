"""The admin page's routes, and a user's own: who may do what to the service's users, its sessions and its kernels.

    GET    /admin                            the admin page (static/admin.html; its data comes from the routes below)
    GET    /api/me                           the caller: {name, admin, users} (users: whether the server has users)
    POST   /api/me/token                     a new token for the caller (shown once); their old one and its sign-ins stop at once
    GET    /api/admin/users                  every user: {name, admin, created_at, expires_at}
    POST   /api/admin/users                  {"name", "admin", "expires_days"}: a new user -> {"name", "token"} (shown once)
    POST   /api/admin/users/{name}/{action}  rotate (-> token), promote, demote, expire ({"days": N or null})
    DELETE /api/admin/users/{name}           remove the user (their sessions stay)
    GET    /api/admin/sessions               every session with its owner
    GET    /api/admin/kernels                the kernels on the gateway (or open here), each with its session and owner
    GET    /api/admin/usage                  per user: sessions, cells, cell seconds, and per model the calls and tokens
    GET    /api/admin/audit?limit=N          the latest N audit entries (default 200), oldest first

Every `/api/admin/...` route is for admins only (403 for anyone else; 404 on a server without users).
Each change is written to the audit trail with the admin as its actor, in the change's transaction.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from taskweaver_lite.errors import StoreError
from taskweaver_lite.store.interface import Actor, User
from taskweaver_lite.web.api import error
from taskweaver_lite.web.audit_trail import source_of
from taskweaver_lite.web.auth import COOKIE, Access
from taskweaver_lite.web.hub import Hub

Handler = Callable[[Request], Awaitable[Response]]
AdminHandler = Callable[[Request, Hub, User], Awaitable[Response]]
AUDIT_LIMIT = 200
MAX_AUDIT_LIMIT = 5000
GATEWAY_TIMEOUT = 5.0
MAX_KERNELS_ASKED = 500  # where the gateway does not list its kernels, those of the store's sessions asked one by one, at most this many


def admin_routes(hub: Hub, page: Handler, access: Access) -> list[Route]:
    """The admin page, its routes, and the caller's own (`/api/me`)."""
    return [
        Route("/admin", page),
        Route("/api/me", _me),
        Route("/api/me/token", functools.partial(_own_token, hub=hub, access=access), methods=["POST"]),
        Route("/api/admin/users", _admin(hub, _users), methods=["GET", "POST"]),
        Route("/api/admin/users/{name}/{action}", _admin(hub, _change), methods=["POST"]),
        Route("/api/admin/users/{name}", _admin(hub, _remove), methods=["DELETE"]),
        Route("/api/admin/sessions", _admin(hub, _sessions)),
        Route("/api/admin/kernels", _admin(hub, _kernels)),
        Route("/api/admin/usage", _admin(hub, _usage)),
        Route("/api/admin/audit", _admin(hub, _audit)),
    ]


def _caller(request: Request) -> User | None:
    user = request.scope.get("state", {}).get("user")
    return user if isinstance(user, User) else None


def _actor(request: Request, user: User) -> Actor:
    return Actor(user.name, source_of(request))


async def _me(request: Request) -> Response:
    user = _caller(request)
    if user is None:
        return JSONResponse({"name": None, "admin": False, "users": False})
    return JSONResponse({"name": user.name, "admin": user.admin, "users": True, "expires_at": user.expires_at})


async def _own_token(request: Request, *, hub: Hub, access: Access) -> Response:
    """A new token for the caller; a browser signed in gets a new sign-in with it (the old token's sign-ins end with it)."""
    user = _caller(request)
    if user is None:
        return error(404, "This server has no users: its one token is the one it was started with.")
    try:
        token = await asyncio.to_thread(functools.partial(hub.parts.store.rotate_token, user.name, by=_actor(request, user)))
        if token is None:
            return error(404, "You are no longer a user here.")
        answer = JSONResponse({"name": user.name, "token": token})
        if COOKIE in request.cookies and access.sign_ins is not None:
            value = await asyncio.to_thread(functools.partial(access.sign_in_user, user, via="token"))
            seconds = round(access.sign_in_hours * 3600)
            answer.set_cookie(COOKIE, value, max_age=seconds, httponly=True, samesite="strict", secure=access.proxies.is_https(request))
    except StoreError:
        return error(503, "The session store cannot be reached, so no token was made; try again shortly.")
    return answer


def _admin(hub: Hub, handler: AdminHandler) -> Handler:
    """A route for admins only: 404 without users, 403 for a user who is not an admin; the store down is 503."""

    async def route(request: Request) -> Response:
        user = _caller(request)
        if user is None:
            return error(404, "This server has no users, so it has no admin page: add one with `taskweaver-lite users add NAME --admin`.")
        if not user.admin:
            return error(403, f"{user.name} is not an admin: the admin page is for admins (`taskweaver-lite users promote NAME`).")
        try:
            return await handler(request, hub, user)
        except StoreError:
            return error(503, "The session store cannot be reached; try again shortly.")

    return route


async def _users(request: Request, hub: Hub, admin: User) -> Response:
    store = hub.parts.store
    if request.method == "POST":
        body = await _json(request)
        name = str(body.get("name", "")).strip()
        days = body.get("expires_days")
        if days is not None and (isinstance(days, bool) or not isinstance(days, (int, float)) or days <= 0):
            return error(400, "expires_days is a number of days above 0, or null for never.")
        try:
            token = await asyncio.to_thread(
                functools.partial(store.add_user, name, admin=bool(body.get("admin")), expires_days=days, by=_actor(request, admin))
            )
        except StoreError as exc:
            if "already" in str(exc) or "not a usable user name" in str(exc):
                return error(400, str(exc).split(" in ", 1)[0] if "already" in str(exc) else str(exc))
            raise
        return JSONResponse({"name": name, "token": token})
    users = await asyncio.to_thread(store.users)
    return JSONResponse([user.to_dict() for user in users])


async def _change(request: Request, hub: Hub, admin: User) -> Response:
    store = hub.parts.store
    name, action = request.path_params["name"], request.path_params["action"]
    by = _actor(request, admin)
    if action == "rotate":
        token = await asyncio.to_thread(functools.partial(store.rotate_token, name, by=by))
        return JSONResponse({"name": name, "token": token}) if token is not None else _no_user(name)
    if action in ("promote", "demote"):
        if action == "demote" and name == admin.name:
            return error(400, "You cannot demote yourself here: another admin can, or `taskweaver-lite users demote`.")
        changed = await asyncio.to_thread(functools.partial(store.set_admin, name, admin=action == "promote", by=by))
    elif action == "expire":
        days = (await _json(request)).get("days")
        if days is not None and (isinstance(days, bool) or not isinstance(days, (int, float)) or days < 0):
            return error(400, "days is a number of days from now (0: at once), or null for never.")
        changed = await asyncio.to_thread(functools.partial(store.set_expiry, name, expires_days=days, by=by))
    else:
        return error(404, f"No action {action!r}: rotate, promote, demote or expire.")
    return JSONResponse({"name": name, "done": action}) if changed else _no_user(name)


async def _remove(request: Request, hub: Hub, admin: User) -> Response:
    name = request.path_params["name"]
    if name == admin.name:
        return error(400, "You cannot remove yourself here: another admin can, or `taskweaver-lite users remove`.")
    removed = await asyncio.to_thread(functools.partial(hub.parts.store.remove_user, name, by=_actor(request, admin)))
    return JSONResponse({"removed": name}) if removed else _no_user(name)


async def _sessions(_: Request, hub: Hub, __: User) -> Response:
    rows = await asyncio.to_thread(hub.parts.store.list_sessions)
    return JSONResponse([row.to_dict() for row in rows])


async def _kernels(_: Request, hub: Hub, __: User) -> Response:
    """The gateway's kernels, each with the session it runs and that session's owner; without a gateway, the sessions open here."""
    store = hub.parts.store
    owners = {row.id: row.owner for row in await asyncio.to_thread(store.list_sessions)}
    gateway = hub.config.execution.kernel_gateway
    if gateway is None:
        live = [{"kernel": None, "session": session_id, "owner": owners.get(session_id), "state": "open here"} for session_id in hub.open_ids()]
        return JSONResponse({"gateway": None, "kernels": live})
    by_kernel = await asyncio.to_thread(store.session_kernels)
    found = await asyncio.to_thread(_gateway_kernels, gateway.url, gateway.request_headers(), gateway.validate_cert, list(by_kernel))
    if isinstance(found, str):
        return JSONResponse({"gateway": gateway.url, "error": found, "kernels": []})
    kernels = []
    for kernel in found:
        session_id = by_kernel.get(str(kernel.get("id")))
        kernels.append(
            {
                "kernel": kernel.get("id"),
                "session": session_id,
                "owner": owners.get(session_id) if session_id else None,
                "state": kernel.get("execution_state"),
                "last_activity": kernel.get("last_activity"),
                "connections": kernel.get("connections"),
            }
        )
    return JSONResponse({"gateway": gateway.url, "kernels": kernels})


def _gateway_kernels(url: str, headers: dict[str, str], verify: bool, known: list[str]) -> list[dict[str, Any]] | str:
    """The gateway's kernels: its list, or where listing is off (`taskweaver-lite gateway`'s default), each kernel the store knows, asked one by one."""
    import requests

    try:
        with requests.Session() as http:
            answer = http.get(f"{url}/api/kernels", headers=headers, timeout=GATEWAY_TIMEOUT, verify=verify)
            if answer.ok and isinstance(answer.json(), list):
                return [kernel for kernel in answer.json() if isinstance(kernel, dict)]
            if answer.status_code not in (403, 404):
                return f"the gateway answered HTTP {answer.status_code}"
            kernels = []
            for kernel_id in known[:MAX_KERNELS_ASKED]:
                one = http.get(f"{url}/api/kernels/{kernel_id}", headers=headers, timeout=GATEWAY_TIMEOUT, verify=verify)
                if one.ok and isinstance(one.json(), dict):
                    kernels.append(one.json())
            return kernels
    except (requests.RequestException, ValueError) as exc:
        return f"the gateway does not answer ({type(exc).__name__})"


async def _usage(_: Request, hub: Hub, __: User) -> Response:
    usage = await asyncio.to_thread(hub.parts.store.usage_by_user)
    return JSONResponse([entry.to_dict() for entry in usage])


async def _audit(request: Request, hub: Hub, __: User) -> Response:
    try:
        limit = min(max(int(request.query_params.get("limit", AUDIT_LIMIT)), 1), MAX_AUDIT_LIMIT)
    except ValueError:
        return error(400, "limit is a whole number of entries.")
    entries = await asyncio.to_thread(functools.partial(hub.parts.store.audit_entries, limit=limit))
    return JSONResponse([entry.to_dict() for entry in entries])


async def _json(request: Request) -> dict[str, Any]:
    body = await request.body()
    if not body:
        return {}
    import json

    try:
        parsed = json.loads(body)
    except ValueError:
        return {}
    return parsed if isinstance(parsed, dict) else {}


def _no_user(name: str) -> Response:
    return error(404, f"There is no user {name!r}.")
