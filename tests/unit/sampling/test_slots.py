"""SamplingSlots: whatever sequence of joins, steps and advances, a step's gathered tensors equal packing its
rows' parameters afresh (SamplingTensors.from_params) with each row's count of tokens that counted."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from infer.sampling.params import SamplingParams
from infer.sampling.sampler import SamplingTensors
from infer.sampling.slots import SamplingSlots, SlotState

SLOTS, VOCAB = 6, 50

params_strategy = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 0.7, 1.3]),
    top_k=st.sampled_from([None, 5, VOCAB + 10]),
    top_p=st.sampled_from([1.0, 0.9]),
    min_p=st.sampled_from([0.0, 0.25]),
    repetition_penalty=st.sampled_from([1.0, 1.2]),
)
join = st.tuples(st.just("join"), st.integers(0, SLOTS - 1), params_strategy, st.integers(0, 2**62), st.integers(0, 99))
step = st.tuples(st.just("step"), st.lists(st.integers(0, SLOTS - 1), min_size=1, max_size=SLOTS, unique=True),
                 st.lists(st.booleans(), min_size=SLOTS, max_size=SLOTS))


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(join, step), max_size=20))
def test_gathered_tensors_equal_fresh_packing(ops) -> None:
    slots = SamplingSlots(SLOTS, VOCAB, torch.device("cpu"))
    model: dict[int, list] = {}  # slot -> [params, seed, steps]
    for op in ops:
        if op[0] == "join":
            _, slot, params, seed, steps = op
            slots.join([SlotState(slot, params, seed, steps)])
            model[slot] = [params, seed, steps]
            continue
        rows = [s for s in op[1] if s in model]
        if not rows:
            continue
        counts = [c for c, s in zip(op[2], op[1]) if s in model]
        got = slots.gather(torch.tensor(rows), rows)
        want = SamplingTensors.from_params([model[s][0] for s in rows], [model[s][1] for s in rows],
                                           [model[s][2] for s in rows], VOCAB, "cpu")
        fields = ("temperature", "top_k", "top_p", "repetition_penalty", "seeds", "steps")
        assert got.plain_greedy == (want.all_greedy and not want.any_penalty)
        if got.plain_greedy:  # no row samples: none reads its seed, step count, top-k or top-p
            fields = ("temperature", "repetition_penalty")
        for name in fields:
            assert torch.equal(getattr(got, name), getattr(want, name)), name
        assert (got.all_greedy, got.any_top_k_or_p, got.any_penalty) == (want.all_greedy, want.any_top_k_or_p,
                                                                          want.any_penalty)
        assert (got.min_p is None) == (want.min_p is None)
        if want.min_p is not None:
            assert torch.equal(got.min_p, want.min_p)
        advancing = [s for s, c in zip(rows, counts) if c]
        slots.advance(torch.tensor(advancing, dtype=torch.int64))
        for s in advancing:
            model[s][2] += 1


def test_a_rejoined_slot_takes_the_new_requests_state() -> None:
    slots = SamplingSlots(2, VOCAB, torch.device("cpu"))
    slots.join([SlotState(1, SamplingParams(temperature=0.5, top_k=3), 7, 0)])
    slots.advance(torch.tensor([1]))
    slots.join([SlotState(1, SamplingParams(temperature=0.25), 9, 4)])
    got = slots.gather(torch.tensor([1]), [1])
    assert not got.all_greedy and not got.any_top_k_or_p
    assert (got.seeds.item(), got.steps.item(), got.temperature.item()) == (9, 4, 0.25)


def test_a_plain_greedy_step_reads_no_slot() -> None:
    """Greedy rows without penalties or adjustments get a greedy row's neutral parameters, whatever their slots hold;
    one row with a repetition penalty, or one sampled row, makes the step gather every row's slot."""
    slots = SamplingSlots(3, VOCAB, torch.device("cpu"))
    slots.join([SlotState(0, SamplingParams(temperature=0.0, top_k=3), 5, 7),
                SlotState(1, SamplingParams(temperature=0.0), 6, 2),
                SlotState(2, SamplingParams(temperature=0.0, repetition_penalty=1.3), 8, 1)])
    slots._floats.fill_(float("nan"))  # a plain greedy gather must not read the slots
    got = slots.gather(torch.tensor([1, 0]), [1, 0])
    assert got.plain_greedy and got.adjust is None
    assert got.temperature.tolist() == [0.0, 0.0] and got.top_k.tolist() == [VOCAB, VOCAB]
    assert not slots.gather(torch.tensor([0, 2]), [0, 2]).plain_greedy
    slots.join([SlotState(1, SamplingParams(temperature=0.5), 6, 2)])
    assert not slots.gather(torch.tensor([1, 0]), [1, 0]).plain_greedy
