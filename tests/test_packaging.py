"""The package's declaration: every folder that ships files is a declared package, so an install is quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="reading pyproject.toml needs tomllib (Python 3.11)")

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parent.parent
SETUPTOOLS = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
# Made by running things in a checkout, never shipped.
SCRATCH = {"__pycache__", "sessions"}


def folder_of(package: str) -> Path:
    """Where a dotted package lives in the checkout, through pyproject's package-dir mapping."""
    mapped = max((name for name in SETUPTOOLS["package-dir"] if package == name or package.startswith(name + ".")), key=len)
    return REPO / SETUPTOOLS["package-dir"][mapped] / Path(*package[len(mapped) :].split(".")[1:])


def folders_with_files() -> dict[str, Path]:
    """Every folder under a mapped package that holds files (Python could import each), by dotted name."""
    found = {}
    for package in SETUPTOOLS["package-dir"]:
        root = folder_of(package)
        for path in [root, *root.rglob("*")]:
            parts = path.relative_to(root).parts
            if path.is_dir() and not SCRATCH & set(parts) and any(p.is_file() for p in path.iterdir()):
                found[".".join([package, *parts])] = path
    return found


def test_every_folder_with_files_is_a_declared_package() -> None:
    # setuptools prints a page of warnings for each importable folder missing from `packages` (~215 lines for seven).
    assert sorted(set(folders_with_files()) - set(SETUPTOOLS["packages"])) == []


def test_every_folder_with_data_files_ships_them() -> None:
    for package, folder in folders_with_files().items():
        data = [p for p in folder.iterdir() if p.is_file() and p.suffix != ".py"]
        if data:
            assert package in SETUPTOOLS["package-data"], f"{folder} holds {data[0].name}, but package-data lists nothing for {package}"


def test_the_version_is_written_once_in_pyproject_and_read_from_the_installed_metadata() -> None:
    import taskweaver_lite

    assert taskweaver_lite.__version__ == tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert '__version__ = "' not in (REPO / "taskweaver_lite" / "__init__.py").read_text(encoding="utf-8"), "the version is pyproject.toml's only"


def test_the_package_says_it_is_typed() -> None:
    # PEP 561: without the marker a role or plugin author's type checker ignores every annotation of ours.
    assert (REPO / "taskweaver_lite" / "py.typed").is_file()
    assert "py.typed" in SETUPTOOLS["package-data"]["taskweaver_lite"]
