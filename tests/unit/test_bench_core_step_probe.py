"""benchmarks/core_step_probe.py and after_import.py: the per-step probe an engine core loads from a sitecustomize."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import core_step_probe as probe  # noqa: E402
from after_import import after_import  # noqa: E402


def test_after_import_runs_once_the_module_is_imported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "probe_target_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))  # the hook leaves with the test
    seen: list[types.ModuleType] = []
    after_import("probe_target_mod", seen.append)
    assert not seen  # nothing imported yet: nothing run
    import probe_target_mod  # noqa: F401  (the import is what runs it)

    assert seen == [sys.modules["probe_target_mod"]] and seen[0].VALUE == 1
    after_import("probe_target_mod", seen.append)  # already imported: at once
    assert len(seen) == 2
    monkeypatch.delitem(sys.modules, "probe_target_mod")


def test_steps_split_host_time_around_the_wait(tmp_path: Path):
    steps = probe._Steps(tmp_path / "core.jsonl")
    steps.shape, steps.forward_s = (4, 100), 0.002
    steps.wait_started, steps.wait_ended = 10.003, 10.005  # 3 ms of host work, a 2 ms wait, then 1 ms more
    steps.record(10.0, 10.006, tokens=4)
    steps.record(10.010, 10.011, tokens=4)  # no wait inside this step
    steps.flush()
    rows = [dict(zip(probe.FIELDS, json.loads(line))) for line in (tmp_path / "core.jsonl").read_text().splitlines()]
    first, second = rows
    assert first["host_before_wait_ms"] == pytest.approx(3.0) and first["wait_ms"] == pytest.approx(2.0)
    assert first["host_after_wait_ms"] == pytest.approx(1.0) and first["launch_ms"] == pytest.approx(2.0)
    assert (first["seqs"], first["step_tokens"], first["gpu_step_ms"]) == (4, 100, -1.0)  # no CUDA: no GPU columns
    assert first["bucket"] == 0  # no prefill graph replayed
    assert second["wait_ms"] == 0.0 and second["host_before_wait_ms"] == pytest.approx(1.0)
    assert second["seqs"] == 0  # the shape is per step


def test_summary_separates_decode_steps_from_steps_with_prompts(tmp_path: Path):
    def row(t: float, gpu: float, seqs: int, tokens: int, bucket: int) -> list[float]:
        return [t, 1.0, 2.0, 0.5, seqs, 0.0, gpu, 0.0, seqs, tokens, 0.3, bucket]

    rows = [row(0.001 * i, 2.5, 8, 8, 0) for i in range(9)] + [row(0.01, 20.0, 8, 1000, 1024)]
    rows.insert(5, row(0.0045, -1.0, 0, 0, 0))  # a step that ran nothing: no GPU time, in no column's mean
    (tmp_path / "core_1.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = probe.summarize(tmp_path)
    assert "core_1.jsonl (11 steps)" in table
    last = table.strip().splitlines()[-1]
    assert "| 4.25 | 0.00 |" in last  # the GPU step and gap means of the ten steps that ran: (9 x 2.5 + 20) / 10
    assert "| 2.50 | 1: 20.00, 0.30, 992, 0 eager, graph buckets 1024 |" in last  # decode-only GPU ms, the prompt step


class _Event:
    """A finished CUDA event stand-in: elapsed_time to another is the difference of their times (ms)."""

    def __init__(self, ms: float) -> None:
        self.ms = ms

    def query(self) -> bool:
        return True

    def elapsed_time(self, other: _Event) -> float:
        return other.ms - self.ms


def test_flush_writes_the_last_steps_whose_gpu_events_have_completed(tmp_path: Path):
    """A process that ends soon after its last step (a tensor-parallel engine's, through os._exit) loses no row:
    flush reads the events the next step would have."""
    steps = probe._Steps(tmp_path / "core.jsonl")
    steps.events = (_Event(0.0), _Event(4.0))
    steps.record(10.0, 10.001, tokens=1)
    steps.events = (_Event(4.5), _Event(8.5))
    steps.record(10.002, 10.003, tokens=1)
    steps.flush()
    rows = [dict(zip(probe.FIELDS, json.loads(line))) for line in (tmp_path / "core.jsonl").read_text().splitlines()]
    assert [(r["gpu_step_ms"], r["gpu_gap_ms"]) for r in rows] == [(4.0, -1.0), (4.0, 0.5)]
