"""lz.moe_route and lz.fused_moe against their definitions in float64 on fresh random inputs: experts that receive no
token, a batch whose every token picks the same experts, both scorings, renormalized or not, and each path (the
reference's loop over the experts that received tokens; the gathered batched matmuls CUDA graphs use for few pairs)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings, strategies as st

import layerzero as lz
from layerzero.kernels.reference.moe import fused_moe_gathered
from layerzero.select.signatures import MOE_GATHER_PAIRS


def route_definition(logits: torch.Tensor, k: int, renormalize: bool, scoring: str) -> tuple[torch.Tensor, torch.Tensor]:
    scores = logits.double().softmax(-1) if scoring == "softmax" else logits.double().sigmoid()
    weights, ids = scores.sort(dim=-1, descending=True, stable=True)
    weights, ids = weights[:, :k], ids[:, :k]
    return (weights / weights.sum(-1, keepdim=True) if renormalize else weights), ids


def moe_definition(x, w13, w2, weights, ids, activation: str) -> torch.Tensor:
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            gate, up = (w13[e].double() @ x[t].double()).chunk(2)
            act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate="tanh")
            out[t] += weights[t, j].double() * (w2[e].double() @ (act * up))
    return out


@settings(max_examples=30, deadline=None)
@given(tokens=st.integers(1, 40), experts=st.integers(2, 16), k=st.integers(1, 4), renormalize=st.booleans(),
       scoring=st.sampled_from(["softmax", "sigmoid"]), seed=st.integers(0, 2**31))
def test_route_picks_the_best_experts_with_their_weights(tokens, experts, k, renormalize, scoring, seed):
    k = min(k, experts)
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(seed)) * 3
    weights, ids = lz.moe_route(logits, k, renormalize=renormalize, scoring=scoring)
    want_w, want_ids = route_definition(logits, k, renormalize, scoring)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights.double(), want_w, atol=1e-6, rtol=1e-5)


@settings(max_examples=20, deadline=None)
@given(tokens=st.integers(1, 24), experts=st.integers(2, 16), k=st.integers(1, 4), hidden=st.integers(1, 48),
       seed=st.integers(0, 2**31))
def test_gate_routes_the_float32_logits_of_the_router(tokens, experts, k, hidden, seed):
    k = min(k, experts)
    gen = torch.Generator().manual_seed(seed)
    x, router = torch.randn(tokens, hidden, generator=gen).bfloat16(), torch.randn(experts, hidden, generator=gen)
    weights, ids = lz.moe_gate(x, router.bfloat16(), k, renormalize=True)
    logits = x.double() @ router.bfloat16().double().t()  # float32 sums of bf16 products: within float32 rounding
    top = logits.softmax(-1).sort(-1, descending=True).values[:, : k + 1]
    assume(bool((top.diff(dim=-1).abs() > 1e-5).all()))  # no near-ties, whose order float32 rounding may flip
    want_w, want_ids = route_definition(logits, k, True, "softmax")
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights.double(), want_w, atol=1e-5, rtol=1e-5)
    assert weights.dtype == torch.float32 and weights.shape == ids.shape == (tokens, k)
    with pytest.raises(ValueError, match="moe_gate expects"):
        lz.moe_gate(x, router[:, :-1] if hidden > 1 else torch.randn(experts, 2), k, renormalize=True)


@pytest.mark.parametrize("tokens", [1, 3, MOE_GATHER_PAIRS // 2, MOE_GATHER_PAIRS, 100])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_fused_moe_equals_its_definition(tokens: int, activation: str):
    gen = torch.Generator().manual_seed(tokens)
    experts, hidden, inner, k = 8, 24, 20, 2
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inner, hidden, generator=gen) * 0.2
    w2 = torch.randn(experts, hidden, inner, generator=gen) * 0.2
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, 5:] -= 100  # experts 5, 6 and 7 receive no token
    weights, ids = lz.moe_route(logits, k, renormalize=True)
    want = moe_definition(x, w13, w2, weights, ids, activation)
    got = lz.fused_moe(x, w13, w2, weights, ids, activation=activation)
    assert lz.which("fused_moe", x, w13, w2, weights, ids, activation=activation)["kernel_id"] == "reference.fused_moe"
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    gathered = fused_moe_gathered(x, w13, w2, weights, ids, activation=activation)  # CUDA's graph-safe path
    torch.testing.assert_close(gathered.double(), want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tokens", [4, 200])
def test_every_token_picking_the_same_experts(tokens: int):
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(tokens, 16, generator=gen)
    w13, w2 = torch.randn(6, 24, 16, generator=gen) * 0.2, torch.randn(6, 16, 12, generator=gen) * 0.2
    logits = torch.zeros(tokens, 6)
    logits[:, 3], logits[:, 1] = 5.0, 4.0  # every token: experts 3 then 1
    weights, ids = lz.moe_route(logits, 2, renormalize=False)
    assert (ids == torch.tensor([3, 1])).all()
    got = lz.fused_moe(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.double(), moe_definition(x, w13, w2, weights, ids, "silu"), atol=1e-4, rtol=1e-4)


def test_bad_shapes_are_refused_naming_them():
    x, w13, w2 = torch.randn(2, 8), torch.randn(4, 10, 8), torch.randn(4, 8, 5)
    weights, ids = lz.moe_route(torch.randn(2, 4), 2, renormalize=True)
    with pytest.raises(ValueError, match="fused_moe expects"):
        lz.fused_moe(x, w13, torch.randn(4, 8, 4), weights, ids)
    with pytest.raises(ValueError, match="top_k"):
        lz.moe_route(torch.randn(2, 4), 5, renormalize=True)
    with pytest.raises(ValueError, match="activation"):
        lz.fused_moe(x, w13, w2, weights, ids, activation="relu")


def test_the_gathered_path_is_declined_past_its_pairs_and_off_cuda():
    x, w13, w2 = torch.randn(100, 8), torch.randn(4, 10, 8), torch.randn(4, 8, 5)
    weights, ids = lz.moe_route(torch.randn(100, 4), 2, renormalize=True)
    ctx = lz.SelectionContext.from_tensors("fused_moe", x, w13, w2, weights, ids, activation="silu")
    assert ctx.param("few_pairs") is False
    [spec] = [s for s in lz.get_registry().kernels("fused_moe") if s.kernel_id == "torch.fused_moe_gathered"]
    assert any(f"more than {MOE_GATHER_PAIRS}" in r.message for r in spec.check(ctx))
    assert "torch.fused_moe_gathered" in str(lz.explain("fused_moe", x, w13, w2, weights, ids))


@pytest.mark.parametrize("tokens", [1, 5])
def test_routing_inside_the_ops_equals_routing_between_them(tokens: int):
    """fused_add_rms_norm_router is fused_add_rms_norm and the router's float32 logits; fused_moe_routed is fused_moe
    of moe_route's routing. On the CPU both run as those parts, each through its own kernel choice."""
    gen = torch.Generator().manual_seed(tokens)
    experts, hidden, inner, k = 8, 24, 20, 2
    x, residual = torch.randn(tokens, hidden, generator=gen), torch.randn(tokens, hidden, generator=gen)
    norm_weight, router = torch.rand(hidden, generator=gen) + 0.5, torch.randn(experts, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inner, hidden, generator=gen) * 0.2
    w2 = torch.randn(experts, hidden, inner, generator=gen) * 0.2
    normed, summed, logits = lz.fused_add_rms_norm_router(x, residual, norm_weight, router, eps=1e-6)
    want_normed, want_summed = lz.fused_add_rms_norm(x, residual, norm_weight, eps=1e-6)
    assert torch.equal(normed, want_normed) and torch.equal(summed, want_summed)
    torch.testing.assert_close(logits, normed.double().matmul(router.double().t()).float(), atol=1e-5, rtol=1e-5)
    got = lz.fused_moe_routed(normed, w13, w2, logits, k, renormalize=True)
    weights, ids = lz.moe_route(logits, k, renormalize=True)
    assert torch.equal(got, lz.fused_moe(normed, w13, w2, weights, ids))
    assert lz.which("fused_moe_routed", normed, w13, w2, logits, k, renormalize=True,
                    scoring="softmax", activation="silu")["kernel_id"] == "torch.composed_moe_routed"
    assert lz.which("fused_add_rms_norm_router", x, residual, norm_weight, router, eps=1e-6,
                    weight_offset=0.0)["kernel_id"] == "torch.composed_add_rms_norm_router"
    with pytest.raises(ValueError, match="fused_moe_routed expects"):
        lz.fused_moe_routed(normed, w13, w2, logits[:, :-1], k, renormalize=True)
    with pytest.raises(ValueError, match="fused_add_rms_norm_router expects"):
        lz.fused_add_rms_norm_router(x, residual, norm_weight, router[:, :-1])
    # with a projection: the op's linear of x first, the same bits as the linear op before it
    rows, proj = torch.randn(tokens, 40, generator=gen), torch.randn(hidden, 40, generator=gen)
    got = lz.fused_add_rms_norm_router(rows, residual, norm_weight, router, eps=1e-6, proj=proj)
    want = lz.fused_add_rms_norm_router(lz.linear(rows, proj), residual, norm_weight, router, eps=1e-6)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    with pytest.raises(ValueError, match="fused_add_rms_norm_router expects"):
        lz.fused_add_rms_norm_router(rows, residual, norm_weight, router, proj=proj[:, :-1])
