"""The step message: a worker's decoded step equals rank 0's in everything its forward reads, block tables included,
after any sequence of steps (tables growing, requests leaving and their slots reused with other blocks)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.distributed.step_message import STOP, StepDecoder, StepEncoder, TableMirror
from infer.runners.step import StepInput, StepKind

SLOTS, MAX_BLOCKS = 6, 8


@st.composite
def steps(draw) -> list[StepInput]:
    """Random steps: each a subset of slots with a table per slot (decode tables as arrays, prefill ones as lists)."""
    out = []
    for _ in range(draw(st.integers(1, 12))):
        slots = draw(st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=SLOTS, unique=True))
        tables = [draw(st.lists(st.integers(0, 200), min_size=1, max_size=MAX_BLOCKS)) for _ in slots]
        decode = draw(st.booleans())
        n = len(slots)
        if decode:
            width = max(len(t) for t in tables)
            block_tables = np.zeros((n, width), dtype=np.int32)
            for i, t in enumerate(tables):
                block_tables[i, : len(t)] = t
        else:
            block_tables = tables
        out.append(StepInput(
            step_kind=StepKind.DECODE if decode else StepKind.PREFILL, token_ids=list(range(n)),
            positions=np.arange(n, dtype=np.int64), query_lens=[1] * n, context_lens=[len(t) * 16 for t in tables],
            slot_mapping=np.arange(n, dtype=np.int64) * 3, block_tables=block_tables, sampling_slots=slots,
            prev_rows=[draw(st.integers(-1, n - 1)) for _ in range(n)] if draw(st.booleans()) else None,
        ))
    return out


def _padded(tables) -> np.ndarray:
    if isinstance(tables, np.ndarray):
        return tables
    out = np.zeros((len(tables), max(len(t) for t in tables)), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out


@settings(max_examples=150, deadline=None)
@given(steps())
def test_worker_reads_rank0_step(sequence):
    encoder, decoder = StepEncoder(TableMirror(SLOTS, MAX_BLOCKS)), StepDecoder(TableMirror(SLOTS, MAX_BLOCKS))
    for step in sequence:
        got = decoder.decode(encoder.encode(step))
        assert got.step_kind is step.step_kind
        assert np.array_equal(got.block_tables, _padded(step.block_tables))
        for name in ("token_ids", "positions", "query_lens", "context_lens", "slot_mapping", "prev_rows"):
            assert np.array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(step, name))), name
        assert list(got.sampling_slots) == list(step.sampling_slots)
    assert np.array_equal(encoder.mirror.tables, decoder.mirror.tables)


def test_a_decode_step_sends_only_the_changed_blocks():
    encoder = StepEncoder(TableMirror(64, 256))
    tables = np.arange(64 * 100, dtype=np.int32).reshape(64, 100)
    step = StepInput(step_kind=StepKind.DECODE, token_ids=[0] * 64, positions=np.zeros(64, dtype=np.int64),
                     query_lens=[1] * 64, context_lens=np.full(64, 1600), slot_mapping=np.zeros(64, dtype=np.int64),
                     block_tables=tables, sampling_slots=np.arange(64))
    first = len(encoder.encode(step))
    tables = np.concatenate([tables, np.full((64, 1), 7, dtype=np.int32)], axis=1)  # every sequence grew a block
    grown = len(encoder.encode(step.__class__(**{**step.__dict__, "block_tables": tables})))
    assert grown < first / 10  # 64 new entries, not the 64 x 101 table
    assert STOP == b""
