"""lz.fused_moe_int4 and lz.fused_moe_w8 (experts kept 4-bit or 8-bit) against their definition in float64 on fresh
random inputs: the native CPU kernel and the reference, experts that receive no token, every token on the same
experts, both activations, a token's result alone equal to its result in a batch, and the errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

import layerzero as lz
from layerzero.kernels.native import moe as native_moe
from layerzero.kernels.reference import moe as reference
from test_moe_ops import moe_definition

GROUP = 32


def int4_stack(experts: int, n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(0, 256, (experts, n, k // 2), dtype=torch.uint8, generator=gen)
    scale = torch.rand(experts, n, k // GROUP, generator=gen) * 0.05
    offset = -8 * scale + torch.randn(experts, n, k // GROUP, generator=gen) * 0.01
    return q, torch.stack([scale, offset])


def int8_stack(experts: int, n: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    q = torch.randint(-127, 128, (experts, n, k), dtype=torch.int8, generator=gen)
    return q, torch.rand(experts, n, k // GROUP, generator=gen) * 0.004


def dense_int4(q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The float64 weights [E, N, K] of a 4-bit stack, element by element from the definition w = q * s + o."""
    values = torch.stack([q & 0xF, q >> 4], dim=-1).reshape(*q.shape[:2], -1).double()
    return values * scales[0].double().repeat_interleave(GROUP, -1) + scales[1].double().repeat_interleave(GROUP, -1)


def dense_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.double() * scale.double().repeat_interleave(GROUP, -1)


def routing(tokens: int, experts: int, k: int, gen: torch.Generator, same: bool = False):
    logits = torch.randn(tokens, experts, generator=gen)
    if same:
        logits = logits[:1].expand(tokens, -1).contiguous()
    return lz.moe_route(logits, k, renormalize=True)


FORMS = ["int4", "int8"]


def _call(form: str, x, w13, s13, w2, s2, weights, ids, activation: str = "silu", impl=None) -> torch.Tensor:
    if form == "int4":
        fn = impl.fused_moe_int4 if impl else lz.fused_moe_int4
        return fn(x, w13, s13, w2, s2, weights, ids, group_size=GROUP, activation=activation)
    fn = (impl.fused_moe_w8_int8 if impl is native_moe else impl.fused_moe_w8) if impl else lz.fused_moe_w8
    return fn(x, w13, s13, w2, s2, weights, ids, block_size=(1, GROUP), activation=activation)


def _stacks(form: str, experts: int, hidden: int, inner: int, gen: torch.Generator):
    make, dense = (int4_stack, dense_int4) if form == "int4" else (int8_stack, dense_int8)
    w13, s13 = make(experts, 2 * inner, hidden, gen)
    w2, s2 = make(experts, hidden, inner, gen)
    return (w13, s13, w2, s2), (dense(w13, s13), dense(w2, s2))


@pytest.mark.parametrize("form", FORMS)
def test_the_cpu_picks_the_native_kernel(form):
    gen = torch.Generator().manual_seed(0)
    stacks, _ = _stacks(form, 4, 64, 32, gen)
    weights, ids = routing(3, 4, 2, gen)
    op = "fused_moe_int4" if form == "int4" else "fused_moe_w8"
    kwargs = {"group_size": GROUP} if form == "int4" else {"block_size": (1, GROUP)}
    x = torch.randn(3, 64, generator=gen)
    assert lz.which(op, x, *stacks[:2], *stacks[2:], weights, ids, **kwargs)["kernel_id"].startswith("native.")


@settings(max_examples=25, deadline=None)
@given(form=st.sampled_from(FORMS), tokens=st.integers(1, 20), experts=st.integers(2, 10), k=st.integers(1, 3),
       hidden=st.sampled_from([32, 64, 96]), inner=st.sampled_from([32, 64]), same=st.booleans(),
       activation=st.sampled_from(["silu", "gelu_tanh"]), seed=st.integers(0, 2**31))
def test_the_experts_sum_equals_the_definition(form, tokens, experts, k, hidden, inner, same, activation, seed):
    gen = torch.Generator().manual_seed(seed)
    k = min(k, experts)
    stacks, (d13, d2) = _stacks(form, experts, hidden, inner, gen)
    weights, ids = routing(tokens, experts, k, gen, same)
    x = torch.randn(tokens, hidden, generator=gen)
    want = moe_definition(x, d13, d2, weights, ids, activation)
    scale = want.abs().max().item() + 1e-3
    for got in (_call(form, x, *stacks, weights, ids, activation), _call(form, x, *stacks, weights, ids, activation,
                                                                        impl=reference)):
        assert got.dtype == torch.float32 and got.shape == x.shape
        assert (got.double() - want).abs().max().item() <= 2e-5 * scale


@pytest.mark.parametrize("form", FORMS)
def test_a_token_alone_gets_the_bits_it_gets_in_a_batch(form):
    gen = torch.Generator().manual_seed(3)
    stacks, _ = _stacks(form, 8, 64, 64, gen)
    weights, ids = routing(13, 8, 3, gen)
    x = torch.randn(13, 64, generator=gen)
    batch = _call(form, x, *stacks, weights, ids)
    for t in (0, 6, 12):
        assert torch.equal(_call(form, x[t : t + 1], *stacks, weights[t : t + 1], ids[t : t + 1]), batch[t : t + 1])


@pytest.mark.parametrize("form", FORMS)
def test_experts_without_tokens_and_an_empty_batch(form):
    gen = torch.Generator().manual_seed(4)
    stacks, (d13, d2) = _stacks(form, 6, 32, 32, gen)
    ids = torch.tensor([[5, 0], [5, 0]])
    weights = torch.tensor([[0.75, 0.25], [0.5, 0.5]])
    x = torch.randn(2, 32, generator=gen)
    want = moe_definition(x, d13, d2, weights, ids, "silu")
    assert (_call(form, x, *stacks, weights, ids).double() - want).abs().max() <= 2e-5 * want.abs().max()
    empty = _call(form, x[:0], *stacks, weights[:0], ids[:0])
    assert empty.shape == (0, 32)


def test_an_expert_id_out_of_range_is_an_error_not_a_read_past_the_stack():
    gen = torch.Generator().manual_seed(5)
    stacks, _ = _stacks("int4", 4, 32, 32, gen)
    with pytest.raises(ValueError, match="expert id outside"):
        _call("int4", torch.randn(1, 32), *stacks, torch.ones(1, 1), torch.tensor([[4]]), impl=native_moe)


def test_misshapen_scales_are_refused_naming_them():
    gen = torch.Generator().manual_seed(6)
    w13, s13, w2, s2 = _stacks("int4", 4, 64, 32, gen)[0]
    weights, ids = routing(1, 4, 2, gen)
    with pytest.raises(ValueError, match="w2_scales"):
        lz.fused_moe_int4(torch.randn(1, 64), w13, s13, w2, s2[:, :, :, :0], weights, ids, group_size=GROUP)
    q13, c13, q2, c2 = _stacks("int8", 4, 64, 32, gen)[0]
    with pytest.raises(ValueError, match="w13_scale"):
        lz.fused_moe_w8(torch.randn(1, 64), q13, c13[:, :1], q2, c2, weights, ids, block_size=(1, GROUP))
    with pytest.raises(ValueError, match="activation"):
        lz.fused_moe_w8(torch.randn(1, 64), q13, c13, q2, c2, weights, ids, block_size=(1, GROUP), activation="relu")


def test_fp8_blocks_run_the_reference_and_explain_why_not_native():
    gen = torch.Generator().manual_seed(7)
    w13 = (torch.randn(3, 64, 128, generator=gen)).to(torch.float8_e4m3fn)
    w2 = (torch.randn(3, 128, 32, generator=gen)).to(torch.float8_e4m3fn)
    s13, s2 = torch.rand(3, 1, 1, generator=gen), torch.rand(3, 1, 1, generator=gen)
    weights, ids = routing(2, 3, 2, gen)
    x = torch.randn(2, 128, generator=gen)
    choice = lz.which("fused_moe_w8", x, w13, s13, w2, s2, weights, ids, block_size=(128, 128))
    assert choice["kernel_id"] == "reference.fused_moe_w8"
    d13 = w13.double() * s13.double()
    d2 = w2.double() * s2.double()
    want = moe_definition(x, d13, d2, weights, ids, "silu")
    got = lz.fused_moe_w8(x, w13, s13, w2, s2, weights, ids, block_size=(128, 128))
    assert (got.double() - want).abs().max() <= 2e-5 * want.abs().max()


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("tokens", [1, 2, 3])
def test_small_batches_with_an_expert_picked_twice(form, tokens):
    """Decode-sized calls, every phase shared by the threads: a token may route to one expert twice (its two results
    summed), and the bits do not depend on how many threads ran the call."""
    gen = torch.Generator().manual_seed(8 + tokens)
    stacks, (d13, d2) = _stacks(form, 6, 64, 64, gen)
    ids = torch.tensor([[2, 2, 5], [0, 2, 0], [4, 1, 3]])[:tokens]
    weights = torch.rand(tokens, 3, generator=gen)
    x = torch.randn(tokens, 64, generator=gen)
    want = moe_definition(x, d13, d2, weights, ids, "silu")
    got = _call(form, x, *stacks, weights, ids, impl=native_moe)
    assert (got.double() - want).abs().max().item() <= 2e-5 * (want.abs().max().item() + 1e-3)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = _call(form, x, *stacks, weights, ids, impl=native_moe)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(alone, got)
