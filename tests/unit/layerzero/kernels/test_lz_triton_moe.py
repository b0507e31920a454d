"""Triton fused MoE (interpreted), the grouped GEMM and the sort-free decode path, against the float64 definition:
experts receiving no token, every token on the same experts, partial row and column blocks, both activations; the pair
alignment's invariants; which path layerzero picks by the number of pairs, and why. The routing kernels, and the
decode path that ranks router logits itself after the norm-and-router kernel, against the reference."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference.moe import fused_add_rms_norm_router as reference_norm_router
from layerzero.kernels.reference.moe import moe_gate as reference_gate, moe_route as reference_route
from layerzero.kernels.reference.quantize import dequantize_w8
from layerzero.kernels.triton import specs
from layerzero.select.signatures import MOE_DECODE_PAIRS
from test_moe_ops import moe_definition

PATHS = ["fused_moe", "fused_moe_decode"]


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    """The grouped path (moe.py) and the decode path (moe_decode.py), interpreted, as one namespace."""
    return SimpleNamespace(**{**vars(triton_interpreted("moe")), **vars(triton_interpreted("moe_decode"))})


def _inputs(tokens: int, experts: int, k: int, seed: int, same: bool = False):
    gen = torch.Generator().manual_seed(seed)
    hidden, inner = 96, 80  # partial column and K blocks (64)
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inner, hidden, generator=gen) * 0.1
    w2 = torch.randn(experts, hidden, inner, generator=gen) * 0.1
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, experts // 2 :] -= 100  # the upper half of the experts receives nothing
    if same:
        logits[:] = 0.0
        logits[:, 1], logits[:, 0] = 5.0, 4.0
    weights, ids = lz.moe_route(logits, k, renormalize=True)
    return x, w13, w2, weights, ids


@pytest.mark.parametrize("tokens, same", [(1, False), (5, False), (37, False), (20, True)])
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("path", PATHS)
def test_fused_moe_matches_the_definition(kernels, path, tokens, same, activation):
    x, w13, w2, weights, ids = _inputs(tokens, 8, 2, seed=tokens, same=same)
    got = getattr(kernels, path)(x, w13, w2, weights, ids, activation=activation)
    torch.testing.assert_close(got.double(), moe_definition(x, w13, w2, weights, ids, activation), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("path", PATHS)
def test_bf16_within_its_rounding(kernels, path):
    x, w13, w2, weights, ids = _inputs(6, 8, 2, seed=3)
    got = getattr(kernels, path)(x.bfloat16(), w13.bfloat16(), w2.bfloat16(), weights, ids)
    want = moe_definition(x.bfloat16().float(), w13.bfloat16().float(), w2.bfloat16().float(), weights, ids, "silu")
    torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("tokens, experts, k", [(1, 4, 2), (9, 6, 3), (50, 16, 4)])
def test_align_pairs_groups_every_pair_once_by_expert(kernels, tokens, experts, k):
    ids = torch.randint(0, experts, (tokens, k), generator=torch.Generator().manual_seed(tokens))
    rows, block_expert = kernels.align_pairs(ids, experts)
    pairs = tokens * k
    assert sorted(rows[rows < pairs].tolist()) == list(range(pairs))
    for b, e in enumerate(block_expert.tolist()):
        block = rows[b * kernels.BLOCK_M : (b + 1) * kernels.BLOCK_M]
        used = block[block < pairs]
        if e >= experts:
            assert used.numel() == 0
        else:
            assert (ids.reshape(-1)[used] == e).all()


def test_no_tokens_give_an_empty_output(kernels):
    x, w13, w2, weights, ids = _inputs(0, 8, 2, seed=0)
    assert kernels.fused_moe_decode(x, w13, w2, weights, ids).shape == (0, 96)


def test_the_decode_path_takes_few_pairs_and_says_why_not_past_them():
    [decode] = [s for s in specs.kernel_specs() if s.kernel_id == "triton.fused_moe_decode"]
    [grouped] = [s for s in specs.kernel_specs() if s.kernel_id == "triton.fused_moe"]
    assert decode.priority > grouped.priority  # chosen wherever it applies
    k = 4
    for tokens, applies in ((MOE_DECODE_PAIRS // k, True), (MOE_DECODE_PAIRS // k + 1, False)):
        ctx = lz.SelectionContext.from_tensors("fused_moe", *_inputs(tokens, 8, k, seed=tokens), activation="silu")
        reasons = decode.check(ctx)
        assert not reasons if applies else f"more than {MOE_DECODE_PAIRS} (token, expert) pairs" in reasons[0].message


@pytest.mark.parametrize("path", PATHS)
def test_a_top_k_that_is_no_power_of_two(kernels, path):
    x, w13, w2, weights, ids = _inputs(5, 8, 3, seed=9)
    got = getattr(kernels, path)(x, w13, w2, weights, ids)
    torch.testing.assert_close(got.double(), moe_definition(x, w13, w2, weights, ids, "silu"), atol=1e-4, rtol=1e-4)


def _w8_inputs(tokens: int, wdtype: torch.dtype, block: tuple[int, int], seed: int):
    """The float inputs' experts as 8-bit values with block scales (values amax-scaled per block, as quantizers do)."""
    x, w13, w2, weights, ids = _inputs(tokens, 8, 2, seed=seed)
    out = []
    for w in (w13, w2):
        bn, bk = block
        e, n, k = w.shape
        scale = torch.rand(e, -(-n // bn), -(-k // bk), generator=torch.Generator().manual_seed(seed)) * 0.01 + 1e-3
        full = scale.repeat_interleave(bn, 1)[:, :n].repeat_interleave(bk, 2)[:, :, :k]
        q = (w / full).clamp(-127, 127)
        out += [q.round().to(torch.int8) if wdtype == torch.int8 else q.to(wdtype), scale]
    return x, *out, weights, ids


@pytest.mark.parametrize("block", [(1, 32), (16, 32), (128, 128)], ids=["q8_0", "small-blocks", "fp8-checkpoint"])
@pytest.mark.parametrize("wdtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
@pytest.mark.parametrize("path, tokens", [("fused_moe_w8_decode", 1), ("fused_moe_w8_decode", 7), ("fused_moe_w8", 5),
                                          ("fused_moe_w8", 37)])
def test_8bit_experts_match_the_definition(kernels, path, tokens, wdtype, block):
    """Blocks that cut rows and columns part way (hidden 96, intermediate 80), and the experts' dequantized weights
    as the definition's."""
    x, w13, s13, w2, s2, weights, ids = _w8_inputs(tokens, wdtype, block, seed=tokens)
    got = getattr(kernels, path)(x, w13, s13, w2, s2, weights, ids, block_size=block)
    d13, d2 = (torch.stack([dequantize_w8(q, s, block) for q, s in zip(w, sc)]) for w, sc in ((w13, s13), (w2, s2)))
    want = moe_definition(x, d13, d2, weights, ids, "silu")
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    half = getattr(kernels, path)(x.bfloat16(), w13, s13, w2, s2, weights, ids, block_size=block)
    assert half.dtype == torch.bfloat16 and (half.double() - want).abs().max() <= 3e-2 * want.abs().max()


def test_8bit_experts_take_the_decode_path_for_few_pairs():
    [decode] = [s for s in specs.kernel_specs() if s.kernel_id == "triton.fused_moe_w8_decode"]
    [grouped] = [s for s in specs.kernel_specs() if s.kernel_id == "triton.fused_moe_w8"]
    assert decode.priority > grouped.priority and decode.quant_formats == grouped.quant_formats
    for tokens, applies in ((MOE_DECODE_PAIRS // 2, True), (MOE_DECODE_PAIRS // 2 + 1, False)):
        x, w13, s13, w2, s2, weights, ids = _w8_inputs(tokens, torch.int8, (1, 32), seed=tokens)
        ctx = lz.SelectionContext.from_tensors("fused_moe_w8", x, w13, s13, w2, s2, weights, ids, block_size=(1, 32),
                                               activation="silu")
        reasons = decode.check(ctx)
        assert not reasons if applies else f"more than {MOE_DECODE_PAIRS} (token, expert) pairs" in reasons[0].message


@pytest.fixture(scope="module")
def route_kernel(triton_interpreted):
    return triton_interpreted("moe_route")


@pytest.mark.parametrize("experts, k, scoring, renormalize", [(8, 2, "softmax", True), (128, 8, "softmax", False),
                                                              (60, 6, "sigmoid", True), (5, 3, "sigmoid", False)])
def test_routing_matches_the_reference(route_kernel, experts, k, scoring, renormalize):
    logits = torch.randn(9, experts, generator=torch.Generator().manual_seed(experts))
    logits[3] = 0.0  # every score tied: the kernel takes the lowest expert ids (torch.topk's order is its own)
    weights, ids = route_kernel.moe_route(logits, k, renormalize=renormalize, scoring=scoring)
    want_w, want_ids = reference_route(logits, k, renormalize=renormalize, scoring=scoring)
    untied = torch.arange(9) != 3
    assert torch.equal(ids[untied], want_ids[untied]) and ids.dtype == torch.int64
    assert ids[3].tolist() == list(range(k))
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-6)
    assert route_kernel.moe_route(logits[:0], k, renormalize=renormalize, scoring=scoring)[1].shape == (0, k)


@pytest.mark.parametrize("experts, k", [(128, 8), (256, 8), (6, 4), (300, 3)])
def test_routing_orders_ties_by_expert_id(route_kernel, experts, k):
    """Scores from a coarse grid tie often: a token's experts come by score, then by the lower id."""
    gen = torch.Generator().manual_seed(experts)
    logits = torch.randint(0, 5, (7, experts), generator=gen).float() / 2
    weights, ids = route_kernel.moe_route(logits, k, renormalize=False)
    want_ids = torch.sort(-logits, dim=1, stable=True).indices[:, :k]
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, torch.softmax(logits, 1).gather(1, want_ids), atol=1e-6, rtol=1e-6)


def test_routing_of_nan_logits_still_names_valid_experts(route_kernel):
    logits = torch.full((2, 6), float("nan"))
    logits[1, 0] = float("inf")  # softmax of inf - inf is NaN too
    _, ids = route_kernel.moe_route(logits, 2, renormalize=True)
    assert ((ids >= 0) & (ids < 6)).all() and (ids[:, 0] != ids[:, 1]).all()


def test_routing_declines_more_experts_than_it_holds():
    [spec] = [s for s in specs.kernel_specs() if s.kernel_id == "triton.moe_route"]
    logits = torch.randn(2, specs.MAX_ROUTED_EXPERTS + 1)
    ctx = lz.SelectionContext.from_tensors("moe_route", logits, 4, renormalize=True, scoring="softmax")
    assert f"at most {specs.MAX_ROUTED_EXPERTS} scores" in spec.check(ctx)[0].message


@pytest.mark.parametrize("tokens, experts, hidden, k, scoring", [(1, 8, 64, 2, "softmax"), (5, 128, 2048, 8, "softmax"),
                                                                 (16, 60, 300, 6, "sigmoid"), (3, 5, 24, 3, "softmax")])
@pytest.mark.parametrize("path", ["moe_gate", "moe_gate_decode"])
def test_gate_matches_the_reference(route_kernel, path, tokens, experts, hidden, k, scoring):
    seed = torch.randint(0, 2**31, ()).item()
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=gen)
    router = torch.randn(experts, hidden, generator=gen) * 0.05
    x[-1] = 0.0  # every score tied: the kernel takes the lowest expert ids
    weights, ids = getattr(route_kernel, path)(x, router, k, renormalize=True, scoring=scoring)
    want_w, want_ids = reference_gate(x, router, k, renormalize=True, scoring=scoring)
    assert torch.equal(ids[:-1], want_ids[:-1]), seed
    assert ids[-1].tolist() == list(range(k)) and ids.dtype == torch.int64
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-6)
    assert not route_kernel._COUNTERS or all(c.item() == 0 for c in route_kernel._COUNTERS.values())


def _numpy_matmul_rows_invariant(x: torch.Tensor, router: torch.Tensor) -> bool:
    """The interpreter's tl.dot is numpy's matmul: whether this machine's BLAS gives a row the same bits at row 0 of
    an otherwise zero [ROWS, K] tile as at its own place among the others (OpenBLAS on an AMD EPYC did not)."""
    a, b = torch.zeros(16, x.shape[1]), router.T.contiguous().numpy()
    a[: x.shape[0]] = x
    full = a.numpy() @ b
    for t in range(x.shape[0]):
        alone = torch.zeros_like(a)
        alone[0] = x[t]
        if not (alone.numpy() @ b)[0].tobytes() == full[t].tobytes():
            return False
    return True


def test_gate_decode_is_batch_invariant(route_kernel):
    """A token's logits are summed in the same order alone or beside others: the same bits either way."""
    gen = torch.Generator().manual_seed(11)
    x, router = torch.randn(9, 256, generator=gen), torch.randn(32, 256, generator=gen)
    if not _numpy_matmul_rows_invariant(x, router):
        pytest.skip("the interpreter's tl.dot (numpy's BLAS here) sums a row by its place in the tile; "
                    "tests/gpu checks the compiled kernel")
    together = route_kernel.moe_gate_decode(x, router, 4, renormalize=False)
    for t in (0, 4, 8):
        alone = route_kernel.moe_gate_decode(x[t : t + 1], router, 4, renormalize=False)
        assert torch.equal(alone[0][0], together[0][t]) and torch.equal(alone[1][0], together[1][t])


def test_gate_decode_of_nothing_and_too_many_tokens(route_kernel):
    router = torch.randn(8, 32)
    weights, ids = route_kernel.moe_gate_decode(torch.randn(0, 32), router, 2, renormalize=True)
    assert weights.shape == ids.shape == (0, 2)
    assert specs.MOE_GATE_ROWS == route_kernel.ROWS  # the spec's limit is the kernel's tile (specs imports no triton)
    with pytest.raises(ValueError, match=f"at most {route_kernel.ROWS} tokens"):
        route_kernel.moe_gate_decode(torch.randn(route_kernel.ROWS + 1, 32), router, 2, renormalize=True)


@pytest.mark.parametrize("tokens, applies", [(1, True), (specs.MOE_GATE_ROWS, True), (specs.MOE_GATE_ROWS + 1, False)])
def test_gate_decode_takes_few_tokens_and_says_why_not_more(tokens, applies):
    [decode] = [s for s in specs.kernel_specs() if s.kernel_id == "triton.moe_gate_decode"]
    x, router = torch.randn(tokens, 32), torch.randn(8, 32)
    ctx = lz.SelectionContext.from_tensors("moe_gate", x, router, 2, renormalize=True, scoring="softmax")
    reasons = decode.check(ctx)
    assert not reasons if applies else "more take the matmul and the routing kernel" in reasons[0].message
    wide = lz.SelectionContext.from_tensors("moe_gate", x, torch.randn(specs.MAX_ROUTED_EXPERTS + 1, 32), 2,
                                            renormalize=True, scoring="softmax")
    assert f"at most {specs.MAX_ROUTED_EXPERTS} scores" in decode.check(wide)[0].message


def _routed_inputs(tokens: int, experts: int, seed: int):
    gen = torch.Generator().manual_seed(seed)
    hidden, inner = 96, 80
    x = torch.randn(tokens, hidden, generator=gen)
    w13 = torch.randn(experts, 2 * inner, hidden, generator=gen) * 0.1
    w2 = torch.randn(experts, hidden, inner, generator=gen) * 0.1
    logits = torch.randn(tokens, experts, generator=gen)
    logits[:, experts // 2 :] -= 100  # the upper half of the experts receives nothing
    return x, w13, w2, logits


@pytest.mark.parametrize("tokens, experts, k, scoring, renormalize", [
    (1, 8, 2, "softmax", True), (3, 128, 8, "softmax", False), (4, 60, 6, "sigmoid", True), (2, 5, 3, "sigmoid", False),
    (2, 300, 4, "softmax", True)])
def test_the_decode_path_ranks_logits_as_the_routing_does(kernels, tokens, experts, k, scoring, renormalize):
    """The gate+up and down kernels each rank a token's experts from its logits: the experts and weights moe_route
    gives, so the sum of the decode path over moe_route's routing; a token whose logits all tie takes the lowest ids,
    as the routing kernel does, and a token with NaN logits still names valid experts."""
    x, w13, w2, logits = _routed_inputs(tokens, experts, seed=experts)
    logits[-1] = 0.0
    got = kernels.fused_moe_routed_decode(x, w13, w2, logits, k, renormalize=renormalize, scoring=scoring)
    weights, ids = reference_route(logits, k, renormalize=renormalize, scoring=scoring)
    ids[-1] = torch.arange(k)  # torch.topk orders ties its own way (the tied weights are equal)
    want = moe_definition(x, w13, w2, weights, ids, "silu")
    torch.testing.assert_close(got.double(), want, atol=1e-4, rtol=1e-4)
    logits[0, : experts // 2] = float("nan")
    assert kernels.fused_moe_routed_decode(x, w13, w2, logits, k, renormalize=renormalize, scoring=scoring)[1:] \
        .isfinite().all()


@pytest.mark.parametrize("tokens, experts, hidden", [(1, 8, 64), (3, 128, 2048), (16, 60, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_router_in_one_launch_match_the_reference(route_kernel, tokens, experts, hidden, dtype):
    gen = torch.Generator().manual_seed(tokens * hidden)
    x, residual = (torch.randn(tokens, hidden, generator=gen).to(dtype) for _ in range(2))
    weight = torch.rand(hidden, generator=gen) + 0.5
    router = (torch.randn(experts, hidden, generator=gen) * 0.05).to(dtype)
    got = route_kernel.fused_add_rms_norm_router_decode(x, residual, weight, router, eps=1e-6, weight_offset=1.0)
    want = reference_norm_router(x, residual, weight, router, eps=1e-6, weight_offset=1.0)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
    torch.testing.assert_close(got[1], want[1], atol=0, rtol=0)  # the sum: one rounding either way
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got[0], want[0], atol=tol, rtol=tol)
    # the logits of the kernel's own normed rows in float32: what a router given those rows computes
    torch.testing.assert_close(got[2], got[0].float() @ router.float().t(), atol=1e-4, rtol=1e-5)


@pytest.mark.parametrize("tokens, experts, hidden, columns", [(1, 8, 64, 512), (3, 128, 300, 1024)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_router_sum_the_projections_slices(route_kernel, triton_interpreted, monkeypatch, tokens, experts,
                                                    hidden, columns, dtype):
    """With `proj`, the O projection's split-K slices are summed in the norm's kernel: the same as the projection,
    rounded to x's dtype, added to the residual."""
    monkeypatch.setattr(route_kernel, "splitk_partials", triton_interpreted("gemv").splitk_partials)
    gen = torch.Generator().manual_seed(tokens * columns)
    x = torch.randn(tokens, columns, generator=gen).to(dtype)
    proj = (torch.randn(hidden, columns, generator=gen) * 0.05).to(dtype)
    residual = torch.randn(tokens, hidden, generator=gen).to(dtype)
    weight = torch.rand(hidden, generator=gen) + 0.5
    router = (torch.randn(experts, hidden, generator=gen) * 0.05).to(dtype)
    got = route_kernel.fused_add_rms_norm_router_splitk(x, residual, weight, router, proj, eps=1e-6,
                                                        weight_offset=0.0)
    projected_first = route_kernel.fused_add_rms_norm_router_decode(x, residual, weight, router, proj, eps=1e-6,
                                                                    weight_offset=0.0)
    want = reference_norm_router(x.double(), residual.double(), weight.double(), router.double(), proj.double(),
                                 eps=1e-6, weight_offset=0.0)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for g, w in zip(got, want):
        assert g.shape == w.shape
        torch.testing.assert_close(g.double(), w.double(), atol=tol, rtol=tol)
    for g, p in zip(got, projected_first):
        assert g.dtype == p.dtype
        torch.testing.assert_close(g.double(), p.double(), atol=tol, rtol=tol)
    assert got[0].dtype == dtype and got[2].dtype == torch.float32
    with pytest.raises(ValueError, match="do not fit"):
        route_kernel.fused_add_rms_norm_router_splitk(x, residual, weight, router, proj[:, :-1], eps=1e-6,
                                                      weight_offset=0.0)


def test_the_routed_decode_path_and_the_norm_router_say_where_they_stop():
    by_id = {s.kernel_id: s for s in specs.kernel_specs()}
    routed, norm_router = by_id["triton.fused_moe_routed_decode"], by_id["triton.fused_add_rms_norm_router_decode"]
    x, w13, w2, logits = _routed_inputs(MOE_DECODE_PAIRS // 2 + 1, 8, seed=0)
    ctx = lz.SelectionContext.from_tensors("fused_moe_routed", x, w13, w2, logits, 2, renormalize=True,
                                           scoring="softmax", activation="silu")
    assert f"more than {MOE_DECODE_PAIRS} (token, expert) pairs" in routed.check(ctx)[0].message
    tokens = specs.NORM_ROUTER_ROWS + 1
    x = torch.randn(tokens, 64)
    ctx = lz.SelectionContext.from_tensors("fused_add_rms_norm_router", x, x, torch.ones(64), torch.randn(8, 64),
                                           eps=1e-6, weight_offset=0.0)
    assert f"takes at most {specs.NORM_ROUTER_ROWS}" in norm_router.check(ctx)[0].message
    splitk = by_id["triton.fused_add_rms_norm_router_splitk"]
    assert "no projection to fold" in splitk.check(ctx)[-1].message
    proj = torch.randn(64, 640)  # 640 columns: not whole split-K slices; 80 KiB: under the split-K GEMV's sizes
    ctx = lz.SelectionContext.from_tensors("fused_add_rms_norm_router", torch.randn(1, 640), x[:1], torch.ones(64),
                                           torch.randn(8, 64), proj, eps=1e-6, weight_offset=0.0)
    assert not norm_router.check(ctx)
    messages = " ".join(r.message for r in splitk.check(ctx))
    assert "640 columns are not a multiple" in messages and "a projection of 0.2 MiB" in messages
    ctx = lz.SelectionContext.from_tensors("fused_add_rms_norm_router", torch.randn(1, 640), x[:1], torch.ones(64),
                                           torch.randn(8, 64), proj.bfloat16(), eps=1e-6, weight_offset=0.0)
    assert "a bfloat16 projection of torch.float32 rows" in " ".join(r.message for r in splitk.check(ctx))
