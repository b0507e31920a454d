"""The skinny-linear Triton kernel (decode's batch 1-8) against float64 on fresh random inputs, interpreted on the
CPU, and the rule that lets it run only where it measured faster than cuBLAS."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from layerzero.kernels.triton import specs
from layerzero.select.context import SelectionContext


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "n", "k", "bias"), [(1, 48, 256, False), (8, 100, 384, True), (20, 33, 130, True)])
def test_gemv_matches_float64(triton_interpreted, rng, assert_matches, dtype, rows, n, k, bias):
    gemv = triton_interpreted("gemv")
    x = torch.randn(rows, k + 3, generator=rng).to(dtype)[:, :k]  # a strided view: rows 3 elements apart
    w = (torch.randn(n, k, generator=rng) * 0.1).to(dtype)
    b = torch.randn(n, generator=rng).to(dtype) if bias else None
    want = x.double() @ w.double().T + (0 if b is None else b.double())
    got = gemv.linear_gemv(x, w, b)
    assert_matches(got, want.to(dtype))


def test_gemv_keeps_leading_dims(triton_interpreted, rng):
    gemv = triton_interpreted("gemv")
    x, w = torch.randn(2, 3, 64, generator=rng), torch.randn(40, 64, generator=rng)
    assert gemv.linear_gemv(x, w).shape == (2, 3, 40)


def _ctx(tokens: int, out: int, hidden: int) -> SelectionContext:
    return SelectionContext(op="linear", platform="cuda", device="cuda", dtype=torch.bfloat16, tokens=tokens,
                            hidden=hidden, params=(("out_features", out), ("bias", False)))


def test_the_gemv_runs_on_few_rows_and_weights_past_l2():
    check = next(s for s in specs.kernel_specs() if s.op == "linear").check
    assert check is not None
    assert check(_ctx(1, 14336 * 2, 4096)) == []  # Llama-3.1-8B gate+up, batch 1
    assert check(_ctx(8, 128256, 2048)) == []  # Llama-3.2-1B LM head, batch 8
    assert "at most 8" in check(_ctx(16, 14336 * 2, 4096))[0].message
    assert "cuBLAS measured faster" in check(_ctx(1, 3072, 2048))[0].message  # Llama-3.2-1B QKV: 12 MiB


@pytest.mark.parametrize("activation", ["silu", "gelu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "inner", "k"), [(1, 24, 256), (8, 40, 384), (20, 17, 130)])
def test_gated_gemv_matches_float64(triton_interpreted, rng, assert_matches, activation, dtype, rows, inner, k):
    """act(gate) * up from one pass over [gate; up], against float64 with the projection rounded to the dtype first
    (as the unfused projection's output is)."""
    gemv = triton_interpreted("gemv")
    x = torch.randn(rows, k + 3, generator=rng).to(dtype)[:, :k]
    w = (torch.randn(2 * inner, k, generator=rng) * 0.1).to(dtype)
    gate_up = (x.double() @ w.double().T).to(dtype).double()
    gate, up = gate_up[:, :inner], gate_up[:, inner:]
    approximate = "tanh" if activation == "gelu_tanh" else "none"
    act = F.silu(gate) if activation == "silu" else F.gelu(gate, approximate=approximate)
    assert_matches(gemv.gated_linear_gemv(x, w, activation=activation), (act * up).to(dtype))


def test_gated_gemv_refuses_what_does_not_fit(triton_interpreted):
    gemv = triton_interpreted("gemv")
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match="activation must be one of"):
        gemv.gated_linear_gemv(x, torch.randn(8, 64), activation="relu")
    with pytest.raises(ValueError, match="weight \\[2I, 64\\]"):
        gemv.gated_linear_gemv(x, torch.randn(7, 64), activation="silu")
    assert gemv.gated_linear_gemv(torch.randn(2, 3, 64), torch.randn(8, 64), activation="silu").shape == (2, 3, 4)


def test_the_gated_gemv_takes_the_gemv_rule_up_to_128_mib():
    """gated_linear's fused kernel runs where the plain GEMV would on its gate+up weight, up to 128 MiB; elsewhere
    the composed kernel (linear, then the activation op) answers."""
    check = next(s for s in specs.kernel_specs() if s.op == "gated_linear").check
    ctx = SelectionContext(op="gated_linear", platform="cuda", device="cuda", dtype=torch.bfloat16, tokens=1,
                           hidden=2048, params=(("out_features", 16384), ("activation", "silu")))
    assert check(ctx) == []  # Llama-3.2-1B gate+up, batch 1
    assert "at most 8" in check(dataclasses.replace(ctx, tokens=512))[0].message
    eight_b = dataclasses.replace(ctx, hidden=4096, params=(("out_features", 28672), ("activation", "silu")))
    assert "measured faster" in check(eight_b)[0].message  # Llama-3.1-8B gate+up: 224 MiB
