"""Batched sampler and its counter-based noise: transformers parity, distribution, determinism, independence."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    RepetitionPenaltyLogitsProcessor,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from infer.sampling.params import SamplingParams
from infer.sampling.random import uniform
from infer.sampling.sampler import SamplingTensors, apply_repetition_penalty, argmax_rows, filter_top_k_top_p, sample

# Chi-square and KS thresholds at a one-in-a-million false-alarm rate; the noise is a fixed function of the
# seeds, so each of these tests passes or fails the same way on every run.
P_VALUE_FLOOR = 1e-6
KS_COEFF = math.sqrt(-math.log(P_VALUE_FLOOR / 2) / 2)


def _tensors(params: list[SamplingParams], seeds: list[int], steps: list[int], vocab: int) -> SamplingTensors:
    return SamplingTensors.from_params(params, seeds, steps, vocab, "cpu")


def _random_logits(b: int, v: int, seed: int, scale: float = 3.0, quantum: float = 0.0) -> torch.Tensor:
    """Deterministic logits; a nonzero quantum rounds them so that ties are common."""
    x = torch.randn(b, v, generator=torch.Generator().manual_seed(seed)) * scale
    return torch.round(x / quantum) * quantum if quantum else x


def _chi2_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Upper-tail p-value of Pearson's chi-square for observed counts against expected probabilities."""
    keep = probs > 0
    expected = probs[keep].double() * counts.sum()
    stat = ((counts[keep].double() - expected) ** 2 / expected).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), stat / 2))


def _hf_filter(logits: torch.Tensor, k: int | None, p: float) -> torch.Tensor:
    """transformers' warpers in generate()'s order: top-k, then top-p."""
    if k is not None:
        logits = TopKLogitsWarper(k)(None, logits)  # type: ignore[arg-type]
    return TopPLogitsWarper(p)(None, logits)  # type: ignore[arg-type]


# ---------------------------------------------------------------- uniform noise


def test_uniform_is_in_open_unit_interval_for_extreme_seeds_and_steps() -> None:
    seeds = torch.tensor([0, 1, 2**32 - 1, 2**32, 2**62, 2**63 - 1] * 2)
    steps = torch.tensor([0] * 6 + [2**40 + 3] * 6)
    u = uniform(seeds, steps, 50_000)
    assert u.dtype == torch.float32 and u.shape == (12, 50_000)
    assert float(u.min()) > 0 and float(u.max()) < 1


def test_uniform_is_uniform_by_ks_statistic() -> None:
    u = uniform(torch.arange(100), torch.full((100,), 7), 10_000).flatten().double().sort().values
    n = u.numel()
    grid = torch.arange(1, n + 1, dtype=torch.float64) / n
    d = max(float((grid - u).max()), float((u - (grid - 1 / n)).max()))
    assert d < KS_COEFF / math.sqrt(n)


def test_uniform_has_at_least_24_balanced_bits() -> None:
    u = uniform(torch.arange(256), torch.zeros(256, dtype=torch.int64), 4096).flatten()
    n = u.numel()
    # 2**24 equally likely cells give ~970.9k distinct values in 1M draws; 2**23 cells would give ~942k.
    assert torch.unique(u).numel() > 960_000
    cells = (u.double() * 2**24).floor().long()
    for bit in range(24):
        ones = float(((cells >> bit) & 1).sum())
        assert abs(ones - n / 2) < 5 * math.sqrt(n / 4), f"bit {bit} is biased"


def test_uniform_differs_across_seeds_steps_and_high_words() -> None:
    s = 1234
    seeds = torch.tensor([s, s, s + 1, s + 2**32, s])
    steps = torch.tensor([0, 1, 0, 0, 2**32])
    u = uniform(seeds, steps, 20_000)
    for i in range(5):
        for j in range(i + 1, 5):
            assert float((u[i] == u[j]).float().mean()) < 1e-3
            corr = torch.corrcoef(torch.stack([u[i], u[j]]).double())[0, 1]
            assert abs(float(corr)) < 5 / math.sqrt(20_000)


def test_uniform_consecutive_columns_are_uncorrelated() -> None:
    u = uniform(torch.tensor([99]), torch.tensor([3]), 100_000)[0].double()
    corr = torch.corrcoef(torch.stack([u[:-1], u[1:]]))[0, 1]
    assert abs(float(corr)) < 5 / math.sqrt(100_000)


def test_uniform_rows_depend_only_on_their_own_seed_and_step() -> None:
    seeds = torch.tensor([5, 2**40, 17, 5])
    steps = torch.tensor([9, 0, 3, 9])
    batch = uniform(seeds, steps, 1000)
    for b in range(4):
        assert torch.equal(batch[b], uniform(seeds[b : b + 1], steps[b : b + 1], 1000)[0])
    assert torch.equal(batch[0], batch[3])
    assert torch.equal(uniform(seeds, steps, 10), batch[:, :10])  # column j never depends on n


def test_uniform_rejects_mismatched_shapes() -> None:
    with pytest.raises(ValueError):
        uniform(torch.zeros(3, dtype=torch.int64), torch.zeros(2, dtype=torch.int64), 4)


# ---------------------------------------------------------------- SamplingTensors


def test_from_params_packs_rows_and_flags() -> None:
    params = [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.5, top_k=10, top_p=0.9, repetition_penalty=1.2),
        SamplingParams(top_k=1000),
    ]
    t = _tensors(params, [1, 2, 3], [0, 4, 8], vocab=100)
    assert t.temperature.tolist() == [0.0, 0.5, 1.0]
    assert t.top_k.tolist() == [100, 10, 100]
    assert t.top_p.tolist() == pytest.approx([1.0, 0.9, 1.0])
    assert t.repetition_penalty.tolist() == pytest.approx([1.0, 1.2, 1.0])
    assert (t.seeds.tolist(), t.steps.tolist()) == ([1, 2, 3], [0, 4, 8])
    assert t.temperature.dtype == torch.float32 and t.top_k.dtype == torch.int64
    assert (t.all_greedy, t.any_top_k_or_p, t.any_penalty) == (False, True, True)


def test_flags_ignore_filters_on_greedy_rows_and_keep_penalty() -> None:
    params = [SamplingParams(temperature=0, top_k=5, top_p=0.5, repetition_penalty=1.3)]
    t = _tensors(params, [0], [0], vocab=50)
    assert (t.all_greedy, t.any_top_k_or_p, t.any_penalty) == (True, False, True)
    plain = _tensors([SamplingParams(), SamplingParams(top_k=50)], [0, 1], [0, 0], vocab=50)
    assert (plain.all_greedy, plain.any_top_k_or_p, plain.any_penalty) == (False, False, False)


def test_from_params_rejects_length_mismatch() -> None:
    with pytest.raises(ValueError):
        _tensors([SamplingParams()], [1, 2], [0], vocab=10)


# ---------------------------------------------------------------- greedy and degenerate filters


def test_greedy_is_argmax() -> None:
    logits = _random_logits(16, 1000, seed=0)
    t = _tensors([SamplingParams(temperature=0)] * 16, list(range(16)), [0] * 16, 1000)
    assert torch.equal(sample(logits, t), logits.argmax(-1))


def test_greedy_rows_are_argmax_in_a_mixed_batch() -> None:
    logits = _random_logits(8, 500, seed=1, scale=0.1)
    params = [SamplingParams(temperature=0 if b % 2 else 1.0, top_k=50 if b % 4 == 0 else None) for b in range(8)]
    argmax = logits.argmax(-1)
    sampled_rows = set()
    for step in range(20):
        tokens = sample(logits, _tensors(params, list(range(8)), [step] * 8, 500))
        assert torch.equal(tokens[1::2], argmax[1::2])
        sampled_rows.add(tuple(tokens[::2].tolist()))
    assert len(sampled_rows) > 1


@pytest.mark.parametrize("params", [SamplingParams(temperature=0), SamplingParams(temperature=0.8, top_k=20),
                                    SamplingParams(temperature=0, repetition_penalty=1.3)])
def test_half_precision_logits_sample_as_their_float32_widening(params: SamplingParams) -> None:
    logits = _random_logits(8, 300, seed=3).to(torch.bfloat16)
    t = _tensors([params] * 8, list(range(8)), [5] * 8, 300)
    seen = torch.zeros(8, 300, dtype=torch.bool)
    seen[:, :40] = True
    assert torch.equal(sample(logits, t, seen), sample(logits.float(), t, seen))


def test_greedy_ties_take_the_lowest_id() -> None:
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0]])
    assert sample(logits, _tensors([SamplingParams(temperature=0)], [0], [0], 4)).tolist() == [1]


@pytest.mark.parametrize("params", [SamplingParams(top_k=1), SamplingParams(top_p=1e-6)])
def test_top_k_one_and_tiny_top_p_are_argmax(params: SamplingParams) -> None:
    logits = _random_logits(64, 300, seed=2, scale=0.5)
    for step in range(5):
        t = _tensors([params] * 64, list(range(64)), [step] * 64, 300)
        assert torch.equal(sample(logits, t), logits.argmax(-1))


# ---------------------------------------------------------------- transformers parity


def _assert_support_matches_hf(logits: torch.Tensor, k: int, p: float, slack: float) -> None:
    """Our kept set equals transformers' up to ties at the cut and (with slack > 0) rounding of 1 - top_p.

    transformers may keep part of a group of equal logits at the top-p cut; we keep all of it, so ours
    may add tokens whose logit equals the smallest one transformers kept, and nothing else.
    """
    b, v = logits.shape
    ours = torch.isfinite(filter_top_k_top_p(logits, torch.full((b,), k), torch.full((b,), p)))
    for row in range(b):
        x = logits[row : row + 1]
        narrow = torch.isfinite(_hf_filter(x, k, max(p - slack, 1e-9)))[0]
        wide = torch.isfinite(_hf_filter(x, k, min(p + slack, 1.0)))[0]
        cut = x[0][wide].min()
        assert not (narrow & ~ours[row]).any(), f"row {row}: dropped a token transformers keeps"
        assert not (ours[row] & (x[0] < cut)).any(), f"row {row}: kept a token transformers drops"
        assert torch.equal(ours[row], x[0] >= x[0][ours[row]].min()), "kept set is not a logit threshold"


@settings(max_examples=300, deadline=None)
@given(
    b=st.integers(1, 4),
    v=st.integers(1, 80),
    seed=st.integers(0, 2**31),
    k_frac=st.floats(0, 1.2),
    p_256=st.integers(1, 256),
    quantum=st.sampled_from([0.0, 0.5, 2.0]),
    scale=st.sampled_from([0.1, 1.0, 8.0]),
)
def test_top_k_top_p_support_equals_transformers_exact_top_p(
    b: int, v: int, seed: int, k_frac: float, p_256: int, quantum: float, scale: float
) -> None:
    # top_p = n/256 makes 1 - top_p exact in float32 and float64, so not even rounding may differ.
    k = max(1, round(k_frac * v))
    _assert_support_matches_hf(_random_logits(b, v, seed, scale, quantum), k, p_256 / 256, slack=0.0)


@settings(max_examples=300, deadline=None)
@given(
    b=st.integers(1, 4),
    v=st.integers(1, 80),
    seed=st.integers(0, 2**31),
    k=st.one_of(st.none(), st.integers(1, 100)),
    p=st.floats(1e-4, 1.0),
    quantum=st.sampled_from([0.0, 0.5]),
)
def test_top_k_top_p_support_equals_transformers_any_top_p(
    b: int, v: int, seed: int, k: int | None, p: float, quantum: float
) -> None:
    # An arbitrary top_p may round differently in float32 (ours) and float64 (theirs): allow 1e-6 of slack.
    logits = _random_logits(b, v, seed, 2.0, quantum)
    _assert_support_matches_hf(logits, v if k is None else k, p, slack=1e-6)


@settings(max_examples=200, deadline=None)
@given(b=st.integers(1, 4), v=st.integers(1, 60), seed=st.integers(0, 2**31), k=st.integers(1, 70))
def test_top_k_alone_equals_transformers_including_ties(b: int, v: int, seed: int, k: int) -> None:
    logits = _random_logits(b, v, seed, 2.0, quantum=0.5)
    ours = filter_top_k_top_p(logits, torch.full((b,), k), torch.ones(b))
    assert torch.equal(ours, TopKLogitsWarper(k)(None, logits))  # type: ignore[arg-type]


def test_filters_respect_per_row_parameters() -> None:
    logits = _random_logits(3, 40, seed=3)
    out = filter_top_k_top_p(logits, torch.tensor([40, 5, 40]), torch.tensor([1.0, 1.0, 0.3]))
    kept = torch.isfinite(out).sum(-1).tolist()
    assert kept[0] == 40 and kept[1] == 5 and 1 <= kept[2] < 40
    assert torch.equal(out[torch.isfinite(out)], logits[torch.isfinite(out)])


@settings(max_examples=200, deadline=None)
@given(
    b=st.integers(1, 4),
    v=st.integers(2, 50),
    length=st.integers(1, 30),
    seed=st.integers(0, 2**31),
    penalty=st.floats(0.1, 5.0),
)
def test_repetition_penalty_equals_transformers(b: int, v: int, length: int, seed: int, penalty: float) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.round(torch.randn(b, v, generator=g) * 4)  # integers: zeros and negatives included
    ids = torch.randint(0, v, (b, length), generator=g)
    seen = torch.zeros(b, v, dtype=torch.bool).scatter_(1, ids, True)
    ours = apply_repetition_penalty(logits, seen, torch.full((b,), penalty))
    theirs = RepetitionPenaltyLogitsProcessor(penalty)(ids, logits.clone())
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=0)


def test_repetition_penalty_is_per_row_and_steers_greedy() -> None:
    logits = torch.tensor([[2.0, 1.9, -1.0], [2.0, 1.9, -1.0]])
    seen = torch.tensor([[True, False, True], [True, False, True]])
    params = [SamplingParams(temperature=0, repetition_penalty=1.5), SamplingParams(temperature=0)]
    t = _tensors(params, [0, 0], [0, 0], 3)
    assert sample(logits, t, seen).tolist() == [1, 0]
    out = apply_repetition_penalty(logits, seen, t.repetition_penalty)
    torch.testing.assert_close(out, torch.tensor([[2.0 / 1.5, 1.9, -1.5], [2.0, 1.9, -1.0]]))


def test_penalty_without_seen_mask_is_an_error() -> None:
    t = _tensors([SamplingParams(repetition_penalty=1.1)], [0], [0], 4)
    with pytest.raises(ValueError, match="seen"):
        sample(torch.zeros(1, 4), t)


# ---------------------------------------------------------------- distribution


_V8_LOGITS = torch.tensor([1.2, -0.3, 0.0, 2.1, 0.7, -1.5, 1.9, 0.4])
_DRAWS = 20_000


def _draw_many(params: SamplingParams, seeds: list[int], steps: list[int]) -> torch.Tensor:
    logits = _V8_LOGITS.expand(len(seeds), 8).contiguous()
    tokens = sample(logits, _tensors([params] * len(seeds), seeds, steps, 8))
    return torch.bincount(tokens, minlength=8)


@pytest.mark.parametrize("temperature", [1.0, 0.6, 1.7])
def test_sampled_distribution_matches_softmax_over_seeds(temperature: float) -> None:
    counts = _draw_many(SamplingParams(temperature=temperature), list(range(_DRAWS)), [0] * _DRAWS)
    assert _chi2_p_value(counts, torch.softmax(_V8_LOGITS / temperature, -1)) > P_VALUE_FLOOR


def test_sampled_distribution_matches_softmax_over_steps_of_one_seed() -> None:
    counts = _draw_many(SamplingParams(temperature=0.9), [2024] * _DRAWS, list(range(_DRAWS)))
    assert _chi2_p_value(counts, torch.softmax(_V8_LOGITS / 0.9, -1)) > P_VALUE_FLOOR


@pytest.mark.parametrize("top_k, top_p", [(3, 1.0), (None, 0.7), (5, 0.8)])
def test_filtered_distribution_matches_renormalised_softmax(top_k: int | None, top_p: float) -> None:
    params = SamplingParams(temperature=1.3, top_k=top_k, top_p=top_p)
    counts = _draw_many(params, list(range(10**6, 10**6 + _DRAWS)), [5] * _DRAWS)
    expected = torch.softmax(_hf_filter((_V8_LOGITS / 1.3)[None], top_k, top_p)[0], -1)
    assert int(counts[expected == 0].sum()) == 0
    assert _chi2_p_value(counts, expected) > P_VALUE_FLOOR


def test_sampled_tokens_stay_inside_the_top_k_set_on_a_large_vocab() -> None:
    logits = _random_logits(1, 3000, seed=4, scale=0.3).expand(1000, 3000)
    tokens = sample(logits, _tensors([SamplingParams(top_k=7)] * 1000, list(range(1000)), [0] * 1000, 3000))
    assert set(tokens.tolist()) == set(logits[0].topk(7).indices.tolist())


# ---------------------------------------------------------------- determinism and batch independence


def test_same_seed_and_step_give_the_same_token() -> None:
    logits = _random_logits(1, 1000, seed=5, scale=0.2)
    params = [SamplingParams(temperature=1.0, top_p=0.95)]
    first = [int(sample(logits, _tensors(params, [77], [s], 1000))) for s in range(30)]
    again = [int(sample(logits.clone(), _tensors(params, [77], [s], 1000))) for s in range(30)]
    assert first == again
    assert len(set(first)) > 10  # steps get fresh noise


def _neighbours(vocab: int) -> list[SamplingParams]:
    return [
        SamplingParams(temperature=0),
        SamplingParams(temperature=0.3, top_k=2),
        SamplingParams(temperature=1.5, top_p=0.5),
        SamplingParams(repetition_penalty=1.8),
        SamplingParams(temperature=0.7, top_k=vocab // 2, top_p=0.9, repetition_penalty=0.7),
        SamplingParams(temperature=2.0),
        SamplingParams(temperature=0, repetition_penalty=1.2),
        SamplingParams(top_k=1),
    ]


@pytest.mark.parametrize(
    "target",
    [SamplingParams(temperature=0.9), SamplingParams(temperature=1.1, top_k=40, top_p=0.8)],
    ids=["plain", "filtered"],
)
def test_a_rows_token_does_not_depend_on_its_batch(target: SamplingParams) -> None:
    vocab = 300
    g = torch.Generator().manual_seed(6)
    target_logits = torch.randn(vocab, generator=g) * 0.5
    target_seen = torch.rand(vocab, generator=g) < 0.1
    others = _neighbours(vocab)
    other_logits = torch.randn(len(others), vocab, generator=g)
    other_seen = torch.rand(len(others), vocab, generator=g) < 0.2
    tokens = set()
    for seed in range(40):
        alone = sample(
            target_logits[None], _tensors([target], [seed], [11], vocab), target_seen[None]
        )
        tokens.add(int(alone))
        for row in (0, 3, len(others)):
            params = [*others[:row], target, *others[row:]]
            seeds = [1000 + i for i in range(len(others))]
            steps = [i * 3 for i in range(len(others))]
            logits = torch.cat([other_logits[:row], target_logits[None], other_logits[row:]])
            seen = torch.cat([other_seen[:row], target_seen[None], other_seen[row:]])
            t = _tensors(params, [*seeds[:row], seed, *seeds[row:]], [*steps[:row], 11, *steps[row:]], vocab)
            assert int(sample(logits, t, seen)[row]) == int(alone), f"seed {seed}, row {row}"
    assert len(tokens) > 5  # the token really depends on the seed


# ---------------------------------------------------------------- CUDA


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_replays_in_a_cuda_graph() -> None:
    vocab, b = 4096, 16
    params = [SamplingParams(temperature=0.8 + 0.05 * i, top_k=50 if i % 3 else None, top_p=0.9) for i in range(b)]
    params[0] = SamplingParams(temperature=0)
    logits = _random_logits(b, vocab, seed=8)
    seeds, steps = [3 * i + 1 for i in range(b)], [i for i in range(b)]
    cpu_t = _tensors(params, seeds, steps, vocab)
    gpu_t = SamplingTensors.from_params(params, seeds, steps, vocab, "cuda")
    assert torch.equal(uniform(gpu_t.seeds, gpu_t.steps, vocab).cpu(), uniform(cpu_t.seeds, cpu_t.steps, vocab))
    expected = sample(logits, cpu_t)
    assert torch.equal(sample(logits.cuda(), gpu_t).cpu(), expected)

    static_logits = logits.cuda()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        sample(static_logits, gpu_t)  # warm up outside capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_out = sample(static_logits, gpu_t)
    for step in range(3):
        gpu_t.steps.copy_(torch.tensor([s + step for s in steps]))
        graph.replay()
        eager = sample(logits, _tensors(params, seeds, [s + step for s in steps], vocab))
        assert torch.equal(static_out.cpu(), eager)


def test_vanishing_temperature_decodes_greedily() -> None:
    logits = torch.tensor([[1.0, 5.0, 3.0, -2.0]])
    for temperature in (1e-45, 1e-40, 1e-6):
        params = SamplingParams(temperature=temperature, top_p=0.9)
        assert params.greedy
        assert int(sample(logits, _tensors([params], [1], [0], 4))[0]) == 1


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 4), vocab=st.sampled_from([7, 256, 320, 1000, 4096, 128256 // 64]),
       seed=st.integers(0, 2**31), levels=st.integers(1, 50))
def test_argmax_rows_equals_torch_argmax_with_ties(rows: int, vocab: int, seed: int, levels: int) -> None:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, levels, (rows, vocab), generator=g).float()  # few levels: many tied maxima
    assert torch.equal(argmax_rows(logits), logits.argmax(dim=-1))
