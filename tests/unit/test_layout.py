"""tests/unit mirrors the source tree: every folder of unit tests names a package under src/ (infer's packages by
their own names, layerzero and omniscience by theirs), so a newcomer finds a package's tests where it lives."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNIT, SRC = ROOT / "tests" / "unit", ROOT / "src"


def _package(folder: Path) -> Path | None:
    """The source package a unit-test folder mirrors: src/infer/<path>, else src/<path>."""
    relative = folder.relative_to(UNIT)
    for base in (SRC / "infer", SRC):
        if (base / relative / "__init__.py").is_file():
            return base / relative
    return None


def test_every_unit_test_folder_mirrors_a_source_package():
    folders = [d for d in UNIT.rglob("*") if d.is_dir() and d.name != "__pycache__" and any(d.glob("test_*.py"))]
    assert folders
    stray = [str(d.relative_to(ROOT)) for d in folders if _package(d) is None]
    assert not stray, f"unit-test folders that mirror no package under src/: {stray}"
