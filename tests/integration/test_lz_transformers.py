"""attn_implementation="layerzero" in transformers gives sdpa's logits (fp32) on tiny Llama and Gemma 3 models."""

from __future__ import annotations

import pytest
import torch
from checkpoints import tiny_hf_model
from transformers import AttentionInterface
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask, sliding_window_causal_mask_function

import layerzero.extend.transformers as lz_hf

VOCAB = 320


@pytest.fixture(scope="module", autouse=True)
def _registered() -> None:
    lz_hf.register()


@pytest.fixture
def lz_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int | None]]:
    """Records every lz attention call the integration makes (op, sliding_window)."""
    calls: list[tuple[str, int | None]] = []
    for name in ("attention", "varlen_attention"):
        real = getattr(lz_hf.lz, name)

        def spy(*args, _real=real, _name=name, **kwargs):
            calls.append((_name, kwargs.get("sliding_window")))
            return _real(*args, **kwargs)

        monkeypatch.setattr(lz_hf.lz, name, spy)
    return calls


def _logits(model, impl: str, **inputs) -> torch.Tensor:
    model.set_attn_implementation(impl)
    with torch.no_grad():
        return model(**inputs).logits


def test_register_adds_attention_and_mask_functions() -> None:
    assert AttentionInterface._global_mapping["layerzero"] is lz_hf.layerzero_attention
    assert AttentionMaskInterface._global_mapping["layerzero"] is lz_hf.layerzero_mask


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_logits_match_sdpa(family: str, lz_calls) -> None:
    model = tiny_hf_model(family)
    ids = torch.randint(0, VOCAB, (2, 13), generator=torch.Generator().manual_seed(1))
    want = _logits(model, "sdpa", input_ids=ids)
    got = _logits(model, "layerzero", input_ids=ids)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert [op for op, _ in lz_calls] == ["attention"] * model.config.num_hidden_layers
    if family == "gemma3":  # 13 tokens > window 6: the sliding layers really are windowed
        assert [w for _, w in lz_calls] == [6, None, 6]


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_padded_batch_matches_sdpa_on_real_tokens(family: str, lz_calls) -> None:
    model = tiny_hf_model(family)
    ids = torch.randint(0, VOCAB, (3, 12), generator=torch.Generator().manual_seed(2))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # left padding
    mask[2, 9:] = 0  # right padding
    want = _logits(model, "sdpa", input_ids=ids, attention_mask=mask)
    got = _logits(model, "layerzero", input_ids=ids, attention_mask=mask)
    real = mask.bool()
    torch.testing.assert_close(got[real], want[real], rtol=1e-5, atol=1e-5)
    assert {op for op, _ in lz_calls} == {"varlen_attention"}


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_generate_with_cache_matches_sdpa(family: str, lz_calls) -> None:
    model = tiny_hf_model(family)
    ids = torch.randint(1, VOCAB, (2, 7), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    outs = {}
    for impl in ("sdpa", "layerzero"):
        model.set_attn_implementation(impl)
        outs[impl] = model.generate(
            input_ids=ids, attention_mask=mask, max_new_tokens=9, do_sample=False, pad_token_id=0,
            return_dict_in_generate=True, output_logits=True,
        )
    assert torch.equal(outs["layerzero"].sequences, outs["sdpa"].sequences)
    for got, want in zip(outs["layerzero"].logits, outs["sdpa"].logits, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(lz_calls) == 9 * model.config.num_hidden_layers  # prefill + 8 decode steps, every layer


def test_analyze_reduces_padding_and_window() -> None:
    pad = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1]], dtype=torch.bool)
    full = sdpa_mask(batch_size=2, q_length=3, kv_length=7, q_offset=4, mask_function=sliding_window_causal_mask_function(5),
                     attention_mask=pad, local_size=5, allow_is_causal_skip=False)
    mask = lz_hf.analyze(full, 5)
    assert mask.causal and mask.window == 5
    assert mask.packing.host_q == [0, 3, 6] and mask.packing.host_k == [0, 5, 12]
    assert mask.packing.rows_k.tolist() == [2, 3, 4, 5, 6, *range(7, 14)]


def test_unrepresentable_masks_raise() -> None:
    packed = torch.block_diag(torch.ones(3, 3), torch.ones(2, 2)).bool().tril().view(1, 1, 5, 5)
    with pytest.raises(NotImplementedError, match="sdpa"):
        lz_hf.analyze(packed, None)
    q = torch.randn(1, 2, 4, 8)
    bias = torch.randn(1, 1, 4, 4)
    with pytest.raises(NotImplementedError, match="bias"):
        lz_hf.layerzero_attention(torch.nn.Module(), q, q, q, bias)
    with pytest.raises(NotImplementedError, match="dropout"):
        lz_hf.layerzero_attention(torch.nn.Module(), q, q, q, None, dropout=0.1)


def test_user_supplied_4d_masks() -> None:
    q, k = torch.randn(2, 4, 5, 8), torch.randn(2, 2, 5, 8)
    module = torch.nn.Module()
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    want = torch.nn.functional.scaled_dot_product_attention(q, k, k, is_causal=True, scale=0.3, enable_gqa=True)
    additive = torch.zeros(2, 1, 5, 5).masked_fill(~causal, torch.finfo(torch.float32).min)
    for mask in (causal.expand(2, 1, 5, 5), additive):
        out, weights = lz_hf.layerzero_attention(module, q, k, k, mask, scaling=0.3)
        assert weights is None
        torch.testing.assert_close(out, want.transpose(1, 2), rtol=1e-5, atol=1e-5)
