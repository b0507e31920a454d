"""min_p (vLLM's): after temperature, a sampled row keeps token i while p_i >= min_p * max p. The batched sampler's
sampleable set equals a float64 reference on fresh random logits, beside rows without min_p (which do not change)
and together with top-k / top-p; min_p = 1 is greedy; SamplingParams refuses what is not a number in [0, 1]."""

from __future__ import annotations

import math
import random

import pytest
import torch

from infer.sampling.params import SamplingParams
from infer.sampling.sampler import SamplingTensors, argmax_rows, sample, scaled_logits
from infer.sampling.slots import SamplingSlots, SlotState
from infer.sampling.speculative import draft_sample, verify

VOCAB = 200
MARGIN = 1e-4  # tokens whose log(p_i / p_max) lies this close to log(min_p) are left out (float32 vs float64)


def reference_keep(logits: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept [V] bool, decided [V] bool) for one sampled row in float64: min-p over softmax(logits / T), then top-k
    and top-p (transformers' cut) over what min-p kept. `decided` is False only near the min-p threshold."""
    x = logits.to(torch.float64) / p.temperature
    log_ratio = x.log_softmax(-1) - x.log_softmax(-1).max()  # log(p_i / p_max)
    keep = log_ratio >= math.log(p.min_p) if p.min_p > 0 else torch.ones_like(x, dtype=torch.bool)
    decided = (log_ratio - math.log(p.min_p)).abs() > MARGIN if p.min_p > 0 else torch.ones_like(keep)
    if p.top_k is not None:
        keep &= x >= x[keep].sort(descending=True).values[min(p.top_k, int(keep.sum())) - 1]
    if p.top_p < 1:
        ascending = x.masked_fill(~keep, -math.inf).sort().values
        dropped = int((ascending.softmax(-1).cumsum(-1) <= 1 - p.top_p).sum())
        keep &= x >= ascending[min(dropped, VOCAB - 1)]
    return keep, decided


def _rows(rng: random.Random, n: int) -> list[SamplingParams]:
    """Mixed rows: min_p or not, greedy or sampled, with or without top-k / top-p."""
    rows = []
    for i in range(n):
        rows.append(SamplingParams(
            temperature=rng.choice([0.0, 0.6, 1.0, 1.7]), min_p=rng.choice([0.0, 0.0, 0.02, 0.1, 0.35, 0.8, 1.0]),
            top_k=rng.choice([None, None, 3, 40]), top_p=rng.choice([1.0, 1.0, 0.7, 0.95]), seed=i,
        ))
    return rows


def _gather(params: list[SamplingParams]) -> SamplingTensors:
    slots = SamplingSlots(len(params), VOCAB, torch.device("cpu"))
    slots.join([SlotState(i, p, p.seed or 0, 0) for i, p in enumerate(params)])
    order = list(range(len(params)))
    return slots.gather(torch.tensor(order), order)


@pytest.mark.parametrize("seed", range(8))
def test_sampleable_set_equals_the_float64_reference(seed: int) -> None:
    rng = random.Random(seed)
    params = _rows(rng, 12)
    params[0] = SamplingParams(temperature=1.0, min_p=0.1, seed=0)  # every batch has a min-p row and one without
    params[1] = SamplingParams(temperature=0.8, seed=1)
    logits = torch.randn(len(params), VOCAB, generator=torch.Generator().manual_seed(seed)) * rng.choice([1.0, 3.0])
    t = _gather(params)
    scaled = scaled_logits(logits, t)
    for i, p in enumerate(params):
        if p.greedy:
            continue
        keep, decided = reference_keep(logits[i], p)
        got = torch.isfinite(scaled[i])
        assert torch.equal(got[decided], keep[decided]), (i, p)
    # the draws of many steps land inside each row's set (the Gumbel draw picks among the finite logits)
    slots = SamplingSlots(len(params), VOCAB, torch.device("cpu"))
    slots.join([SlotState(i, p, p.seed or 0, 0) for i, p in enumerate(params)])
    order = torch.arange(len(params))
    for _ in range(50):
        tokens = sample(logits, slots.gather(order, order.tolist()))
        slots.advance(order)
        for i, p in enumerate(params):
            token = int(tokens[i])
            if p.greedy:
                assert token == int(logits[i].argmax())
            else:
                keep, decided = reference_keep(logits[i], p)
                assert keep[token] or not decided[token], (i, token)


def test_rows_without_min_p_do_not_change() -> None:
    """Beside min-p rows, a row without min_p has the same filtered logits and draws as in a batch where no row has
    min_p (bit for bit)."""
    rng = random.Random(5)
    plain = [SamplingParams(temperature=rng.choice([0.0, 0.7, 1.2]), top_k=rng.choice([None, 7]),
                            top_p=rng.choice([1.0, 0.9]), seed=i) for i in range(8)]
    mixed = [p if i % 2 else SamplingParams(temperature=1.1, min_p=0.2, top_k=rng.choice([None, 7]), seed=i)
             for i, p in enumerate(plain)]
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(9)) * 2
    alone, beside = _gather(plain), _gather(mixed)
    assert alone.min_p is None and beside.min_p is not None
    odd = slice(1, None, 2)
    assert torch.equal(scaled_logits(logits, alone)[odd], scaled_logits(logits, beside)[odd])
    for step in range(20):
        alone.steps.fill_(step), beside.steps.fill_(step)
        assert torch.equal(sample(logits, alone)[odd], sample(logits, beside)[odd])


def test_min_p_one_is_greedy_at_temperature_one() -> None:
    """Only tokens as likely as the likeliest survive min_p = 1: every seeded draw is the argmax (min_p = 0 is not)."""
    n, steps = 64, 30
    logits = torch.randn(n, VOCAB, generator=torch.Generator().manual_seed(2)) * 1.5
    greedy = argmax_rows(logits)
    for min_p, always in ((1.0, True), (0.0, False)):
        slots = SamplingSlots(n, VOCAB, torch.device("cpu"))
        slots.join([SlotState(i, SamplingParams(temperature=1.0, min_p=min_p, seed=1000 + i), 1000 + i, 0)
                    for i in range(n)])
        order = torch.arange(n)
        equal = []
        for _ in range(steps):
            equal.append(torch.equal(sample(logits, slots.gather(order, order.tolist())), greedy))
            slots.advance(order)
        assert all(equal) is always


def test_speculative_rows_apply_min_p() -> None:
    """verify() samples a row without drafts exactly as sample() with min_p, and the drafter's q is zero outside
    the row's min-p set."""
    n, vocab = 32, 12
    logits = torch.randn(n, 3, vocab, generator=torch.Generator().manual_seed(4)) * 2
    params = [SamplingParams(temperature=0.9, min_p=0.3 if i % 2 else 0.0, top_k=None if i % 4 else 5, seed=i)
              for i in range(n)]
    t = SamplingTensors.from_params(params, list(range(n)), [3 * i for i in range(n)], vocab, "cpu")
    tokens, counts = verify(logits, torch.zeros(n, 2, dtype=torch.int64), torch.zeros(n, dtype=torch.int64), t)
    assert counts.tolist() == [1] * n
    assert torch.equal(tokens[:, 0], sample(logits[:, 0].contiguous(), t))
    _, q = draft_sample(logits[:, 0].contiguous(), t, 1)
    assert q is not None
    probs = (logits[:, 0].double() / 0.9).softmax(-1)
    for i, p in enumerate(params):
        if p.min_p:
            assert (q[i][probs[i] < p.min_p * probs[i].max() - 1e-6] == 0).all()


@pytest.mark.parametrize("value", [-0.01, 1.0001, 2, float("nan"), float("inf"), -float("inf"), True, False, "0.1",
                                   None])
def test_sampling_params_refuse_min_p_outside_zero_one(value: object) -> None:
    with pytest.raises(ValueError, match=r"^min_p "):
        SamplingParams(min_p=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, 0.0, 0.05, 1, 1.0])
def test_sampling_params_take_min_p_in_zero_one(value: float) -> None:
    p = SamplingParams(min_p=value)
    assert p.min_p == value and isinstance(p.min_p, float)
    assert p.cuts_min_p == (value > 0) and not SamplingParams(temperature=0, min_p=value).cuts_min_p
