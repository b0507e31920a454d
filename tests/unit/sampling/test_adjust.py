"""logit_bias, presence / frequency penalties and min_tokens: the slots' adjusted logits equal a float64
reference built from OpenAI's definitions, through joins, recorded tokens, rejoins and speculative rows."""

from __future__ import annotations

import random

import pytest
import torch

from infer.sampling.adjust import reference_logits
from infer.sampling.params import SamplingParams
from infer.sampling.sampler import penalized, sample
from infer.sampling.slots import SamplingSlots, SlotState

VOCAB, EOS = 64, (2, 5)


def _params(rng: random.Random) -> SamplingParams:
    bias = {rng.randrange(VOCAB): rng.choice([-100.0, -3.5, 0.25, 7.0, 100.0]) for _ in range(rng.randrange(4))}
    return SamplingParams(temperature=rng.choice([0.0, 0.8]), presence_penalty=rng.choice([0.0, -1.5, 0.7, 2.0]),
                          frequency_penalty=rng.choice([0.0, 0.3, -2.0]), logit_bias=bias or None,
                          min_tokens=rng.choice([0, 0, 3, 6]), max_tokens=20, seed=rng.randrange(100))


def _state(slot: int, p: SamplingParams, generated: list[int]) -> SlotState:
    return SlotState(slot, p, p.seed or 0, len(generated), tuple(generated) if p.counts_output else (),
                     EOS if p.min_tokens else ())


@pytest.mark.parametrize("seed", range(12))
def test_adjusted_logits_equal_the_float64_reference(seed: int) -> None:
    rng = random.Random(seed)
    slots = SamplingSlots(6, VOCAB, torch.device("cpu"))
    rows = {s: (_params(rng), [rng.randrange(VOCAB) for _ in range(rng.randrange(4))]) for s in range(6)}
    slots.join([_state(s, p, g) for s, (p, g) in rows.items()])  # a rejoin: counts rebuilt from `generated`
    for _ in range(rng.randrange(1, 6)):  # steps: every row samples, some tokens do not count
        order = rng.sample(list(rows), rng.randrange(1, 7))
        tokens = [rng.randrange(VOCAB) for _ in order]
        samples = [rng.random() < 0.8 for _ in order]
        slots.record(torch.tensor(order), order, torch.tensor(tokens), samples=samples)
        slots.advance(torch.tensor([s for s, c in zip(order, samples) if c], dtype=torch.int64))
        for s, t, c in zip(order, tokens, samples):
            if c:
                rows[s][1].append(t)
    order = rng.sample(list(rows), 6)
    logits = torch.randn(6, VOCAB) * 4
    t = slots.gather(torch.tensor(order), order)
    got = penalized(logits, t, None)
    for i, s in enumerate(order):
        p, generated = rows[s]
        want = reference_logits(logits[i], p, generated, EOS if p.min_tokens else ())
        assert torch.equal(torch.isinf(got[i]), torch.isinf(want)), s
        finite = ~torch.isinf(want)
        torch.testing.assert_close(got[i][finite].double(), want[finite], rtol=0, atol=1e-5)


def test_speculative_rows_hold_eos_per_position() -> None:
    slots = SamplingSlots(2, VOCAB, torch.device("cpu"))
    slots.join([SlotState(0, SamplingParams(min_tokens=2, max_tokens=8), 0, 1, (), EOS)])
    adjusted = penalized(torch.zeros(3, VOCAB), slots.gather(torch.tensor([0]), [0]).per_position(3), None)
    assert torch.isinf(adjusted[0, list(EOS)]).all()  # token 2 of the row: still held
    assert not torch.isinf(adjusted[1:]).any()  # tokens 3 and 4 may end it


def test_banned_token_never_sampled_and_rows_reproduce_in_any_batch() -> None:
    """A row's draws with its adjustments depend on its own state only: alone or beside others, the same tokens."""
    params = SamplingParams(temperature=1.5, logit_bias={3: -100, 4: 5.0}, presence_penalty=1.0, frequency_penalty=0.5,
                            min_tokens=4, max_tokens=30, seed=11)
    other = SamplingParams(temperature=0.9, seed=5, frequency_penalty=2.0)
    logits = torch.randn(1, VOCAB)

    def run(batch: list[tuple[int, SamplingParams]]) -> list[int]:
        slots = SamplingSlots(4, VOCAB, torch.device("cpu"))
        slots.join([_state(s, p, []) for s, p in batch])
        order = torch.tensor([s for s, _ in batch])
        out = []
        for _ in range(30):
            t = slots.gather(order, order.tolist())
            tokens = sample(logits.expand(len(batch), -1).clone(), t)
            slots.record(order, order.tolist(), tokens)
            slots.advance(order)
            out.append(int(tokens[[s for s, _ in batch].index(2)]))
        return out

    alone = run([(2, params)])
    assert alone == run([(0, other), (2, params), (3, other)])
    assert 3 not in alone and not set(alone[:4]) & set(EOS)


def test_a_rejoin_rebuilds_what_recording_the_same_tokens_built() -> None:
    params = SamplingParams(presence_penalty=0.7, frequency_penalty=0.4, logit_bias={3: 2.0, 9: -100}, max_tokens=9)
    tokens = [3, 3, 7, 3, 9, 7]
    stepped = SamplingSlots(2, VOCAB, torch.device("cpu"))
    stepped.join([SlotState(1, params, 0, 0)])
    for t in tokens:
        stepped.record(torch.tensor([1]), [1], torch.tensor([t]))
        stepped.advance(torch.tensor([1]))
    rejoined = SamplingSlots(2, VOCAB, torch.device("cpu"))
    rejoined.join([SlotState(1, params, 0, len(tokens), tuple(tokens))])
    logits = torch.randn(1, VOCAB)
    got = [penalized(logits, s.gather(torch.tensor([1]), [1]), None)[0] for s in (stepped, rejoined)]
    torch.testing.assert_close(got[0], got[1])
    want = reference_logits(logits[0], params, tokens)
    torch.testing.assert_close(got[1].double(), want, rtol=0, atol=1e-5)
