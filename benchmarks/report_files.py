"""A benchmark's report as two files beside each other: STEM.json (every number) and STEM.md (the tables)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_report(stem: Path, data: dict[str, Any], markdown: str) -> None:
    """Write STEM.json and STEM.md, making STEM's folder."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    stem.with_suffix(".md").write_text(markdown if markdown.endswith("\n") else markdown + "\n")
