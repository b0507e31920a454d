"""Hypothesis fuzzing of lz ops (shapes, dtypes, layouts, strides) against the PyTorch reference, through
the whole dispatch path with the built-in registry."""

from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.reference import activation, norm
from layerzero.kernels.reference import attention as attn_ref
from layerzero.kernels.reference import rope as rope_ref

TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}  # tools/inspect.py TOLERANCES (half: one more ulp of slack)
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
FUZZ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    tol = TOL[expected.dtype]
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def _randn(seed: int, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(dtype)


@st.composite
def attention_calls(draw):
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    sk = draw(st.integers(1, 9))
    sq = draw(st.integers(1, sk))
    d = draw(st.sampled_from([8, 16]))
    return dict(b=b, h=hkv * group, hkv=hkv, sq=sq, sk=sk, d=d, dtype=draw(DTYPES),
                layout=draw(st.sampled_from(["BSHD", "BHSD"])), causal=draw(st.booleans()),
                window=draw(st.one_of(st.none(), st.integers(1, 5))), seed=draw(st.integers(0, 2**16)),
                pass_layout=draw(st.booleans()))


@FUZZ
@given(attention_calls())
def test_attention(c):
    q = _randn(c["seed"], c["b"], c["h"], c["sq"], c["d"], dtype=c["dtype"])
    k = _randn(c["seed"] + 1, c["b"], c["hkv"], c["sk"], c["d"], dtype=c["dtype"])
    v = _randn(c["seed"] + 2, c["b"], c["hkv"], c["sk"], c["d"], dtype=c["dtype"])
    expected = attn_ref.attention_bhsd(q, k, v, c["causal"], 0.35, c["window"])
    if c["layout"] == "BSHD":  # memory in BSHD order, the expected output transposed alike
        q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
        expected = expected.transpose(1, 2)
    try:
        out = lz.attention(q, k, v, causal=c["causal"], scale=0.35, sliding_window=c["window"],
                           layout=c["layout"] if c["pass_layout"] else None)
    except lz.LayoutError as exc:
        assert not c["pass_layout"] and "ambiguous" in str(exc)
        return
    _close(out, expected)


@FUZZ
@given(rows=st.lists(st.integers(1, 5), min_size=0, max_size=2), hidden=st.integers(1, 96), dtype=DTYPES,
       offset=st.sampled_from([0.0, 1.0]), transposed=st.booleans(), seed=st.integers(0, 2**16))
def test_norms(rows, hidden, dtype, offset, transposed, seed):
    shape = (*rows, hidden)
    x = _randn(seed, *shape, dtype=dtype)
    if transposed and len(rows) == 1:  # a non-contiguous view with the same values
        x = _randn(seed, hidden, rows[0], dtype=dtype).t()
    residual, w, b = _randn(seed + 1, *x.shape, dtype=dtype), _randn(seed + 2, hidden, dtype=dtype), _randn(seed + 3, hidden, dtype=dtype)
    _close(lz.rms_norm(x, w, 1e-6, offset), norm.rms_norm(x, w, 1e-6, offset))
    normed, summed = lz.fused_add_rms_norm(x, residual, w, 1e-6, offset)
    ref_normed, ref_summed = norm.fused_add_rms_norm(x, residual, w, 1e-6, offset)
    _close(normed, ref_normed)
    _close(summed, ref_summed)
    _close(lz.layer_norm(x, (hidden,), w, b), norm.layer_norm(x, (hidden,), w.float(), b.float(), 1e-5))


@FUZZ
@given(tokens=st.integers(1, 6), heads=st.integers(1, 4), half=st.integers(1, 16), dtype=DTYPES,
       interleaved=st.booleans(), seed=st.integers(0, 2**16))
def test_rope(tokens, heads, half, dtype, interleaved, seed):
    x = _randn(seed, tokens, heads, 2 * half, dtype=dtype)
    angles = torch.rand(tokens, half, generator=torch.Generator().manual_seed(seed + 1)) * 6.28
    _close(lz.rope(x, angles.cos(), angles.sin(), interleaved), rope_ref.rope(x, angles.cos(), angles.sin(), interleaved))


@FUZZ
@given(rows=st.lists(st.integers(1, 4), min_size=1, max_size=2), inner=st.integers(1, 64), dtype=DTYPES,
       approximate=st.sampled_from(["tanh", "none"]), seed=st.integers(0, 2**16))
def test_gated_activations(rows, inner, dtype, approximate, seed):
    x = _randn(seed, *rows, 2 * inner, dtype=dtype)
    _close(lz.silu_and_mul(x), activation.silu_and_mul(x))
    _close(lz.gelu_and_mul(x, approximate), activation.gelu_and_mul(x, approximate))
