"""The MLX sampler against the torch sampler it ports: the same noise bit for bit, the same top-k / top-p cut, and
the same tokens for greedy, sampled, filtered, min-p, penalised, biased and min_tokens rows; min-p's kept set equals a
float64 reference."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
import torch

from infer.runners.mlx.sampler import column_words, mask_min_p, mask_top_k_top_p, row_keys, sample, uniform
from infer.runners.mlx.slots import MxSamplingSlots
from infer.runners.mlx.strict import Phase, phase
from infer.sampling.params import SamplingParams
from infer.sampling.random import uniform as torch_uniform
from infer.sampling.sampler import sample as torch_sample
from infer.sampling.slots import SamplingSlots, SlotState
from layerzero.kernels.reference.sampling import mask_top_k_top_p as torch_mask

VOCAB = 300


def test_noise_is_the_torch_noise_bit_for_bit() -> None:
    seeds = np.array([0, 1, 2**63 - 1, 123456789123456789, 42], dtype=np.uint64)
    steps = np.array([0, 7, 3, 2**33 + 5, 1000], dtype=np.int64)
    ours = np.array(uniform(mx.array(row_keys(seeds, steps)), column_words(VOCAB)))
    ref = torch_uniform(torch.tensor(seeds.astype(np.int64)), torch.tensor(steps), VOCAB).numpy()
    assert np.array_equal(ours, ref)


def test_top_k_top_p_cut_matches_layerzero() -> None:
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, VOCAB, generator=g)
    logits[0, :10] = 3.0  # a tie at the cut
    top_k = torch.tensor([1, 5, VOCAB, 50, 10, VOCAB])
    top_p = torch.tensor([1.0, 0.5, 0.9, 0.3, 1.0, 0.05])
    ours = mask_top_k_top_p(mx.array(logits.numpy()), mx.array(top_k.numpy().astype(np.int32)), mx.array(top_p.numpy()))
    ref = torch_mask(logits, top_k, top_p)
    assert np.array_equal(np.isinf(np.array(ours)), torch.isinf(ref).numpy())


PARAMS = [
    SamplingParams(temperature=0),
    SamplingParams(temperature=0.8, seed=1),
    SamplingParams(temperature=1.2, top_k=20, seed=2),
    SamplingParams(temperature=0.7, top_p=0.8, seed=3),
    SamplingParams(temperature=1.0, top_k=40, top_p=0.9, repetition_penalty=1.3, seed=4),
    SamplingParams(temperature=0.9, logit_bias={5: 5.0, 6: -100}, presence_penalty=0.5, frequency_penalty=0.3, seed=5),
    SamplingParams(temperature=0, min_tokens=3, seed=6),
    SamplingParams(temperature=1.1, min_p=0.15, seed=7),
    SamplingParams(temperature=0.8, min_p=0.05, top_k=30, top_p=0.9, seed=8),
]


def _states(eos: int) -> list[SlotState]:
    return [SlotState(i, p, p.seed or 0, 0, (), (eos,) if p.min_tokens else ()) for i, p in enumerate(PARAMS)]


def test_tokens_match_the_torch_sampler_over_steps() -> None:
    """Seven rows of different parameters, eight steps: each step's tokens equal torch's (and the state both keep
    from the tokens, counts and offsets, stays equal)."""
    n, eos = len(PARAMS), 7
    ours, ref = MxSamplingSlots(n, VOCAB), SamplingSlots(n, VOCAB, torch.device("cpu"))
    ours.join(_states(eos))
    ref.join(_states(eos))
    slots = list(range(n))
    g = torch.Generator().manual_seed(1)
    history = np.zeros((n, VOCAB), dtype=bool)
    history[:, :30] = True
    for _ in range(8):
        logits = torch.randn(n, VOCAB, generator=g) * 3
        logits[:, eos] += 20  # min_tokens must hold it back for the first 3 steps
        with phase(Phase.ENCODE):
            rows = ours.rows(slots)
            ours.advance(slots, None)
            tokens = sample(mx.array(logits.numpy()), rows, column_words(VOCAB), mx.array(history))
            ours.record(slots, tokens, None)
        index = torch.tensor(slots)
        expected = torch_sample(logits, ref.gather(index, slots), torch.from_numpy(history))
        ref.advance(index)
        ref.record(index, slots, expected)
        with phase(Phase.READBACK):
            assert tokens.tolist() == expected.tolist()
        history[np.arange(n), expected.numpy()] = True


@pytest.mark.parametrize("row", range(len(PARAMS)))
def test_a_row_samples_the_same_alone_and_in_a_batch(row: int) -> None:
    logits = mx.array(np.random.default_rng(3).normal(size=(len(PARAMS), VOCAB)).astype(np.float32))
    batch, alone = MxSamplingSlots(len(PARAMS), VOCAB), MxSamplingSlots(1, VOCAB)
    batch.join(_states(7))
    alone.join([_states(7)[row]._replace(slot=0)])
    seen = mx.zeros((len(PARAMS), VOCAB), dtype=mx.bool_)
    together = sample(logits, batch.rows(list(range(len(PARAMS)))), column_words(VOCAB), seen)
    single = sample(logits[row : row + 1], alone.rows([0]), column_words(VOCAB), seen[row : row + 1])
    assert together.tolist()[row] == single.tolist()[0]


def test_min_p_keeps_the_float64_reference_set() -> None:
    """Rows with and without min_p in one batch: the cut keeps exactly {i : p_i >= min_p * max p} of softmax(logits / T)
    (rows without min_p keep everything), and every draw of many steps lands inside it."""
    params = [SamplingParams(temperature=t, min_p=m, seed=i)
              for i, (t, m) in enumerate([(1.0, 0.1), (0.7, 0.0), (1.5, 0.3), (1.0, 1.0), (0.9, 0.02), (1.2, 0.0)])]
    n = len(params)
    logits = np.random.default_rng(11).normal(size=(n, VOCAB)).astype(np.float32) * 2
    scaled = logits.astype(np.float64) / np.array([p.temperature for p in params])[:, None]
    log_ratio = scaled - scaled.max(axis=-1, keepdims=True)  # log(p_i / p_max)
    with np.errstate(divide="ignore"):
        threshold = np.log(np.array([p.min_p for p in params]))[:, None]
    keep = log_ratio >= threshold
    decided = np.abs(log_ratio - threshold) > 1e-4
    slots = MxSamplingSlots(n, VOCAB)
    slots.join([SlotState(i, p, i, 0) for i, p in enumerate(params)])
    rows = slots.rows(list(range(n)))
    assert rows.min_p is not None
    cut = np.isfinite(np.array(mask_min_p(mx.array(logits) / rows.temperature[:, None], rows.min_p)))
    assert np.array_equal(cut[decided], keep[decided])
    assert keep[1].all() and keep[5].all() and keep[3].sum() == 1 and not keep[2].all()
    for _ in range(40):
        tokens = np.array(sample(mx.array(logits), slots.rows(list(range(n))), column_words(VOCAB)))
        slots.advance(list(range(n)), None)
        assert keep[np.arange(n), tokens].all()
    assert tokens[3] == logits[3].argmax()
