"""The test tiers: every test file has one, and a test without a tier fails saying where to put it."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TIERS

pytestmark = pytest.mark.unit

TESTS = Path(__file__).resolve().parent


# `pytestmark = pytest.mark.unit`, or a list holding a tier: `pytestmark = [pytest.mark.kernel, pytest.mark.skipif(...)]`.
MARKED = re.compile(rf"^pytestmark = \[?\s*pytest\.mark\.({'|'.join(TIERS)})\b", re.MULTILINE)


def test_every_test_file_has_a_tier() -> None:
    untiered = [path.name for path in sorted(TESTS.glob("test_*.py")) if not MARKED.search(path.read_text(encoding="utf-8"))]
    assert untiered == [], "put `pytestmark = pytest.mark.unit` (or kernel, cli, soak) at the top of these files"


def test_a_test_without_a_tier_fails_and_its_own_tier_wins_over_its_files(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_new.py").write_text("def test_something():\n    assert True\n", encoding="utf-8")
    (tmp_path / "test_marked.py").write_text("import pytest\n\npytestmark = pytest.mark.kernel\n\ndef test_other():\n    assert True\n", encoding="utf-8")
    # A test's own tier wins over its file's: this one is cli only, not also unit.
    own = "import pytest\n\npytestmark = pytest.mark.unit\n\n@pytest.mark.cli\ndef test_command():\n    assert True\n"
    (tmp_path / "test_own.py").write_text(own, encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(TESTS.parent / "pyproject.toml"), "--rootdir", str(tmp_path)]
    # The quick tier is where a missing tier shows first: the untiered test runs there, and fails.
    quick = subprocess.run([*command, "-m", "unit", str(tmp_path)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert quick.returncode == 1 and "2 deselected, 1 error" in quick.stdout, quick.stdout
    assert "test_new.py::test_something has no test tier: put `pytestmark = pytest.mark.unit`" in quick.stdout
