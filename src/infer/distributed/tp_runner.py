"""Rank 0's runner under tensor parallelism: each step goes to the workers first, then runs here as on one device
(the forward's collectives meet the workers' in the same order); only rank 0 samples."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from infer.distributed.channel import Channel
from infer.distributed.group import DistributedError, Groups
from infer.distributed.step_message import STOP, StepEncoder, TableMirror
from infer.runners.step import StepInput
from infer.runners.torch_runner import Forwarded, TorchRunner

if TYPE_CHECKING:
    from infer.distributed.workers import WorkerSet  # which starts the workers' main, which builds this runner


def table_mirror(runner: TorchRunner) -> TableMirror:
    """The block-table mirror of a runner's sampling slots (the same on rank 0 and on every worker)."""
    return TableMirror(runner.max_batch_size, runner.buffers.max_blocks)


class TensorParallelRunner(TorchRunner):
    """The torch runner on rank 0's shard that first sends each step to the workers (docs/distributed.md)."""

    def __init__(self, groups: Groups, workers: WorkerSet | None, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.groups, self.workers = groups, workers
        self.channel = Channel(groups.control)
        self.encoder = StepEncoder(table_mirror(self))
        self._closed = False

    def check(self) -> None:
        """DistributedError when a worker this rank started has exited."""
        if self.workers is not None and self.workers.failure is not None:
            raise DistributedError(self.workers.failure)

    def forward(self, step: StepInput) -> Forwarded:
        self.check()
        message = self.encoder.encode(step)
        try:
            self.channel.send(message)
        except RuntimeError as exc:  # gloo: a worker's connection closed (it is exiting: say which), or a timeout
            failure = self.workers.failure_within(2.0) if self.workers is not None else None
            raise DistributedError(failure or f"tensor-parallel workers unreachable: {exc}") from exc
        return super().forward(step)

    def close(self) -> None:
        """Stop the workers (their loop ends on the empty message) and leave the process group."""
        if self._closed:
            return
        self._closed = True
        if self.workers is None or self.workers.failure is None:
            try:
                self.channel.send(STOP)
            except RuntimeError:
                pass
        self.groups.close()  # before waiting for the workers: none waits for another to leave
        if self.workers is not None:
            self.workers.join()
