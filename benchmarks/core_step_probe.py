"""Where a served engine core's time goes, step by step: a probe loaded into every process of a run.

With CORE_PROBE_DIR set, `install_on_import()` (run from a sitecustomize, so the `infer serve` cores get it too)
wraps `EngineCore.step_core`, the torch runner's forward and sample (CUDA events around the step's GPU work),
`LaunchedStep.result` (the wait for the GPU's tokens) and `PrefillGraphs.shape` (the prefill graph a step replays) once
`infer.engine.core` is imported, and times the garbage collector. Every step becomes one JSON line of CORE_PROBE_DIR/core_<pid>.jsonl (FIELDS), written every WINDOW_S and when the
process ends (at exit, or through os._exit, which a tensor-parallel engine's process takes).
Used to find why a served data-parallel core makes fewer steps a second after its first run
(benchmarks/reports/dp_serve_h200.md).

    python benchmarks/core_step_probe.py summarize DIR   # one table per core
"""

from __future__ import annotations

import atexit
import gc
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from after_import import after_import

WINDOW_S = 2.0
TARGET = "infer.engine.core"


class _Steps:
    """Per step (FIELDS): host time before the wait, the wait, host time after it, tokens out, the step's sequences,
    tokens, host time in the runner and prefill graph, and on the GPU the step's span (an event at the forward's start
    to one after the sampling) and its gap from the step before's end (the GPU idle, waiting for the host). Appended
    every WINDOW_S as one JSON line per step."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: list[list[float]] = []
        self.flushed = time.perf_counter()
        self.gc_s = 0.0
        self._gc_started = 0.0
        self.wait_started = self.wait_ended = 0.0
        self.events: tuple[Any, Any] | None = None  # this step's (start, end) CUDA events
        self.shape = (0, 0)  # this step's (sequences, tokens): more tokens than sequences is a step with a prefill
        self.forward_s = 0.0  # host time inside the runner's forward and sample (uploads, graph replays, launches)
        self.bucket = 0  # the tokens of the prefill graph this step replayed; 0: none (a decode step, or eager)
        self.prev_end: Any = None
        self.pending: list[tuple[list[float], Any, Any, Any]] = []  # rows whose events are not read yet

    def on_gc(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_started = time.perf_counter()
        else:
            self.gc_s += time.perf_counter() - self._gc_started

    def record(self, t0: float, t1: float, tokens: int) -> None:
        waited = self.wait_ended > self.wait_started >= t0
        host_a = (self.wait_started if waited else t1) - t0
        wait = self.wait_ended - self.wait_started if waited else 0.0
        row = [round(t0, 6), round(host_a * 1e3, 3), round(wait * 1e3, 3), round((t1 - t0) * 1e3 - host_a * 1e3 -
               wait * 1e3, 3), tokens, round(self.gc_s * 1e3, 3), -1.0, -1.0, *self.shape,
               round(self.forward_s * 1e3, 3), self.bucket]
        self.gc_s, self.shape, self.forward_s, self.bucket = 0.0, (0, 0), 0.0, 0
        start, end = self.events or (None, None)
        self.events = None
        if end is not None:
            self.pending.append((row, self.prev_end, start, end))
            self.prev_end = end
        else:  # not on CUDA (or no sampling this step): no GPU columns (-1)
            self.rows.append(row)
        self._collect()
        if t1 - self.flushed >= WINDOW_S:
            self.flush()
            self.flushed = t1

    def _collect(self) -> None:
        """Rows whose GPU events have completed get their GPU columns and join the rows to write."""
        ready = [p[3].query() for p in self.pending]
        done = [p for p, r in zip(self.pending, ready) if r]
        self.pending = [p for p, r in zip(self.pending, ready) if not r]
        for r, prev, start, end in done:
            r[6] = round(start.elapsed_time(end), 3)
            r[7] = round(prev.elapsed_time(start), 3) if prev is not None else -1.0
            self.rows.append(r)

    def flush(self) -> None:
        self._collect()
        if self.rows:
            with self.path.open("a") as f:
                f.writelines(json.dumps(r) + "\n" for r in self.rows)
            self.rows = []


FIELDS = ("t", "host_before_wait_ms", "wait_ms", "host_after_wait_ms", "tokens", "gc_ms", "gpu_step_ms",
          "gpu_gap_ms", "seqs", "step_tokens", "launch_ms", "bucket")


def _patch(core_module: Any) -> None:
    import torch

    from infer.runners import prefill_graphs, torch_runner

    steps = _Steps(Path(os.environ["CORE_PROBE_DIR"]) / f"core_{os.getpid()}.jsonl")
    gc.callbacks.append(steps.on_gc)
    atexit.register(steps.flush)
    hard_exit = os._exit  # a process that ends without atexit (a tensor-parallel engine's) writes its rows too

    def flushed_exit(code: int) -> None:
        steps.flush()
        hard_exit(code)

    os._exit = flushed_exit  # type: ignore[assignment]
    step_core = core_module.EngineCore.step_core
    result = torch_runner.LaunchedStep.result
    forward, sample = torch_runner.TorchRunner.forward, torch_runner.TorchRunner.sample
    pick = prefill_graphs.PrefillGraphs.shape

    def picked(self: Any, tokens: int, seqs: int) -> Any:
        shape = pick(self, tokens, seqs)
        steps.bucket = 0 if shape is None else shape.tokens
        return shape

    def timed_step(self: Any) -> Any:
        t0 = time.perf_counter()
        out = step_core(self)
        steps.record(t0, time.perf_counter(), len(out.request_ids))
        return out

    def timed_result(self: Any) -> Any:
        steps.wait_started = time.perf_counter()
        try:
            return result(self)
        finally:
            steps.wait_ended = time.perf_counter()

    def marked_forward(self: Any, step: Any) -> Any:
        t0 = time.perf_counter()
        steps.shape = (step.num_seqs, step.num_scheduled_tokens)
        if self.device.type == "cuda":
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            steps.events = (start, None)
        try:
            return forward(self, step)
        finally:
            steps.forward_s += time.perf_counter() - t0

    def marked_sample(self: Any, forwarded: Any, masks: Any) -> Any:
        t0 = time.perf_counter()
        launched = sample(self, forwarded, masks)
        if steps.events is not None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            steps.events = (steps.events[0], end)
        steps.forward_s += time.perf_counter() - t0
        return launched

    core_module.EngineCore.step_core = timed_step
    torch_runner.LaunchedStep.result = timed_result
    torch_runner.TorchRunner.forward = marked_forward
    torch_runner.TorchRunner.sample = marked_sample
    prefill_graphs.PrefillGraphs.shape = picked


def install_on_import() -> None:
    if os.environ.get("CORE_PROBE_DIR"):
        Path(os.environ["CORE_PROBE_DIR"]).mkdir(parents=True, exist_ok=True)
        after_import(TARGET, _patch)


def _mean(rows: list[dict[str, float]], key: str) -> float:
    """The mean of a field (0 where a row predates it)."""
    return sum(r.get(key, 0.0) for r in rows) / len(rows) if rows else 0.0


def _gpu(rows: list[dict[str, float]], key: str = "gpu_step_ms") -> str:
    """A GPU column's mean over the rows that have it (-1: no CUDA events, or no step before the first), or '-'."""
    return f"{_mean([r for r in rows if r[key] >= 0], key):.2f}" if any(r[key] >= 0 for r in rows) else "-"


def summarize(directory: Path) -> str:
    """Per core, per WINDOW_S of steps: means of the per-step fields, and how often the GPU idled between steps."""
    lines = []
    for path in sorted(directory.glob("core_*.jsonl")):
        rows: list[dict[str, float]] = [dict(zip(FIELDS, json.loads(line))) for line in path.read_text().splitlines()]
        if not rows:
            continue
        lines += [f"\n{path.name} ({len(rows)} steps)",
                  "| t s | steps | steps/s | longest step ms | tokens/step | host before wait ms | wait ms | "
                  "host after ms | gc ms | "
                  "GPU step ms | GPU gap ms | steps with a gap > 0.1 ms | decode-only steps: GPU ms | steps with "
                  "a prefill: count: GPU ms, host ms in forward + sample, prompt tokens a step, how many ran "
                  "eagerly, the mean token bucket of the rest |", "|---:" * 14 + "|"]
        first, i = rows[0]["t"], 0
        while i < len(rows):
            j = i
            while j < len(rows) and rows[j]["t"] - rows[i]["t"] < WINDOW_S:
                j += 1
            w = rows[i:j]
            span = (rows[j]["t"] if j < len(rows) else w[-1]["t"] + 1e-3 * sum(
                w[-1][k] for k in ("host_before_wait_ms", "wait_ms", "host_after_wait_ms"))) - w[0]["t"]
            mean = {k: _mean(w, k) for k in FIELDS[1:]}
            gaps = sum(r["gpu_gap_ms"] > 0.1 for r in w)
            mixed = [r for r in w if r["step_tokens"] > r["seqs"]]
            plain = [r for r in w if r["seqs"] and r["step_tokens"] == r["seqs"]]  # not a step that ran nothing
            longest = max(r["host_before_wait_ms"] + r["wait_ms"] + r["host_after_wait_ms"] for r in w)
            lines.append(f"| {w[0]['t'] - first:.1f} | {len(w)} | {len(w) / max(span, 1e-9):.0f} | {longest:.1f} | "
                         f"{mean['tokens']:.0f} | {mean['host_before_wait_ms']:.2f} | {mean['wait_ms']:.2f} | "
                         f"{mean['host_after_wait_ms']:.2f} | {mean['gc_ms']:.2f} | {_gpu(w)} | "
                         f"{_gpu(w, 'gpu_gap_ms')} | {100 * gaps / len(w):.0f}% | {_gpu(plain)} | {len(mixed)}: "
                         f"{_gpu(mixed)}, {_mean(mixed, 'launch_ms'):.2f}, "
                         f"{_mean(mixed, 'step_tokens') - _mean(mixed, 'seqs'):.0f}, "
                         f"{sum(not r.get('bucket') for r in mixed)} eager, graph buckets "
                         f"{_mean([r for r in mixed if r.get('bucket')], 'bucket'):.0f} |")
            i = j
    return "\n".join(lines)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "summarize":
        sys.exit(__doc__)
    print(summarize(Path(sys.argv[2])))
