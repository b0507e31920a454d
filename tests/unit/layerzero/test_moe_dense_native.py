"""lz.fused_moe on the CPU over dense float32 and bfloat16 expert stacks (`native.fused_moe_cpu`) against the float64
definition on fresh random inputs: experts that receive no token, every token on the same experts, both activations,
a token's result alone equal to its result in a batch, and the shapes it declines (with the reason)."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import layerzero as lz
from layerzero.kernels.native import moe as native_moe
from test_moe_ops import moe_definition
from test_moe_quant_ops import routing

DTYPES = [torch.float32, torch.bfloat16]


def _stacks(experts: int, hidden: int, inner: int, dtype: torch.dtype, gen: torch.Generator):
    w13 = (torch.randn(experts, 2 * inner, hidden, generator=gen) * 0.1).to(dtype)
    w2 = (torch.randn(experts, hidden, inner, generator=gen) * 0.1).to(dtype)
    return w13, w2


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cpu_picks_the_native_kernel_for_whole_column_steps(dtype):
    gen = torch.Generator().manual_seed(0)
    w13, w2 = _stacks(4, 64, 32, dtype, gen)
    weights, ids = routing(3, 4, 2, gen)
    x = torch.randn(3, 64, generator=gen)
    assert lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"] == "native.fused_moe_cpu"
    w13, w2 = _stacks(4, 64, 24, dtype, gen)  # an intermediate of 24 is not whole 16-column steps
    assert lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"] == "reference.fused_moe"
    assert "whole 16-column steps" in str(lz.explain("fused_moe", x, w13, w2, weights, ids))
    w13, w2 = _stacks(4, 64, 32, dtype, gen)
    mixed = w2.float() if dtype == torch.bfloat16 else w2.bfloat16()  # one kernel form for both stacks only
    assert lz.which("fused_moe", x, w13, mixed, weights, ids)["kernel_id"] == "reference.fused_moe"
    assert "takes float32 or bfloat16 stacks" in str(lz.explain("fused_moe", x, w13, mixed, weights, ids))


@settings(max_examples=25, deadline=None)
@given(dtype=st.sampled_from(DTYPES), tokens=st.integers(1, 20), experts=st.integers(2, 10), k=st.integers(1, 3),
       hidden=st.sampled_from([16, 48, 64]), inner=st.sampled_from([16, 32, 80]), same=st.booleans(),
       activation=st.sampled_from(["silu", "gelu_tanh"]), seed=st.integers(0, 2**31))
def test_the_experts_sum_equals_the_definition(dtype, tokens, experts, k, hidden, inner, same, activation, seed):
    gen = torch.Generator().manual_seed(seed)
    k = min(k, experts)
    w13, w2 = _stacks(experts, hidden, inner, dtype, gen)
    weights, ids = routing(tokens, experts, k, gen, same)
    x = torch.randn(tokens, hidden, generator=gen)
    want = moe_definition(x, w13, w2, weights, ids, activation)  # the stored weights, exactly, in float64
    got = native_moe.fused_moe(x, w13, w2, weights, ids, activation=activation)
    assert got.dtype == torch.float32 and got.shape == x.shape
    assert (got.double() - want).abs().max().item() <= 2e-5 * (want.abs().max().item() + 1e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_token_alone_gets_the_bits_it_gets_in_a_batch(dtype):
    gen = torch.Generator().manual_seed(3)
    w13, w2 = _stacks(8, 64, 64, dtype, gen)
    weights, ids = routing(13, 8, 3, gen)
    x = torch.randn(13, 64, generator=gen)
    batch = lz.fused_moe(x, w13, w2, weights, ids)
    for t in (0, 6, 12):
        assert torch.equal(lz.fused_moe(x[t : t + 1], w13, w2, weights[t : t + 1], ids[t : t + 1]), batch[t : t + 1])


@pytest.mark.parametrize("dtype", DTYPES)
def test_experts_without_tokens_an_expert_taking_every_token_and_an_empty_batch(dtype):
    gen = torch.Generator().manual_seed(4)
    w13, w2 = _stacks(6, 32, 32, dtype, gen)
    ids = torch.tensor([[5, 0], [5, 0], [5, 2]])  # experts 1, 3 and 4 idle; expert 5 takes every token
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5], [0.9, 0.1]])
    x = torch.randn(3, 32, generator=gen)
    want = moe_definition(x, w13, w2, weights, ids, "silu")
    assert (lz.fused_moe(x, w13, w2, weights, ids).double() - want).abs().max() <= 2e-5 * want.abs().max()
    assert lz.fused_moe(x[:0], w13, w2, weights[:0], ids[:0]).shape == (0, 32)


def test_an_expert_id_out_of_range_is_an_error_not_a_read_past_the_stack():
    w13, w2 = _stacks(4, 32, 16, torch.float32, torch.Generator().manual_seed(5))
    with pytest.raises(ValueError, match=r"an expert id outside \[0, 4\)"):
        native_moe.fused_moe(torch.randn(1, 32), w13, w2, torch.ones(1, 1), torch.tensor([[4]]))
