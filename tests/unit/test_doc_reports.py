"""Every benchmark report README.md or docs/ quotes exists (`name_{a,b}.md` stands for both files)."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
REPORT = re.compile(r"benchmarks/reports/[\w.{},-]*\w")


def _expand(path: str) -> list[str]:
    """`a_{x,y}.md` -> `a_x.md`, `a_y.md` (shell brace expansion, as the docs write pairs of reports)."""
    parts = re.split(r"\{([^}]*)\}", path)
    choices = [[p] if i % 2 == 0 else p.split(",") for i, p in enumerate(parts)]
    return ["".join(c) for c in itertools.product(*choices)]


def _quoted() -> list[tuple[str, str]]:
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [(doc.name, path) for doc in docs for quoted in REPORT.findall(doc.read_text()) for path in _expand(quoted)]


@pytest.mark.parametrize(("doc", "path"), _quoted())
def test_a_quoted_report_exists(doc: str, path: str):
    assert (ROOT / path).is_file(), f"{doc} quotes {path}, which does not exist"


def test_brace_pairs_expand():
    assert _expand("benchmarks/reports/p_{graphs,eager}_h100.md") == ["benchmarks/reports/p_graphs_h100.md",
                                                                      "benchmarks/reports/p_eager_h100.md"]
