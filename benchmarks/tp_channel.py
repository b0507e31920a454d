"""Latency of the tensor-parallel step message (infer/distributed/channel.py): rank 0 sends a batch-32 decode step's
message (encoded as the engine encodes it, one new block per sequence), then a 60 KB one, to one worker over gloo.

    python benchmarks/tp_channel.py --messages 2000
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch.distributed as dist
import torch.multiprocessing as mp

from infer.distributed.channel import Channel
from infer.distributed.group import free_port
from infer.distributed.step_message import StepEncoder, TableMirror
from infer.runners.step import StepInput, StepKind


def decode_message(batch: int) -> bytes:
    """A decode step of `batch` sequences with 64-block tables, each grown by one block since the step before."""
    encoder = StepEncoder(TableMirror(batch, 256))
    tables = np.arange(batch * 64, dtype=np.int32).reshape(batch, 64)
    step = StepInput(step_kind=StepKind.DECODE, token_ids=[0] * batch, positions=np.full(batch, 1000),
                     query_lens=[1] * batch, context_lens=np.full(batch, 1001), slot_mapping=np.arange(batch),
                     block_tables=tables, sampling_slots=np.arange(batch), prev_rows=list(range(batch)))
    encoder.encode(step)
    step.block_tables = np.concatenate([tables, np.full((batch, 1), 9999, dtype=np.int32)], axis=1)
    return encoder.encode(step)


def run(rank: int, port: int, messages: int) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    channel = Channel(dist.new_group(backend="gloo"))
    for name, data in (("batch-32 decode step", decode_message(32)), ("60 KB", b"x" * 60_000)):
        dist.barrier()
        started = time.perf_counter()
        for _ in range(messages):
            channel.send(data) if rank == 0 else channel.recv()
        if rank == 0:
            us = (time.perf_counter() - started) / messages * 1e6
            print(f"{name} ({len(data)} bytes): {us:.1f} us per message", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=2000)
    mp.spawn(run, args=(free_port(), parser.parse_args().messages), nprocs=2)
