"""verify(): greedy runs and corrections, rows without drafts sample exactly as sample(), and lossless sampling
(chi-square on the joint law of the first three tokens of a toy Markov model, with a planted-bug negative check)."""

from __future__ import annotations

import pytest
import torch

import infer.sampling.speculative as speculative
from infer.sampling.params import SamplingParams
from infer.sampling.sampler import SamplingTensors, sample
from infer.sampling.speculative import draft_sample, verify

V = 6


def tensors(rows: int, temperature: float, seeds: torch.Tensor | None = None, steps: torch.Tensor | None = None,
            top_k: int | None = None) -> SamplingTensors:
    params = [SamplingParams(temperature=temperature, top_k=top_k)] * rows
    seeds_list = seeds.tolist() if seeds is not None else list(range(rows))
    steps_list = steps.tolist() if steps is not None else [0] * rows
    return SamplingTensors.from_params(params, seeds_list, steps_list, V, "cpu")


def test_greedy_accepts_the_leading_run_then_the_targets_token() -> None:
    logits = torch.full((3, 4, V), -5.0)
    best = torch.tensor([[1, 2, 3, 4], [1, 2, 3, 4], [5, 0, 0, 0]])
    logits.scatter_(2, best[..., None], 5.0)
    drafts = torch.tensor([[1, 2, 0], [1, 2, 3], [0, 0, 0]])
    num = torch.tensor([3, 3, 0])
    tokens, counts = verify(logits, drafts, num, tensors(3, 0.0))
    assert counts.tolist() == [3, 4, 1]
    assert tokens[0, :3].tolist() == [1, 2, 3]  # drafts 1, 2 accepted; 0 rejected for the target's 3
    assert tokens[1].tolist() == [1, 2, 3, 4]  # all accepted, plus the bonus token
    assert tokens[2, :1].tolist() == [5]


def test_drafts_past_a_rows_count_are_ignored() -> None:
    logits = torch.zeros(1, 3, V)
    logits[0, :, 2] = 1.0
    tokens, counts = verify(logits, torch.tensor([[2, 2]]), torch.tensor([1]), tensors(1, 0.0))
    assert counts.tolist() == [2] and tokens[0, :2].tolist() == [2, 2]


@pytest.mark.parametrize("temperature,top_k", [(0.7, None), (1.3, 3)])
def test_a_row_without_drafts_samples_exactly_as_sample(temperature: float, top_k: int | None) -> None:
    torch.manual_seed(0)
    logits = torch.randn(64, 3, V)
    t = tensors(64, temperature, top_k=top_k, steps=torch.arange(64) * 7)
    tokens, counts = verify(logits, torch.zeros(64, 2, dtype=torch.int64), torch.zeros(64, dtype=torch.int64), t)
    assert counts.tolist() == [1] * 64
    assert torch.equal(tokens[:, 0], sample(logits[:, 0].contiguous(), t))


# --- lossless sampling ---------------------------------------------------------------------------------------
# A toy target: a Markov chain over V tokens, logits = TARGET[previous token]. Drafts: the drafter's own chain
# (QTABLE, sampled) or a fixed one-hot guess (n-gram style). Exact joint law of 3 tokens is known in closed form.

GEN = torch.Generator().manual_seed(1234)
TARGET = torch.randn(V, V, generator=GEN) * 1.5
QTABLE = torch.randn(V, V, generator=GEN)
K = 3
N = 120_000


def _joint(p: torch.Tensor, start: int) -> torch.Tensor:
    out = torch.zeros(V, V, V, dtype=torch.float64)
    for a in range(V):
        for b in range(V):
            out[a, b] = p[start, a] * p[a, b] * p[b]
    return out


def speculative_samples(seed: int, drafter: str, start: int = 0) -> torch.Tensor:
    """The first 3 tokens of N independent seeded requests, produced by rounds of draft + verify."""
    seeds = torch.randint(0, 2**62, (N,), generator=torch.Generator().manual_seed(seed))
    out = torch.full((N, 3), -1, dtype=torch.int64)
    have = torch.zeros(N, dtype=torch.int64)
    last = torch.full((N,), start, dtype=torch.int64)
    rng = torch.Generator().manual_seed(seed + 1)
    while bool((have < 3).any()):
        rows = (have < 3).nonzero().squeeze(1)
        n = rows.shape[0]
        q = None
        if drafter == "model":  # sample drafts from the drafter's chain, keep its distributions
            drafts = torch.empty(n, K, dtype=torch.int64)
            q = torch.empty(n, K, V)
            prev = last[rows]
            for j in range(K):
                q[:, j] = QTABLE[prev].softmax(-1)
                prev = torch.multinomial(q[:, j], 1, generator=rng).squeeze(1)
                drafts[:, j] = prev
        else:  # a fixed guess, as prompt lookup proposes: one-hot q
            drafts = torch.tensor([[2, 2, 1]]).expand(n, K).clone()
        inputs = torch.cat([last[rows, None], drafts], dim=1)
        logits = TARGET[inputs]  # position j scores the token after input j
        t = tensors(n, 1.0, seeds=seeds[rows], steps=have[rows])
        tokens, counts = verify(logits, drafts, torch.full((n,), K), t, draft_probs=q)
        for j in range(K + 1):
            take = (counts > j) & (have[rows] + j < 3)
            out[rows[take], have[rows[take]] + j] = tokens[take, j]
        last[rows] = tokens.gather(1, (counts - 1)[:, None]).squeeze(1)
        have[rows] = have[rows] + counts
    return out


def chi_square_p(samples: torch.Tensor, expected: torch.Tensor) -> float:
    index = samples[:, 0] * V * V + samples[:, 1] * V + samples[:, 2]
    observed = torch.bincount(index, minlength=V**3).double()
    want = expected.reshape(-1) * samples.shape[0]
    keep = want >= 5  # the usual validity rule; the rest pooled into one cell
    stat = ((observed[keep] - want[keep]) ** 2 / want[keep]).sum()
    rest_o, rest_w = observed[~keep].sum(), want[~keep].sum()
    cells = int(keep.sum())
    if rest_w > 0:
        stat += (rest_o - rest_w) ** 2 / rest_w
        cells += 1
    return float(torch.special.gammaincc(torch.tensor((cells - 1) / 2, dtype=torch.float64), stat / 2))


@pytest.mark.parametrize("drafter", ["ngram", "model"])
@pytest.mark.parametrize("seed", [11, 22, 33])
def test_speculative_sampling_matches_the_targets_joint_law(drafter: str, seed: int) -> None:
    samples = speculative_samples(seed, drafter)
    assert chi_square_p(samples, _joint(TARGET.double().softmax(-1), 0)) > 1e-3


def test_plain_sampling_matches_the_same_law() -> None:
    """The reference the test compares against is the one plain sampling follows (the toy law is right)."""
    seeds = torch.randint(0, 2**62, (N,), generator=torch.Generator().manual_seed(5))
    out, last = [], torch.zeros(N, dtype=torch.int64)
    for step in range(3):
        last = sample(TARGET[last], tensors(N, 1.0, seeds=seeds, steps=torch.full((N,), step)))
        out.append(last)
    assert chi_square_p(torch.stack(out, 1), _joint(TARGET.double().softmax(-1), 0)) > 1e-3


@pytest.mark.parametrize("drafter", ["ngram", "model"])
def test_the_test_catches_resampling_from_p_instead_of_the_residual(drafter: str, monkeypatch) -> None:
    monkeypatch.setattr(speculative, "residual", lambda p, q: p.clone())
    samples = speculative_samples(11, drafter)
    assert chi_square_p(samples, _joint(TARGET.double().softmax(-1), 0)) < 1e-6


def test_draft_sample_draws_from_the_q_it_returns():
    """The drafter's sampled tokens follow the q handed to `verify` (tempered, top-k filtered), over many seeds;
    greedy rows take the argmax."""
    vocab, n = 12, 40_000
    logits = torch.randn(1, vocab, generator=torch.Generator().manual_seed(3)).expand(n, vocab).contiguous()
    t = SamplingTensors.from_params([SamplingParams(temperature=0.7, top_k=6)] * n, list(range(n)), [5] * n, vocab, "cpu")
    tokens, q = draft_sample(logits, t, 2)
    assert q is not None and torch.allclose(q.sum(-1), torch.ones(n))
    counts = torch.bincount(tokens, minlength=vocab).double()
    expected = q[0].double() * n
    kept = expected > 0
    assert counts[~kept].sum() == 0  # nothing outside the top-k
    chi2 = (((counts - expected)[kept]) ** 2 / expected[kept]).sum().item()
    assert chi2 < 30.0, chi2  # 5 degrees of freedom: p ~ 1.5e-5
    greedy = SamplingTensors.from_params([SamplingParams(temperature=0)] * 2, [1, 2], [0, 0], vocab, "cpu")
    tokens, q = draft_sample(logits[:2], greedy, 0)
    assert q is None and tokens.tolist() == [int(logits[0].argmax())] * 2
