"""Few-shot examples: chat transcripts in YAML under `PROJECT_DIR/examples/<role>/`.

Each file holds `messages:`, a list of `{role: user|assistant, content: ...}`; they are shown to
the model between the system prompt and the history, and are the first thing the budget guard
leaves out when a prompt is too long.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from taskweaver_lite.config.file import load_yaml
from taskweaver_lite.errors import ConfigError
from taskweaver_lite.records.model_calls import Message


def load_examples(project_dir: Path, role: str) -> list[Message]:
    """All example messages for the role whose key is `role`, from `examples/<role>/*.yaml` in name order."""
    folder = project_dir / "examples" / role
    messages: list[Message] = []
    for path in sorted(folder.glob("*.yaml")) if folder.is_dir() else ():
        try:
            data = load_yaml(path.read_text(encoding="utf-8"), source=path) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"{path}: not valid YAML ({str(exc).splitlines()[0]})") from None
        items = data.get("messages") if isinstance(data, dict) else None
        if not isinstance(items, list) or not items:
            raise ConfigError(f"{path}: expected 'messages:' with a list of {{role, content}} entries")
        for number, item in enumerate(items, 1):
            if not isinstance(item, dict) or item.get("role") not in ("user", "assistant") or not isinstance(item.get("content"), str):
                raise ConfigError(f"{path}: messages[{number}] needs role user|assistant and a text content")
            messages.append(Message(role=item["role"], content=item["content"].strip()))
    return messages
