"""Few-shot examples: chat transcripts in YAML under `PROJECT_DIR/examples/`, ours and TaskWeaver's.

Two shapes are read, from `examples/<role>/` and from TaskWeaver's `examples/<role>_examples/`
(`planner_examples`, `code_generator_examples`), each file by what it holds:
- ours: `messages:`, a list of `{role: user|assistant, content: ...}`;
- TaskWeaver's: `rounds:` of `post_list:` posts (`send_from`, `send_to`, `message`,
  `attachment_list` of `{type, content}`), turned into the same messages from the role's side: the
  posts it received are user messages, its own are its JSON replies. As in TaskWeaver, a
  conversation is used only when every party in it is one the role talks to (a Planner example
  with `Echo` waits for the echo role), and `enabled: false` leaves a file out.
They are shown to the model between the system prompt and the history, and are the first thing
the budget guard leaves out when a prompt is too long.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import yaml

from taskweaver_lite.config.yaml_reader import load_yaml
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.records.model_calls import Message

TASKWEAVER_SUFFIX = "_examples"  # TaskWeaver's folder of a role's examples: examples/planner_examples
_PLANNER_FIELDS = ("init_plan", "plan", "current_plan_step")
_CODE_FIELDS = ("thought", "reply_type", "reply_content")


def load_examples(project_dir: Path, role: str, *, party: str = "", parties: Collection[str] | None = None) -> list[Message]:
    """The example messages for the role whose key is `role`, ours then TaskWeaver's, each folder in name order.

    `party` is the role's name in a conversation (`Planner`, `CodeInterpreter`) and `parties` every name
    it talks to, itself included: TaskWeaver's examples are read from its side, and one naming anyone
    else is left out. Without `party`, TaskWeaver's files are not read.
    """
    messages: list[Message] = []
    for folder in (project_dir / "examples" / role, project_dir / "examples" / f"{role}{TASKWEAVER_SUFFIX}"):
        for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
            data = _read(path)
            if isinstance(data, dict) and "rounds" in data:
                messages += taskweaver_example(data, path=path, party=party, parties=parties) if party else []
            else:
                messages += _chat_example(data, path=path)
    return messages


def _read(path: Path) -> Any:
    try:
        return load_yaml(path.read_text(encoding="utf-8"), source=path) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None


def _chat_example(data: Any, *, path: Path) -> list[Message]:
    """Our shape: `messages:` with `{role, content}` entries."""
    items = data.get("messages") if isinstance(data, dict) else None
    if not isinstance(items, list) or not items:
        raise ConfigError(f"{path}: expected 'messages:' with a list of {{role, content}} entries (or TaskWeaver's 'rounds:')")
    messages = []
    for number, item in enumerate(items, 1):
        if not isinstance(item, dict) or item.get("role") not in ("user", "assistant") or not isinstance(item.get("content"), str):
            raise ConfigError(f"{path}: messages[{number}] needs role user|assistant and a text content")
        messages.append(Message(role=item["role"], content=item["content"].strip()))
    return messages


def taskweaver_example(data: Mapping[str, Any], *, path: Path, party: str, parties: Collection[str] | None) -> list[Message]:
    """A TaskWeaver example conversation as `party`'s messages; none when it is disabled or names a party not in `parties`."""
    if data.get("enabled", True) is False:
        return []
    posts = [_post(post, path=path) for rnd in _list(data, "rounds", path=path) for post in _list(rnd, "post_list", path=path)]
    named = {name for post in posts for name in (post["send_from"], post["send_to"])}
    if parties is not None and not named <= {*parties, party}:
        return []
    messages = []
    for post in posts:
        if post["send_to"] == party and post["send_from"] != party:
            sender, text = post["send_from"], post["message"]
            messages.append(Message(role="user", content=text if sender == "User" or _is_request(party) else f"{sender}: {text}"))
        elif post["send_from"] == party:
            messages += _reply(post, party=party)
    return messages


def _is_request(party: str) -> bool:
    """Whether what `party` receives is a step to do (the CodeInterpreter's), shown as it is, not as a report."""
    return party != "Planner"


def _reply(post: Mapping[str, Any], *, party: str) -> list[Message]:
    """`party`'s own post as its JSON reply (and, for code that ran, the result it was shown after it)."""
    attached = {kind: content.replace("{ROLE_NAME}", party) for kind, content in post["attachments"].items()}
    if "reply_content" in attached or "reply_type" in attached:  # the CodeInterpreter's: thought, reply_type, reply_content
        fields: dict[str, str] = {name: attached.get(name, "") for name in _CODE_FIELDS}
        fields["reply_type"] = fields["reply_type"] or "text"
        reply = [Message(role="assistant", content=json.dumps({"response": fields}, ensure_ascii=False))]
        result = attached.get("execution_result", "")
        if fields["reply_type"] == "python" and result:
            reply.append(Message(role="user", content=f"Execution result of the code above:\n{result}"))
        return reply
    planned = {name: attached.get(name, "") for name in _PLANNER_FIELDS}
    response = {**planned, "send_to": post["send_to"], "message": post["message"]}
    return [Message(role="assistant", content=json.dumps({"response": response}, ensure_ascii=False))]


def _post(post: Any, *, path: Path) -> dict[str, Any]:
    """One TaskWeaver post, checked: its parties, its message, its attachments by type."""
    if not isinstance(post, dict) or not all(isinstance(post.get(key), str) for key in ("send_from", "send_to")):
        raise ConfigError(f"{path}: each post of post_list needs send_from and send_to (TaskWeaver's example format)")
    attachments = {}
    for item in post.get("attachment_list") or []:
        if isinstance(item, dict) and isinstance(item.get("type"), str):
            attachments[item["type"]] = str(item.get("content") or "").strip()
    return {"send_from": post["send_from"], "send_to": post["send_to"], "message": str(post.get("message") or "").strip(), "attachments": attachments}


def _list(data: Any, key: str, *, path: Path) -> list[Any]:
    items = data.get(key) if isinstance(data, dict) else None
    if not isinstance(items, list):
        raise ConfigError(f"{path}: expected '{key}:' with a list (TaskWeaver's example format: rounds of post_list)")
    return items
