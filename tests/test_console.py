"""What the terminal shows: a failed cell's short traceback, notices at quiet moments, text that is not markup."""

from __future__ import annotations

import io
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from rich.console import Console

from taskweaver_lite.cli.chat import EXPORT_USAGE, HELP
from taskweaver_lite.cli.console import PlainConsole, RichConsole
from taskweaver_lite.cli.tracebacks import screen_text, shorten_traceback
from taskweaver_lite.records.conversation import Post, Round
from taskweaver_lite.records.events import Folded, PostAdded
from taskweaver_lite.records.execution import CellError, ExecutionResult

pytestmark = pytest.mark.unit

# An IPython traceback as the kernel reports it (colours stripped): a KeyError raised inside pandas
# from a function the user defined, chained from pandas' own KeyError.
PANDAS_TRACEBACK = """---------------------------------------------------------------------------
KeyError                                  Traceback (most recent call last)
File /venv/lib/python3.11/site-packages/pandas/core/indexes/base.py:3816, in Index.get_loc(self, key)
   3815 try:
-> 3816     return self._engine.get_loc(casted_key)
   3817 except KeyError as err:

File pandas/_libs/index.pyx:172, in pandas._libs.index.IndexEngine.get_loc()
--> 172 'Could not get source, probably due dynamically evaluated source code.'

KeyError: 'Revenue'

The above exception was the direct cause of the following exception:

KeyError                                  Traceback (most recent call last)
Cell In[1], line 5
      3 def f(d):
      4     return d['Revenue']
----> 5 f(df)

Cell In[1], line 4, in f(d)
      3 def f(d):
----> 4     return d['Revenue']

File /venv/lib/python3.11/site-packages/pandas/core/frame.py:4330, in DataFrame.__getitem__(self, key)
   4329                 return self._getitem_multilevel(key)
-> 4330             indexer = self.columns.get_loc(key)

File /venv/lib/python3.11/site-packages/pandas/core/indexes/base.py:3823, in Index.get_loc(self, key)
-> 3823     raise KeyError(key) from err

KeyError: 'Revenue'
"""
FAILED = ExecutionResult(code="f(df)", success=False, stdout="hi\n", error=CellError(name="KeyError", value="'Revenue'", traceback=PANDAS_TRACEBACK))


def recording_console(width: int = 120) -> Console:
    return Console(record=True, file=io.StringIO(), width=width, highlight=False)


def test_a_failed_cell_shows_the_error_and_the_users_frames_and_counts_the_rest() -> None:
    short = shorten_traceback(PANDAS_TRACEBACK)
    assert short.frames == ("Cell In[1], line 5\n----> 5 f(df)", "Cell In[1], line 4, in f(d)\n----> 4     return d['Revenue']")
    assert (short.hidden_frames, short.hidden_chains) == (2, 1)
    text = screen_text(FAILED)
    assert text == (
        "The execution failed.\nError: KeyError: 'Revenue'\n"
        "Cell In[1], line 5\n----> 5 f(df)\nCell In[1], line 4, in f(d)\n----> 4     return d['Revenue']\n"
        "(2 library frames and 1 earlier exception hidden; /last shows the whole traceback)\nOutput:\nhi"
    )
    assert "pandas/core" in FAILED.prompt_text(), "the models still get the whole traceback"


def test_the_rich_and_the_plain_screen_both_show_the_short_traceback() -> None:
    rnd = Round(index=1, user_query="revenue?")
    event = PostAdded(rnd, Post("CodeInterpreter", "CodeInterpreter", "failed", code="f(df)", execution=FAILED))
    rich = RichConsole(recording_console())
    rich(event)
    err = io.StringIO()
    PlainConsole(out=io.StringIO(), err=err)(event)
    for shown in (rich.console.export_text(), err.getvalue()):
        assert "----> 4     return d['Revenue']" in shown and "/last shows" in shown
        assert "pandas/core/frame.py" not in shown


def test_fold_notices_wait_for_a_quiet_moment_instead_of_landing_under_the_answer() -> None:
    renderer = RichConsole(recording_console())
    rnd = Round(index=3, user_query="q")
    renderer(Folded("planner", 1, 2, 5_000, 300, ok=True, label="Planner"))
    renderer(PostAdded(rnd, Post("Planner", "User", "The answer.")))
    shown = renderer.console.export_text(clear=True)
    assert "The answer." in shown and "folded" not in shown
    renderer.flush_notices()
    assert renderer.console.export_text(clear=True).strip() == "Planner: folded rounds 1-2, 5,000 -> 300 tokens"
    renderer.flush_notices()
    assert renderer.console.export_text() == "", "each notice is shown once"


def test_help_and_usage_lines_keep_their_square_brackets() -> None:
    renderer = RichConsole(recording_console())
    renderer.say(HELP)
    renderer.say(EXPORT_USAGE)
    shown = renderer.console.export_text()
    assert "/export [ipynb|md] [file] [--force]" in shown
    assert shown.count("[ipynb|md]") == 2


def test_a_file_path_in_an_answer_links_to_the_file_when_it_is_the_sessions() -> None:
    session = Path(tempfile.mkdtemp())
    try:
        (session / "cwd").mkdir()
        report = session / "cwd" / "growth_by_region.csv"
        report.write_text("region,growth\n")
        outside = session / "elsewhere.csv"
        outside.write_text("x\n")
        console = Console(record=True, file=io.StringIO(), width=200, highlight=False, force_terminal=True, color_system="truecolor")
        renderer = RichConsole(console)
        renderer.folders = (session / "cwd", session / "artifacts")
        answer = f"Saved to {report}. Also {outside}, {session}/cwd/../elsewhere.csv and {session}/cwd/missing.csv."
        renderer(PostAdded(Round(index=1, user_query="q"), Post("Planner", "User", answer)))
        shown = console.file.getvalue()  # type: ignore[attr-defined]
        links = re.findall(r"\x1b]8;[^;]*;([^\x1b]*)\x1b\\", shown)
        targets = {link for link in links if link}
        assert targets == {f"file://{report}"}, f"only the session's existing file is a link: {targets}"
        assert str(report) in console.export_text(), "the path is still shown as written"
    finally:
        shutil.rmtree(session)
