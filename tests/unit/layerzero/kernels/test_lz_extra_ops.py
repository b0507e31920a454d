"""Extra ops' references (sampling, quantize, tokenize) against float64 / naive references on fresh random inputs."""

from __future__ import annotations

import math

import pytest
import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

from layerzero.kernels.reference.quantize import dequantize, quantize
from layerzero.kernels.reference.sampling import sample_topk, sample_topp
from layerzero.kernels.reference.tokenize import cached_identity, detokenize, tokenize, tokenizer_identity
from layerzero.select.context import SelectionContext


# -- sampling ------------------------------------------------------------------------------------------------

def _naive_draw(row: list[float], u: list[float], keep: set[int], temperature: float) -> int:
    return max(keep, key=lambda j: row[j] / temperature - math.log(-math.log(u[j])))


def _naive_topk(row: list[float], k: int) -> set[int]:
    kth = sorted(row, reverse=True)[min(k, len(row)) - 1]
    return {j for j, v in enumerate(row) if v >= kth}


def _naive_topp(row: list[float], p: float, temperature: float) -> set[int]:
    scaled = [v / temperature for v in row]
    top = max(scaled)
    weights = [math.exp(v - top) for v in scaled]
    total = sum(weights)
    order = sorted(range(len(row)), key=lambda j: -scaled[j])
    keep, mass = set(), 0.0
    for j in order:
        if mass < p:  # kept while the mass of strictly more likely tokens is below p
            keep.add(j)
        mass += weights[j] / total
    return keep


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_sample_topk_matches_naive_gumbel_max(dtype):
    logits = (torch.randn(6, 40) * 3).to(dtype)
    noise = torch.rand(6, 40).clamp_(1e-6, 1 - 1e-6)
    for k, temperature in ((1, 1.0), (5, 0.7), (40, 1.3), (100, 2.0)):
        got = sample_topk(logits, k, temperature=temperature, noise=noise)
        assert got.dtype == torch.int64 and got.shape == (6,)
        for b in range(6):
            row = logits[b].double().tolist()
            assert got[b].item() == _naive_draw(row, noise[b].double().tolist(), _naive_topk(row, k), temperature)


def test_sample_topp_matches_naive_gumbel_max():
    logits = torch.randn(8, 30) * 2
    noise = torch.rand(8, 30).clamp_(1e-6, 1 - 1e-6)
    for p, temperature in ((0.05, 1.0), (0.5, 0.8), (0.9, 1.0), (1.0, 1.5)):
        got = sample_topp(logits, p, temperature=temperature, noise=noise)
        for b in range(8):
            row = logits[b].double().tolist()
            keep = _naive_topp(row, p, temperature)
            assert got[b].item() == _naive_draw(row, noise[b].double().tolist(), keep, temperature)


def test_sampling_is_deterministic_given_a_generator_and_follows_the_filtered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5, 0.0, -1.0, -3.0]])
    draws = [sample_topk(logits, 3, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    again = [sample_topk(logits, 3, generator=torch.Generator().manual_seed(s)) for s in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(draws, again))
    expected = torch.softmax(logits[0, :3].double(), dim=0)

    many = logits.expand(20000, 6)
    topk = sample_topk(many, 3, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(topk, minlength=6).double() / 20000
    assert freq[3:].sum() == 0 and torch.allclose(freq[:3], expected, atol=0.015)

    probs = torch.softmax(logits[0].double(), dim=0)
    p = float(probs[:2].sum()) + 1e-3  # needs the third token too
    topp = sample_topp(many, p, generator=torch.Generator().manual_seed(1))
    freq = torch.bincount(topp, minlength=6).double() / 20000
    assert freq[3:].sum() == 0 and torch.allclose(freq[:3], expected, atol=0.015)


def test_sampling_keeps_leading_dims_and_rejects_bad_arguments():
    logits = torch.randn(2, 3, 11)
    assert sample_topk(logits, 4).shape == (2, 3) and sample_topp(logits, 0.7).shape == (2, 3)
    assert torch.equal(sample_topk(logits, 1, noise=torch.rand(2, 3, 11)), logits.argmax(-1))
    assert torch.equal(sample_topp(logits, 1e-9, noise=torch.rand(2, 3, 11)), logits.argmax(-1))
    for call in (lambda: sample_topk(logits, 0), lambda: sample_topk(logits, True), lambda: sample_topp(logits, 0.0),
                 lambda: sample_topp(logits, 1.5), lambda: sample_topk(logits, 2, temperature=0.0),
                 lambda: sample_topk(logits, 2, noise=torch.rand(3, 11))):
        with pytest.raises(ValueError):
            call()


# -- quantize ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_per_channel_symmetric_matches_float64(axis, dtype):
    x = (torch.randn(6, 20) * torch.rand(6, 1) * 5).to(dtype)
    x[2] = 0 if axis == 0 else x[2]
    q, scale = quantize(x, dtype="int8", axis=axis)
    dim = axis % 2
    assert q.dtype == torch.int8 and scale.shape == (x.shape[dim],) and scale.dtype == torch.float32
    x64 = x.double()
    amax = x64.abs().amax(dim=1 - dim)
    scale64 = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    assert torch.allclose(scale.double(), scale64, rtol=1e-6)
    shape = [1, 1]
    shape[dim] = -1
    ratio = x64 / scale64.reshape(shape)
    naive = torch.round(ratio)
    near_tie = (ratio - ratio.floor() - 0.5).abs() < 1e-4
    assert torch.equal(q.double()[~near_tie], naive[~near_tie])
    assert q.abs().max() <= 127 and (q.abs().amax(dim=1 - dim)[amax > 0] == 127).all()
    back = dequantize(q, scale, axis=axis, out_dtype=torch.float64)
    assert ((back - x64).abs() <= scale64.reshape(shape) / 2 * (1 + 1e-5)).all()


def test_int8_given_scale_is_used_and_checked():
    x = torch.randn(4, 8)
    q, scale = quantize(x, dtype="int8", scale=torch.full((4,), 0.01))
    assert torch.equal(scale, torch.full((4,), 0.01))
    assert torch.equal(q, (x / 0.01).round().clamp(-127, 127).to(torch.int8))
    with pytest.raises(ValueError, match="shape"):
        quantize(x, dtype="int8", scale=torch.ones(8))


def _e4m3_grid() -> torch.Tensor:
    values = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).double()
    return values[values.isfinite()].unique()


def test_fp8_e4m3_per_tensor_rounds_to_nearest_representable():
    x = torch.randn(32, 16) * 3
    x[0, 0] = 1e-6  # a subnormal after scaling
    q, scale = quantize(x, dtype="fp8_e4m3")
    assert q.dtype == torch.float8_e4m3fn and scale.shape == ()
    x64 = x.double()
    assert math.isclose(scale.item(), x64.abs().max().item() / 448, rel_tol=1e-6)
    ratio = (x64 / scale.double()).flatten()
    grid = _e4m3_grid()
    dist = (ratio[:, None] - grid[None, :]).abs()
    nearest = dist.min(dim=1)
    second = dist.topk(2, dim=1, largest=False).values[:, 1]
    clear = (second - nearest.values) > 1e-9 * (1 + ratio.abs())  # skip exact ties
    assert torch.equal(q.double().flatten()[clear], grid[nearest.indices][clear])
    assert q.double().abs().max() == 448
    back = dequantize(q, scale, out_dtype=torch.float64)
    normal = x64.abs() / scale.double() >= 2.0**-6
    assert ((back - x64).abs()[normal] <= x64.abs()[normal] * 2.0**-4).all()


def test_quantize_rejects_unknown_formats():
    with pytest.raises(ValueError, match="int8"):
        quantize(torch.randn(3), dtype="mxfp4")
    with pytest.raises(ValueError, match="scalar"):
        quantize(torch.randn(3), dtype="fp8_e4m3", scale=torch.ones(3))
    with pytest.raises(ValueError):
        dequantize(torch.ones(3), torch.ones(()))


# -- tokenize ------------------------------------------------------------------------------------------------

CORPUS = ["the quick brown fox jumps over the lazy dog", "layerzero picks kernels with reasons",
          "Tokenizers hash their vocab, merges and special tokens", "héllo wörld, naïve café"] * 5


def _tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", tok.token_to_id("<s>")), ("</s>", tok.token_to_id("</s>"))]
    )
    return tok


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return _tokenizer()


def test_tokenize_matches_the_tokenizer_and_round_trips(tok):
    texts = ["the lazy fox picks kernels", "naïve café", ""]
    out = tokenize(texts, tok)
    assert out == {"input_ids": [tok.encode(t).ids for t in texts]}
    single = tokenize(texts[0], tok, return_offsets=True)
    assert single["input_ids"] == tok.encode(texts[0]).ids and single["offsets"] == tok.encode(texts[0]).offsets
    assert tokenize(texts[0], tok, add_special_tokens=False)["input_ids"] == single["input_ids"][1:-1]
    assert detokenize(single["input_ids"], tok) == texts[0]
    assert detokenize(out["input_ids"], tok) == texts
    assert detokenize(torch.tensor(out["input_ids"][:1]), tok) == texts[:1]
    assert detokenize(single["input_ids"], tok, skip_special_tokens=False).startswith("<s>")


def test_tokenizer_identity_changes_exactly_with_what_changed(tok):
    base = tokenizer_identity(tok)
    assert all(len(v) == 64 and int(v, 16) >= 0 for v in base.to_dict().values())
    assert tokenizer_identity(Tokenizer.from_str(tok.to_str())) == base

    def changed(mutate) -> set[str]:
        other = Tokenizer.from_str(tok.to_str())
        mutate(other)
        new = tokenizer_identity(other).to_dict()
        return {name for name, value in base.to_dict().items() if new[name] != value}

    assert changed(lambda t: t.add_special_tokens(["<tool>"])) == {
        "tokenizer_id", "added_tokens_hash", "special_tokens_hash"}
    assert changed(lambda t: t.add_tokens(["kernelz"])) == {"tokenizer_id", "added_tokens_hash"}
    assert changed(lambda t: setattr(t, "normalizer", normalizers.Lowercase())) == {"tokenizer_id", "normalizer_id"}
    assert changed(lambda t: setattr(t, "pre_tokenizer", pre_tokenizers.Whitespace())) == {
        "tokenizer_id", "pretokenizer_id"}
    assert changed(lambda t: setattr(t, "post_processor", processors.TemplateProcessing(
        single="$A </s>", special_tokens=[("</s>", t.token_to_id("</s>"))]))) == {"tokenizer_id", "special_tokens_hash"}
    assert changed(lambda t: t.enable_truncation(8)) == {"tokenizer_id"}

    retrained = _tokenizer()
    trainer = trainers.BpeTrainer(vocab_size=280, special_tokens=["<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    retrained.train_from_iterator(CORPUS, trainer)
    other = tokenizer_identity(retrained)
    assert other.vocab_hash != base.vocab_hash and other.merges_hash != base.merges_hash


def test_cached_identity_sees_added_tokens_at_once_and_in_place_changes_within_ten_hits(tok):
    other = Tokenizer.from_str(tok.to_str())
    first = cached_identity(other)
    assert cached_identity(other) is first and first == tokenizer_identity(other)
    other.add_tokens(["kernelz"])
    assert cached_identity(other) == tokenizer_identity(other) != first
    other.normalizer = normalizers.Lowercase()
    fresh = tokenizer_identity(other)
    seen = [cached_identity(other) for _ in range(10)]
    assert seen[-1] == fresh and seen[0] != fresh  # stale until the scheduled re-validation (reference/tokenize.py)


def test_identity_feeds_the_selection_cache_key(tok):
    same = Tokenizer.from_str(tok.to_str())
    other = Tokenizer.from_str(tok.to_str())
    other.add_special_tokens(["<tool>"])
    ctx_a, ctx_same, ctx_b = (SelectionContext.from_tensors("tokenize", "text", t) for t in (tok, same, other))
    assert ctx_a.tokenizer_key and ctx_a.tokenizer_key == ctx_same.tokenizer_key != ctx_b.tokenizer_key
    assert ctx_a.validity_key() == ctx_same.validity_key() != ctx_b.validity_key()
