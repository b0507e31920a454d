"""DecodeBuffers: what the device buffers hold after any sequence of fills equals the step's own inputs."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.runners.decode_buffers import DecodeBuffers, DecodeRows
from infer.runners.step import StepInput, StepKind

MAX_BATCH, MAX_BLOCKS = 6, 5


def decode_step(tables: list[list[int]], rng: random.Random) -> StepInput:
    n = len(tables)
    return StepInput(
        StepKind.DECODE,
        token_ids=[rng.randrange(100) for _ in range(n)],
        positions=[rng.randrange(50) for _ in range(n)],
        query_lens=[1] * n,
        context_lens=[len(t) * 4 - rng.randrange(4) for t in tables],
        slot_mapping=[rng.randrange(80) for _ in range(n)],
        block_tables=[list(t) for t in tables],
        prev_rows=[rng.choice([-1, 0]) for _ in range(n)],
        sampling_slots=rng.sample(range(MAX_BATCH), n),
    )


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=MAX_BLOCKS), min_size=1, max_size=MAX_BATCH),
                min_size=1, max_size=8), st.integers(0, 2**16))
def test_buffers_hold_each_step_exactly(steps: list[list[list[int]]], seed: int) -> None:
    """Tables change, grow, move between rows and repeat (rows the staging buffer skips must still be right)."""
    rng = random.Random(seed)
    buffers = DecodeBuffers(torch.device("cpu"), MAX_BATCH, MAX_BLOCKS, MAX_BLOCKS * 4)
    for tables in steps:
        step = decode_step(tables, rng)
        rows = rng.randint(step.num_seqs, MAX_BATCH)
        buffers.fill(DecodeRows.of(step), rows)
        view = buffers.view([], rows)
        n = step.num_seqs
        assert view.token_ids[:n].tolist() == step.token_ids
        assert view.prev_rows[:n].tolist() == step.prev_rows
        assert view.sampling_slots[:n].tolist() == buffers.sampling_slots(n).tolist() == step.sampling_slots
        assert view.batch.positions[:n].tolist() == step.positions
        assert view.batch.slot_mapping.tolist() == step.slot_mapping + [-1] * (rows - n)
        assert view.batch.context_lens.tolist() == step.context_lens + [0] * (rows - n)
        for i, table in enumerate(step.block_tables):
            assert view.batch.block_tables[i, : len(table)].tolist() == table
