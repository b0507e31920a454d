"""The runner protocol every execution engine implements; the engine depends only on this."""

from __future__ import annotations

from typing import Protocol

from infer.runners.step import StepInput, StepResult


class Runner(Protocol):
    vocab_size: int

    def execute(self, step: StepInput) -> StepResult:
        """Run one step and return one sampled token per sequence (the step's only host sync)."""
        ...
