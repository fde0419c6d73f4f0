"""Export: a stored session as a Jupyter notebook that re-runs top to bottom, or as a Markdown transcript.

The notebook keeps every cell the kernel ran, in order, with its recorded outputs: a request and
an answer become markdown cells, code becomes code cells. A failed attempt stays (the kernel ran
it, later cells may rely on what it did before raising), is marked in a note, and is tagged
`raises-exception` so Jupyter's "run all" and nbclient carry on past it. Code that hung or killed
the kernel is shown as text, not as a cell, so a re-run neither hangs nor crashes. Files loaded
with `/load` are noted where they were loaded.

The notebook carries what its cells need beyond the libraries, so it runs top to bottom anywhere:
its first cell changes to the session's working folder by its absolute path when that folder is
on the machine (else it stays in the notebook's folder); the files loaded with `/load` (up to
`MAX_CARRIED_BYTES` together) are embedded and written where they are missing; and the plugins the
code calls are defined by a cell that loads the kernel's plugin runtime (`kernel/plugin_runtime.py`,
standalone) and each plugin's source, as the session's kernel loaded them.
"""

from __future__ import annotations

import base64
import inspect
import json
import re
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from taskweaver_lite.config.settings import Config
from taskweaver_lite.errors import TaskWeaverError
from taskweaver_lite.kernel import plugin_runtime
from taskweaver_lite.records.conversation import USER, Post, Round
from taskweaver_lite.records.events import FileLoaded, timeline
from taskweaver_lite.records.execution import ExecutionResult
from taskweaver_lite.safety.workfiles import read_below, read_path
from taskweaver_lite.store.interface import Store, StoredSession
from taskweaver_lite.store.opening import has_store, open_store

if TYPE_CHECKING:
    from nbformat.notebooknode import NotebookNode

    from taskweaver_lite.records.plugin_spec import PluginSpec

IMAGE_TYPES = {".png": "image/png", ".jpg": "image/jpeg", ".jpeg": "image/jpeg", ".svg": "image/svg+xml"}
RAISES_TAG = "raises-exception"
MAX_EMBEDDED_BYTES = 50 * 1024 * 1024  # an image larger than this is named, not embedded
MAX_CARRIED_BYTES = 20 * 1024 * 1024  # loaded files embedded in a notebook, together; past it they are named


def write_export(config: Config, ref: str, *, fmt: str, target: Path | None, force: bool = False, owner: str | None = None) -> Path:
    """Export a stored session (by id or 'last') as a notebook or Markdown; returns the file written.

    An existing file is kept (TaskWeaverError) unless `force`. With `owner`, only that user's sessions are found.
    """
    if not has_store(config):
        raise TaskWeaverError(f"{config.store_path}: no stored sessions in this project yet")
    store = open_store(config, read_only=True)
    try:
        session_id = store.resolve(ref, owner=owner)
        stored = store.load(session_id)
        kept = _kept_artifacts(store, session_id)
    finally:
        store.close()
    path = target or Path(f"{session_id}.{fmt}")
    if path.exists() and not force:
        raise TaskWeaverError(f"{path} exists and was left as it is; choose another file name, or add --force to overwrite it")
    if fmt == "ipynb":
        from taskweaver_lite.plugins.catalog import discover

        plugins = discover(config.project_dir).enabled
        return export_notebook(stored, path, working_dir=config.sessions_dir / session_id / "cwd", plugins=plugins, kept=kept)
    return export_markdown(stored, path, kept=kept)


def export_notebook(
    stored: StoredSession, path: Path, *, working_dir: Path | None = None, plugins: Sequence[PluginSpec] = (), kept: Kept | None = None
) -> Path:
    """Write the session as an .ipynb (nbformat v4, validated); `working_dir` adds the set-up cells, `plugins` those the code calls.

    `kept` gives the bytes of an artifact no longer (or never) on this machine's disk, by name (a PostgreSQL store keeps them).
    """
    import nbformat  # its JSON-schema validator takes ~1 s to import: only when a notebook is written

    cells: list[NotebookNode] = [nbformat.v4.new_markdown_cell(_heading(stored))]
    counter = _Counter()
    # Artifacts are read no deeper than the session's folder, link-safe; else from the store.
    source = ArtifactSource(Path(working_dir).parent if working_dir is not None else None, kept)
    if working_dir is not None:
        cells += _setup_cells(stored, Path(working_dir), counter)
    cells += _plugin_cells(stored, plugins, counter)
    for entry in timeline(stored.rounds, stored.loads):
        cells.extend(_round_cells(entry, counter, source) if isinstance(entry, Round) else [nbformat.v4.new_markdown_cell(f"*{_load_note(entry)}*")])
    notebook = nbformat.v4.new_notebook(
        cells=cells,
        metadata={
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"},
            "language_info": {"name": "python"},
            "taskweaver_lite": {"session_id": stored.id},
        },
    )
    nbformat.validate(notebook)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(notebook, str(path))
    return path


def export_markdown(stored: StoredSession, path: Path, *, kept: Kept | None = None) -> Path:
    """Write the session as a readable Markdown transcript: requests, plans, code, outputs, answers (`kept` as in export_notebook)."""
    path = Path(path)
    images = ImageCopies(path, kept=kept)
    lines = [f"# {stored.title or stored.id}", "", _about(stored), ""]
    for entry in timeline(stored.rounds, stored.loads):
        lines.extend(_round_markdown(entry, images) if isinstance(entry, Round) else [f"*{_load_note(entry)}*", ""])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


def _chdir_source(working_dir: Path) -> str:
    # Absolute: a path relative to where the export ran would break as soon as the notebook moves.
    folder = str(Path(working_dir).resolve())
    return (
        f"import os\nfolder = {folder!r}\n"
        "if os.path.isdir(folder):\n"
        "    os.chdir(folder)\n"
        "else:\n"
        "    print(f'The session folder {folder} is not on this machine: the cells read and write files in {os.getcwd()}.')"
    )


def _setup_cells(stored: StoredSession, working_dir: Path, counter: _Counter) -> list[NotebookNode]:
    """The cell that moves to the session's folder, and the one that writes the loaded files where they are missing."""
    import nbformat

    cells = [
        nbformat.v4.new_markdown_cell("The session's working folder, where its cells read and write files (this folder, if that one is not here):"),
        nbformat.v4.new_code_cell(_chdir_source(working_dir), execution_count=counter.next()),
    ]
    carried, left = _carried_files(stored, working_dir)
    if carried:
        note = "The files loaded into the session, carried in the notebook and written here when missing"
        note += f"; too big to carry, copy them here yourself: {', '.join(f'`{n}`' for n in left)}." if left else "."
        source = (
            f"import base64\n_twl_files = {json.dumps(carried, indent=0)}\n"
            "for _twl_name, _twl_data in _twl_files.items():\n"
            "    if not os.path.exists(_twl_name):\n"
            "        with open(_twl_name, 'wb') as _twl_file:\n"
            "            _twl_file.write(base64.b64decode(_twl_data))\n"
            "del _twl_files, _twl_name, _twl_data"
        )
        cells += [nbformat.v4.new_markdown_cell(note), nbformat.v4.new_code_cell(source, execution_count=counter.next())]
    elif left:
        cells.append(nbformat.v4.new_markdown_cell(f"Files the session loaded, too big to carry here: {', '.join(f'`{n}`' for n in left)}."))
    return cells


def _carried_files(stored: StoredSession, working_dir: Path) -> tuple[dict[str, str], list[str]]:
    """The loaded files still in the working folder, base64 (within MAX_CARRIED_BYTES together); the names left out."""
    carried: dict[str, str] = {}
    left: list[str] = []
    total = 0
    for name in dict.fromkeys(load.name for load in stored.loads):
        try:
            data = read_below(working_dir, name, max_bytes=MAX_CARRIED_BYTES - total)
        except OSError:  # gone, a link, or past the bound: named, never followed
            left.append(name)
            continue
        total += len(data)
        carried[name] = base64.b64encode(data).decode("ascii")
    return carried, left


def _plugin_cells(stored: StoredSession, plugins: Sequence[PluginSpec], counter: _Counter) -> list[NotebookNode]:
    """The cell defining the plugins the session's code calls: the kernel's plugin runtime, then each plugin as it loaded."""
    import nbformat

    code = "\n".join(post.execution.code for rnd in stored.rounds for post in rnd.posts if post.execution is not None)
    used = [spec for spec in plugins if re.search(rf"\b{re.escape(spec.name)}\s*\(", code)]
    if not used:
        return []
    specs = json.dumps([{**spec.kernel_spec(), "source_file": spec.source_path.name} for spec in used])
    runtime = inspect.getsource(plugin_runtime)
    name = plugin_runtime.MODULE_NAME
    source = (
        "import os, sys, types\n"
        f"_twl_runtime = sys.modules[{name!r}] = types.ModuleType({name!r})\n"
        f"exec(compile({_literal(runtime)}, 'plugin_runtime.py', 'exec'), _twl_runtime.__dict__)\n"
        "_twl_runtime.register_shims()\n"
        f"_twl_failed = _twl_runtime.install({specs!r}, {stored.id!r}, os.getcwd())\n"
        "if _twl_failed:\n"
        "    print('Plugins that did not load:', *_twl_failed, sep='\\n  ')\n"
        "del _twl_runtime, _twl_failed"
    )
    names = ", ".join(f"`{spec.name}`" for spec in used)
    note = f"The plugins the code calls ({names}), defined as the session's kernel defined them:"
    return [nbformat.v4.new_markdown_cell(note), nbformat.v4.new_code_cell(source, execution_count=counter.next())]


def _literal(text: str) -> str:
    """`text` as a Python literal a reader can read: a raw triple-quoted string when that is exact, else repr."""
    if "'''" in text or text.endswith("\\") or "\r" in text:
        return repr(text)
    return f"r'''{text}'''"


def _load_note(load: FileLoaded) -> str:
    return f"{load.describe().replace(load.name, f'`{load.name}`', 1)}."


class _Counter:
    """Execution counts as a fresh top-to-bottom run would number the cells."""

    def __init__(self) -> None:
        self.value = 0

    def next(self) -> int:
        self.value += 1
        return self.value


def _heading(stored: StoredSession) -> str:
    return (
        f"# {stored.title or stored.id}\n\n{_about(stored)}\n\n"
        f"Exported by taskweaver-lite. Attempts that failed are kept with a note and tagged `{RAISES_TAG}`, "
        "so the notebook runs top to bottom."
    )


def _about(stored: StoredSession) -> str:
    started = time.strftime("%Y-%m-%d %H:%M", time.localtime(stored.started))
    usage = stored.usage
    return (
        f"Session `{stored.id}`, started {started}; {len(stored.rounds)} request(s), {usage.calls} model call(s), "
        f"{usage.prompt_tokens:,} tokens in, {usage.completion_tokens:,} out."
    )


def _round_status(rnd: Round) -> str:
    if rnd.state == "failed":
        return f"**This request failed:** {rnd.error or 'no reason recorded'}"
    if rnd.state == "running":
        return "**This request was cut off:** the program stopped before it finished."
    return ""


def _round_cells(rnd: Round, counter: _Counter, source: ArtifactSource) -> list[NotebookNode]:
    import nbformat

    status = _round_status(rnd)
    request = f"## Request {rnd.index}\n\n{_quoted(rnd.user_query)}" + (f"\n\n{status}" if status else "")
    cells = [nbformat.v4.new_markdown_cell(request)]
    for post in rnd.posts:
        if post.execution is not None:
            cells.extend(_execution_cells(post, post.execution, counter, source))
        elif _between_roles(post):
            cells.append(nbformat.v4.new_markdown_cell(_post_line(post)))
    if rnd.answer is not None:
        cells.append(nbformat.v4.new_markdown_cell(f"**Answer:** {rnd.answer}"))
    return cells


def _execution_cells(post: Post, result: ExecutionResult, counter: _Counter, source: ArtifactSource) -> list[NotebookNode]:
    import nbformat

    if result.refused:
        return [nbformat.v4.new_markdown_cell(f"{_not_run_note(result)}\n\n{_fenced(result.code, 'python')}")]
    if result.timed_out or result.kernel_died or result.interrupted:
        why = "crashed the kernel" if result.kernel_died else "ran too long" if result.timed_out else "was interrupted"
        note = f"*This code {why}; it is shown as text so that re-running the notebook does not repeat that.*"
        return [nbformat.v4.new_markdown_cell(f"{note}\n\n{_fenced(result.code, 'python')}")]
    cells: list[NotebookNode] = []
    if not result.success:
        revised = post.send_to == post.send_from  # a retry inside the round follows
        note = "This attempt failed and was revised below." if revised else "This code failed."
        cells.append(nbformat.v4.new_markdown_cell(f"*{note} The cell is tagged `{RAISES_TAG}` so a re-run carries on.*"))
    count = counter.next()
    cell = nbformat.v4.new_code_cell(result.code, execution_count=count, outputs=_outputs(result, count, source))
    if result.error is not None:
        cell.metadata["tags"] = [RAISES_TAG]
    cells.append(cell)
    return cells


def _outputs(result: ExecutionResult, count: int, source: ArtifactSource) -> list[NotebookNode]:
    import nbformat

    outputs: list[NotebookNode] = []
    for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
        if text:
            outputs.append(nbformat.v4.new_output("stream", name=name, text=text))
    for shown in result.displays:
        outputs.append(nbformat.v4.new_output("display_data", data={"text/plain": shown}))
    for artifact in result.artifacts:
        outputs.append(nbformat.v4.new_output("display_data", data=_image_data(Path(artifact), source)))
    if result.result is not None:
        data = {"text/plain": result.result}
        if result.result_html:
            data["text/html"] = result.result_html
        outputs.append(nbformat.v4.new_output("execute_result", data=data, execution_count=count))
    if result.error is not None:
        traceback = result.error.traceback.splitlines() or [f"{result.error.name}: {result.error.value}"]
        outputs.append(nbformat.v4.new_output("error", ename=result.error.name, evalue=result.error.value, traceback=traceback))
    return outputs


Kept = Callable[[str], bytes | None]  # an artifact's bytes by name, from the store; None when it kept none


@dataclass(frozen=True)
class ArtifactSource:
    """Where an export reads a session's artifacts: its folder on this machine (link-safe), else the store's copy."""

    session_dir: Path | None = None
    kept: Kept | None = None

    def read(self, path: Path) -> bytes:
        """The artifact's bytes; FileNotFoundError when neither the folder nor the store has it."""
        try:
            if self.session_dir is not None:  # a path outside the session's folder (a plugin's report) is refused by read_path
                return read_path(path, below=self.session_dir, max_bytes=MAX_EMBEDDED_BYTES)
            return read_below(path.parent, path.name, max_bytes=MAX_EMBEDDED_BYTES)
        except FileNotFoundError:
            data = self.kept(path.name) if self.kept is not None else None
            if data is None:
                raise
            return data


def _kept_artifacts(store: Store, session_id: str) -> Kept | None:
    """The store's copies of the session's artifacts, when it keeps them (PostgreSQL: any server exports any session)."""
    if not store.keeps_files:
        return None
    return lambda name: store.file(session_id, "artifact", name)


def _image_data(path: Path, source: ArtifactSource) -> dict[str, Any]:
    """An artifact as notebook display data: the image embedded, read link-safe (a kernel may have swapped it for a link)."""
    mime = IMAGE_TYPES.get(path.suffix.lower())
    if mime is None:
        return {"text/plain": f"[saved file: {path}]"}
    try:
        data = source.read(path)
    except FileNotFoundError:
        return {"text/plain": f"[{path.name}: no longer on disk at {path}]"}
    except OSError as exc:  # a link, a folder, too big: named, never followed
        return {"text/plain": f"[{path.name}: not embedded ({exc.strerror or exc})]"}
    if mime == "image/svg+xml":
        return {mime: data.decode("utf-8", "replace"), "text/plain": f"[image: {path}]"}
    return {mime: base64.b64encode(data).decode("ascii"), "text/plain": f"[image: {path}]"}


class ImageCopies:
    """The Markdown export's images, copied into `<name>_files/` beside it and linked relatively: the pair moves as one."""

    def __init__(self, document: Path, *, kept: Kept | None = None) -> None:
        self.folder = document.parent / f"{document.stem}_files"
        self._kept = kept
        self._copied: dict[str, str] = {}  # artifact path -> its link

    def link(self, artifact: str) -> str | None:
        """The relative link to `artifact`'s copy (made on first use); None when the file is gone."""
        if artifact in self._copied:
            return self._copied[artifact]
        source = Path(artifact)
        stored = self._kept(source.name) if self._kept is not None and not source.is_file() else None
        if not source.is_file() and stored is None:
            return None
        self.folder.mkdir(parents=True, exist_ok=True)
        name, number = source.name, 1
        taken = set(self._copied.values())
        while f"{self.folder.name}/{quote(name)}" in taken:
            number += 1
            name = f"{source.stem}-{number}{source.suffix}"
        if stored is not None:
            (self.folder / name).write_bytes(stored)
        else:
            shutil.copyfile(source, self.folder / name)
        self._copied[artifact] = f"{self.folder.name}/{quote(name)}"
        return self._copied[artifact]


def _round_markdown(rnd: Round, images: ImageCopies) -> list[str]:
    lines = [f"## {rnd.index}. {_first_line(rnd.user_query)}", "", _quoted(rnd.user_query), ""]
    status = _round_status(rnd)
    if status:
        lines += [f"> {status}", ""]
    shown_plan: str | None = None
    for post in rnd.posts:
        if post.plan is not None and post.plan.plan and post.plan.plan != shown_plan:
            shown_plan = post.plan.plan
            lines += ["**Plan**", "", shown_plan.strip(), ""]
        if post.execution is not None:
            lines += _execution_markdown(post, post.execution, images)
        elif _between_roles(post):
            lines += [_post_line(post), ""]
    if rnd.answer is not None:
        lines += [f"**Answer:** {rnd.answer}", ""]
    return lines


def _not_run_note(result: ExecutionResult) -> str:
    why = f" {result.error.value}" if result.error is not None else ""
    return f"*This code was not run: {result.refused}.*{why}"


def _execution_markdown(post: Post, result: ExecutionResult, images: ImageCopies) -> list[str]:
    if result.refused:
        return [_not_run_note(result), "", _fenced(result.code, "python"), ""]
    lines = [_fenced(result.code, "python"), ""]
    for label, text in (("Output", result.stdout), ("Stderr", result.stderr), *(("Display", d) for d in result.displays), ("Result", result.result)):
        if text:
            lines += [f"{label}:", "", _fenced(text.rstrip(), "text"), ""]
    if result.error is not None:
        lines += [f"Error: `{result.error.name}: {_first_line(result.error.value)}`", "", _fenced(result.error.traceback.rstrip(), "text"), ""]
    for artifact in result.artifacts:
        link = images.link(artifact) if Path(artifact).suffix.lower() in IMAGE_TYPES else None
        lines += [f"![{Path(artifact).name}]({link})" if link else f"Saved: `{artifact}`", ""]
    if result.cancelled:
        lines += ["*The user cancelled this code while it ran (Ctrl-C); above is what it printed until then.*", ""]
    elif result.kernel_died:
        lines += ["*The kernel died while running this code and was restarted.*", ""]
    elif result.timed_out:
        lines += ["*This code ran too long and was stopped.*", ""]
    elif not result.success:
        revised = post.send_to == post.send_from
        lines += ["*This attempt failed and was revised.*" if revised else "*This code failed.*", ""]
    return lines


def _between_roles(post: Post) -> bool:
    """A post from one role to another (a delegated step, a role's answer): not the user's request or answer."""
    return USER not in (post.send_from, post.send_to) and post.send_from != post.send_to


def _post_line(post: Post) -> str:
    """A delegated step as '**Planner → Echo:** ...', a role's answer as '**Echo:** ...', with its attachments."""
    head = f"**{post.send_from} → {post.send_to}:**" if post.plan is not None else f"**{post.send_from}:**"
    attachments = "".join(f"\n\n*{a.kind}:*\n\n{_fenced(a.content, 'text')}" for a in post.attachments)
    return f"{head} {post.message}{attachments}"


def _quoted(text: str) -> str:
    return "\n".join(f"> {line}" if line else ">" for line in text.strip().splitlines()) or ">"


def _first_line(text: str, limit: int = 80) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= limit else line[: limit - 1] + "…"


def _fenced(text: str, language: str) -> str:
    # A fence longer than any backtick run inside, so code that holds ``` cannot end the block early.
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{language}\n{text}\n{fence}"
