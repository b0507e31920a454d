"""DecodeBuffers: what the device buffers hold after any sequence of fills equals the step's own inputs."""

from __future__ import annotations

import random
from dataclasses import replace

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
        sampled = [rng.randrange(1000, 2000) for _ in range(MAX_BATCH)]  # what the previous step sampled
        buffers.last_tokens.copy_(torch.tensor(sampled))
        buffers.fill(DecodeRows.of(step), rows)
        view = buffers.view([], rows)
        n = step.num_seqs
        assert step.prev_rows is not None
        inputs = [sampled[p] if p >= 0 else t for t, p in zip(step.token_ids, step.prev_rows)]
        assert view.input_ids().tolist() == inputs + [0] * (rows - n)  # padding rows: token 0
        assert view.sampling_slots[:n].tolist() == buffers.sampling_slots(n).tolist() == step.sampling_slots
        assert view.batch.positions[:n].tolist() == step.positions
        assert view.batch.slot_mapping.tolist() == step.slot_mapping + [-1] * (rows - n)
        assert view.batch.context_lens.tolist() == step.context_lens + [0] * (rows - n)
        for i, table in enumerate(step.block_tables):
            assert view.batch.block_tables[i, : len(table)].tolist() == table


def test_a_small_step_uploads_only_its_own_layout() -> None:
    """A 1-row step's inputs sit in the buffer's first bytes, laid out alike whatever max_batch is: its copy does
    not grow with max_batch (the copy is what a decode step waits for at its boundary)."""
    small = DecodeBuffers(torch.device("cpu"), 1, MAX_BLOCKS, MAX_BLOCKS * 4)
    large = DecodeBuffers(torch.device("cpu"), 256, MAX_BLOCKS, MAX_BLOCKS * 4)
    assert small.upload_bytes(1) == large.upload_bytes(1) == 6 * 2 * 8 + 16 + MAX_BLOCKS * 4
    step = replace(decode_step([[1, 2]], random.Random(0)), prev_rows=[-1])  # (a sampled id's place differs)
    for buffers in (small, large):
        buffers.fill(DecodeRows.of(step), 1)
        assert buffers.view([], 1).batch.positions.tolist() == step.positions
    used = small.upload_bytes(1)
    assert torch.equal(small._device_bytes[:used], large._device_bytes[:used])


def test_pad_makes_a_layout_all_padding() -> None:
    """Before a graph's warm-up runs the forward on the buffers, every row of its layout is padding: KV slot -1
    (the store skips it), context length 0, token 0 of its own (not a sampled id)."""
    buffers = DecodeBuffers(torch.device("cpu"), MAX_BATCH, MAX_BLOCKS, MAX_BLOCKS * 4)
    buffers.last_tokens.fill_(7)
    buffers.fill(DecodeRows.of(decode_step([[1]] * MAX_BATCH, random.Random(1))), MAX_BATCH)
    for rows in (1, 3, MAX_BATCH):
        buffers.pad(rows)
        view = buffers.view([], rows)
        assert view.batch.slot_mapping.tolist() == [-1] * rows
        assert view.input_ids().tolist() == [0] * rows
        assert view.lora_ids.tolist() == [-1] * rows
        assert view.batch.context_lens.tolist() == [0] * rows
