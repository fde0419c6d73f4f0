"""`taskweaver-lite models`: which local model servers answer, and which models each serves."""

from __future__ import annotations

import json

from taskweaver_lite.llm.discovery import KNOWN_SERVERS, discover


def list_models(*, as_json: bool) -> int:
    """Print the reachable local servers (all asked at once, a short timeout each); exit 0 even when none is."""
    found = discover(wait_at_most=1.0)  # a command, not start-up: it can wait a little longer for a slow one
    if as_json:
        print(json.dumps([server.to_dict() for server in found], indent=2))
        return 0
    if not found:
        ports = ", ".join(f"{name} {port}" for name, port in KNOWN_SERVERS)
        print(f"No local model server answered on 127.0.0.1 ({ports}). Start one (see the README), or set llm.api_base.")
        return 0
    for server in found:
        models = ", ".join(server.models) if server.models else "(no models pulled yet)"
        print(f"{server.name} at {server.api_base}: {models}")
    return 0
