"""The test tiers: every test file has one, and a test without a tier fails saying where to put it."""

from __future__ import annotations

import os
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


@pytest.mark.cli  # runs pytest as a command: not the quick tier
def test_the_whole_quick_tier_runs_on_a_worker_per_core_and_a_named_file_or_n_0_in_one_process(tmp_path: Path) -> None:
    (tmp_path / "tests").mkdir()
    shutil.copy(TESTS / "conftest.py", tmp_path / "tests" / "conftest.py")
    # Each test notes the worker that ran it (none outside pytest-xdist) in the folder the run names.
    probe = "import os\nfrom pathlib import Path\n\nimport pytest\n\npytestmark = pytest.mark.unit\n\ndef test_{0}():\n"
    probe += "    (Path(os.environ['WORKERS_SEEN']) / '{0}').write_text(os.environ.get('PYTEST_XDIST_WORKER', 'none'))\n"
    for name in ("first", "second"):
        (tmp_path / "tests" / f"test_{name}.py").write_text(probe.format(name), encoding="utf-8")
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(TESTS.parent / "pyproject.toml"), "--rootdir", str(tmp_path)]

    def workers(*extra: str) -> set[str]:
        seen = tmp_path / f"seen-{len(list(tmp_path.glob('seen-*')))}"
        seen.mkdir()
        # Not this run's own worker's variables: the suite itself may run this file on a worker.
        env = {**{k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}, "WORKERS_SEEN": str(seen)}
        done = subprocess.run([*command, *extra], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
        assert done.returncode == 0, done.stdout + done.stderr
        return {path.read_text() for path in seen.iterdir()}

    whole = workers("-m", "unit")
    assert len(whole) == 2 and "none" not in whole, ("a worker per core and one more: each file on its own", whole)
    assert workers("-m", "unit", "tests/test_first.py") == {"none"}, "a file named: one process"
    assert workers("-m", "unit", "-n", "0") == {"none"}, "-n 0: one process"
