"""The runner protocol every execution engine implements; the engine depends only on this."""

from __future__ import annotations

from typing import Any, Protocol

import torch

from infer.runners.step import StepInput, StepResult
from omniscience import ProbeBank


class LaunchedStep(Protocol):
    def result(self) -> StepResult:
        """Wait for the step (the step boundary: its one host sync) and return its read-outs."""
        ...


class Runner(Protocol):
    """A step is queued in two calls so the engine fills grammar masks between them, while the device runs the
    forward; neither call waits for the device. Rows with prev_rows[i] >= 0 take their input token from the previous
    step's sampled ids, which the host may not have read yet."""

    vocab_size: int
    probes: ProbeBank | None  # the loaded probe set's device buffers, when the engine was built with one
    # forward returns before the step's compute ends (CUDA, MLX): only then does launching the next step before this
    # one is read overlap anything; on the CPU it would only hold each token back one step
    launches_ahead: bool

    def forward(self, step: StepInput) -> Any:
        """Queue the step's forward and LM head; returns what `sample` takes."""
        ...

    def sample(self, forwarded: Any, masks: torch.Tensor | None) -> LaunchedStep:
        """Queue the sampling of a forwarded step; `masks`: [num_seqs, ceil(vocab / 32)] int32 allowed-token bits."""
        ...

    def execute(self, step: StepInput) -> StepResult:
        """One step, synchronously and without masks."""
        ...
