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


@pytest.mark.cli  # runs pytest as a command: not the quick tier
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
    # The kernel file is not even imported; the cli test of the unit file is collected and deselected.
    assert quick.returncode == 1 and "1 deselected, 1 error" in quick.stdout, quick.stdout
    assert "test_new.py::test_something has no test tier: put `pytestmark = pytest.mark.unit`" in quick.stdout


@pytest.mark.cli  # runs pytest as a command: not the quick tier
def test_a_file_none_of_whose_tiers_m_selects_is_not_imported_and_one_whose_fixture_adds_a_tier_is(tmp_path: Path) -> None:
    shutil.copy(TESTS / "conftest.py", tmp_path / "conftest.py")
    # Importing this file fails: a run that imports it says so.
    (tmp_path / "test_heavy.py").write_text(
        "import pytest\nimport not_installed_anywhere\n\npytestmark = pytest.mark.kernel\n\ndef test_k():\n    pass\n", encoding="utf-8"
    )
    # A unit file asking for the store fixture also holds a postgres test (its PostgreSQL parameter).
    (tmp_path / "test_stored.py").write_text("import pytest\n\npytestmark = pytest.mark.unit\n\ndef test_s(store):\n    pass\n", encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--collect-only", "-c", str(TESTS.parent / "pyproject.toml")]
    command += ["--rootdir", str(tmp_path), str(tmp_path)]

    def collected(expression: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*command, "-m", expression], capture_output=True, text=True, timeout=120, cwd=tmp_path)

    unit = collected("unit")
    assert unit.returncode == 0 and "not_installed_anywhere" not in unit.stdout, unit.stdout
    assert "test_stored.py::test_s[sqlite]" in unit.stdout and "1/2 tests collected (1 deselected)" in unit.stdout, unit.stdout
    postgres = collected("postgres")
    assert "test_stored.py::test_s[postgresql]" in postgres.stdout, "the store fixture's postgres parameter is a postgres test of a unit file"
    kernel = collected("kernel")
    assert kernel.returncode != 0 and "No module named 'not_installed_anywhere'" in kernel.stdout, "a selected file is imported as always"
