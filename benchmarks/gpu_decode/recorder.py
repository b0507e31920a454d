"""The report being built: the time budget, one item at a time with its failure recorded, saved after each."""

from __future__ import annotations

import gc
import json
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gpu_decode.plan import Plan
from gpu_decode.report import markdown
from gpu_decode.summary import summarize


@dataclass
class Recorder:
    """The report being built, its output paths and the time budget; saved after every item."""

    plan: Plan
    out: Path
    slug: str
    started: float = field(default_factory=time.perf_counter)
    report: dict[str, Any] = field(default_factory=dict)

    def elapsed(self) -> float:
        """Seconds since the run started."""
        return time.perf_counter() - self.started

    def left(self) -> float:
        """Seconds of the budget left."""
        return self.plan.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        """A timestamped progress line on stderr."""
        print(f"[{time.strftime('%H:%M:%S')} +{self.elapsed():6.1f}s] {message}", file=sys.stderr, flush=True)

    def attempt(self, dest: dict, key: str, fn: Callable[[], Any], need_s: float = 0.0) -> Any:
        """dest[key] = fn(), or {"error": ...} / {"skipped": ...}; the report is saved either way."""
        if self.left() < need_s:
            dest[key] = {"skipped": f"time budget: {self.left():.0f} s left, needs ~{need_s:.0f} s"}
            self.log(f"skip {key}: {dest[key]['skipped']}")
        else:
            self.log(f"start {key}")
            try:
                dest[key] = fn()
            except Exception as exc:  # one failing item must not lose the others (nor what it measured so far)
                traceback.print_exc()
                partial = dest.get(key) if isinstance(dest.get(key), dict) else {}
                dest[key] = partial | {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            free_memory()
        self.save()
        return dest[key]

    def save(self) -> None:
        """Refresh the summary and rewrite the JSON and markdown reports."""
        self.report["meta"]["wall_s"] = self.elapsed()
        self.report["summary"] = summarize(self.report)
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.out / f"gpu_decode_{self.slug}"
        stem.with_suffix(".json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        stem.with_suffix(".md").write_text(markdown(self.report))


def free_memory() -> None:
    """Drop unreachable models and return cached blocks to the driver before the next model."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
