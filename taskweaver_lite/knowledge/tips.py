"""Experience tips: what a session taught (an error and its fix, a preference of the user), and handcrafted ones from YAML.

Handcrafted tips are TaskWeaver's handcrafted experience files, read unchanged: each
`PROJECT_DIR/experience/*.yaml` holds `exp_id` and `experience_text` (TaskWeaver's own extra keys,
`raw_experience_path`, `embedding_model` and `embedding`, are ignored; its `exp_<id>.yaml` copy of a
`handcrafted_exp_<id>.yaml` is the same tip once). An `exp_<id>.yaml` with no handcrafted twin was
written by TaskWeaver's experience generator from one of its conversations: it is read the same way
and labelled as TaskWeaver's, not as handcrafted. Its `raw_exp_*.yaml` files are whole
conversations, not tips: they are reported as not read.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

from taskweaver_lite.config.yaml_reader import parse_yaml
from taskweaver_lite.records.tips import Tip, TipKind


@dataclass(frozen=True)
class HandcraftedTips:
    """The tips read from the experience folder, and one line per file that could not be used."""

    tips: tuple[Tip, ...] = ()
    problems: tuple[str, ...] = ()


def read_handcrafted(folder: Path) -> HandcraftedTips:
    """Every `*.yaml` in `folder` as a tip (TaskWeaver's `exp_id` + `experience_text`); broken files named, never fatal."""
    if not folder.is_dir():
        return HandcraftedTips()
    tips: dict[str, Tip] = {}
    problems: list[str] = []
    files = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")], key=lambda p: (not p.name.startswith("handcrafted_exp_"), p.name))
    for path in files:
        if path.name.startswith("raw_exp_"):
            problems.append(f"{path}: a TaskWeaver conversation record (raw_exp_*), not a tip: not read; write its lessons as a handcrafted tip")
            continue
        try:
            tip = _read_tip(path)
        except ValueError as exc:
            problems.append(f"{path}: {exc}; a handcrafted tip is `exp_id: ...` and `experience_text: ...` (TaskWeaver's format)")
            continue
        tips.setdefault(tip.id, tip)  # exp_<id>.yaml repeats handcrafted_exp_<id>.yaml
    return HandcraftedTips(tips=tuple(tips.values()), problems=tuple(problems))


def _read_tip(path: Path) -> Tip:
    try:
        data = parse_yaml(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"cannot be read ({exc})") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"not valid YAML{where} ({getattr(exc, 'problem', None) or exc})") from None
    if not isinstance(data, dict):
        raise ValueError("expected a mapping")
    missing = [key for key in ("exp_id", "experience_text") if data.get(key) in (None, "")]
    if missing:
        raise ValueError(f"no {' or '.join(missing)}")
    text = data["experience_text"]
    if not isinstance(text, str):
        raise ValueError("experience_text must be text")
    # handcrafted_exp_<id>.yaml are sorted first: an exp_<id>.yaml read here with no such twin is TaskWeaver's own summary.
    kind: TipKind = "taskweaver" if path.name.startswith("exp_") else "handcrafted"
    return Tip(id=str(data["exp_id"]), kind=kind, text=text.strip(), source=path.name, created_at=path.stat().st_mtime)
