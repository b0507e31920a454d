"""runners/verify.py: a step with drafts laid out as K + 1 decode rows per sequence, the varlen logit rows, and the
packed readback, against the meaning of each row written out by hand."""

from __future__ import annotations

import random

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.models.forward_batch import cu_seqlens
from infer.runners.step import StepInput, StepKind
from infer.runners.verify import decode_rows, pack, unpack, verify_inputs


def verify_step(drafts: list[tuple[int, ...]], rng: random.Random) -> StepInput:
    """Sequence b: context c_b before this step, its last token and drafts at positions c_b .. c_b + k_b."""
    starts = [rng.randrange(1, 40) for _ in drafts]
    query = [1 + len(d) for d in drafts]
    return StepInput(
        StepKind.DECODE,
        token_ids=[t for d in drafts for t in (rng.randrange(100, 200), *d)],
        positions=[p for s, q in zip(starts, query) for p in range(s, s + q)],
        query_lens=query,
        context_lens=[s + q for s, q in zip(starts, query)],
        slot_mapping=[1000 * b + p for b, (s, q) in enumerate(zip(starts, query)) for p in range(s, s + q)],
        block_tables=[[rng.randrange(50) for _ in range(1 + (s + q) // 4)] for s, q in zip(starts, query)],
        sampling_slots=rng.sample(range(16), len(drafts)),
        prev_rows=[rng.choice([-1, 3]) for _ in drafts],
        drafts=drafts,
    )


drafts_lists = st.lists(st.lists(st.integers(1, 99), max_size=5).map(tuple), min_size=1, max_size=6).filter(
    lambda ds: any(ds))


@settings(max_examples=80, deadline=None)
@given(drafts_lists, st.integers(0, 2**16))
def test_decode_rows_are_one_query_token_each(drafts: list[tuple[int, ...]], seed: int) -> None:
    step = verify_step(drafts, random.Random(seed))
    rows = decode_rows(step)
    width = 1 + max(map(len, drafts))
    assert rows.num_rows == len(drafts) * width
    cu = cu_seqlens(step.query_lens)
    for b, d in enumerate(drafts):
        for j in range(width):
            r = b * width + j
            if j <= len(d):  # the sequence's j-th input: sees its context up to and including itself
                packed = cu[b] + j
                assert rows.token_ids[r] == step.token_ids[packed]
                assert rows.positions[r] == step.positions[packed]
                assert rows.slot_mapping[r] == step.slot_mapping[packed]
                assert rows.context_lens[r] == step.positions[packed] + 1
                assert rows.block_tables[r] == step.block_tables[b]
                assert rows.sampling_slots[r] == step.sampling_slots[b]
                assert rows.prev_rows[r] == (step.prev_rows[b] if j == 0 else -1)
            else:  # padding: stores nothing, reads nothing
                assert (rows.slot_mapping[r], rows.context_lens[r], rows.prev_rows[r]) == (-1, 0, -1)


@settings(max_examples=40, deadline=None)
@given(drafts_lists, st.lists(st.booleans(), min_size=6, max_size=6), st.integers(0, 2**16))
def test_verify_inputs_on_both_layouts(drafts: list[tuple[int, ...]], samples: list[bool], seed: int) -> None:
    step = verify_step(drafts, random.Random(seed))
    step.samples = samples[: len(drafts)]
    k = max(map(len, drafts))
    on_rows = verify_inputs(step, torch.device("cpu"))
    assert on_rows.logit_rows is None and on_rows.width == k + 1
    assert on_rows.drafts.tolist() == [list(d) + [0] * (k - len(d)) for d in drafts]
    assert on_rows.num_drafts.tolist() == [len(d) for d in drafts]
    assert on_rows.counting.tolist() == [int(s) for s in step.samples]
    cu = cu_seqlens(step.query_lens)
    varlen = verify_inputs(step, torch.device("cpu"), cu)
    assert varlen.drafts.tolist() == on_rows.drafts.tolist()
    assert varlen.logit_rows is not None
    expected = [cu[b] + min(j, len(d)) for b, d in enumerate(drafts) for j in range(k + 1)]
    assert varlen.logit_rows.tolist() == expected


def test_pack_unpack_round_trip() -> None:
    tokens = torch.tensor([[5, 6, 7], [8, 0, 0], [9, 10, 0]])
    counts = torch.tensor([3, 1, 2])
    first, extra = unpack(pack(tokens, counts).tolist(), 3, 3)
    assert first == [5, 8, 9] and extra == [[6, 7], [], [10]]
