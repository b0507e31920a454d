"""The runner protocol every execution engine implements; the engine depends only on this."""

from __future__ import annotations

from typing import Protocol

from infer.runners.step import StepInput, StepResult
from omniscience import ProbeBank


class LaunchedStep(Protocol):
    def result(self) -> StepResult:
        """Wait for the step (the step boundary: its one host sync) and return its tokens."""
        ...


class Runner(Protocol):
    vocab_size: int
    probes: ProbeBank | None  # the loaded probe set's device buffers, when the engine was built with one

    def launch(self, step: StepInput) -> LaunchedStep:
        """Queue one step without waiting for it. Rows with prev_rows[i] >= 0 take their input token
        from the previous launched step's sampled ids, which the host may not have read yet."""
        ...
