"""On a CUDA GPU: explain shows the expected choice and reasons, the torch kernels match the reference, and
every lz op dispatched on the device matches its PyTorch reference. Skips without CUDA."""

from __future__ import annotations

import json

import pytest
import torch

import layerzero as lz
from layerzero.kernels import torch_backend
from layerzero.kernels.reference import specs as reference
from layerzero.select import reasons as R

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

TOL = {torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float32: 1e-5}
DEV = "cuda"


def _t(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEV, dtype)


def _close(a: torch.Tensor, b: torch.Tensor) -> None:
    tol = TOL[b.dtype]
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def test_explain_prefill_attention_on_hopper():
    q, k = _t(1, 512, 16, 128), _t(1, 512, 4, 128, seed=1)
    kw = dict(causal=True, scale=128**-0.5, sliding_window=None, layout="BSHD")
    report = lz.explain("attention", q, k, k, **kw)
    print(report)
    json.dumps(report.to_dict())
    assert report.selected == "torch.sdpa"
    rows = {c.kernel_id: {r.code for r in c.reasons} for c in report.candidates}
    assert R.NOT_INSTALLED in rows["flash_attn.attention"]
    assert rows["torch.flex_attention"] == {R.CONSTRAINT_FAILED}
    assert rows["xformers.attention"] >= {R.GQA_UNSUPPORTED, R.NOT_INSTALLED}
    windowed = lz.explain("attention", _t(1, 1024, 16, 128), _t(1, 1024, 4, 128), _t(1, 1024, 4, 128),
                          **{**kw, "sliding_window": 256})
    print(windowed)
    assert windowed.selected == "torch.flex_attention"


def test_explain_decode_ops_pick_triton():
    x, w = _t(8, 2048), _t(2048)
    assert lz.which("rms_norm", x, w, eps=1e-6, weight_offset=0.0)["kernel_id"] == "triton.rms_norm"
    cache = _t(64, 16, 4, 128)
    tables = torch.arange(64, device=DEV, dtype=torch.int32).view(4, 16)
    lens = torch.tensor([5, 100, 256, 17], device=DEV, dtype=torch.int32)
    report = lz.explain("paged_attention", _t(4, 16, 128), cache, cache, block_tables=tables, context_lens=lens,
                        scale=0.088, sliding_window=None, max_context_len=256)
    print(report)
    assert report.selected == "triton.paged_attention"
    assert {r.code for r in next(c for c in report.candidates if c.kernel_id == "flash_attn.paged").reasons} >= {
        R.NOT_INSTALLED, R.CONSTRAINT_FAILED}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("window, seq", [(None, 64), (None, 300), (100, 384), (7, 256)])
def test_torch_attention_kernels_match_reference(dtype, window, seq):
    q, k, v = _t(2, seq, 8, 64, dtype=dtype), _t(2, seq, 2, 64, dtype=dtype, seed=1), _t(2, seq, 2, 64, dtype=dtype, seed=2)
    kw = dict(causal=True, scale=0.125, sliding_window=window, layout="BSHD")
    expected = reference.attention(q, k, v, **kw)
    _close(torch_backend.sdpa(q, k, v, **kw), expected)
    if window is not None and seq >= torch_backend.FLEX_MIN_SEQ:
        _close(torch_backend.flex(q, k, v, **kw), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_every_op_on_cuda_matches_reference(dtype):
    x, w, r = _t(6, 256, dtype=dtype), _t(256, dtype=dtype, seed=1), _t(6, 256, dtype=dtype, seed=2)
    _close(lz.rms_norm(x, w, 1e-6, 1.0), reference.rms_norm(x, w, eps=1e-6, weight_offset=1.0))
    normed, summed = lz.fused_add_rms_norm(x, r, w)
    ref = reference.fused_add_rms_norm(x, r, w, eps=1e-6, weight_offset=0.0)
    _close(normed, ref[0])
    _close(summed, ref[1])
    _close(lz.layer_norm(x, (256,), w, w), reference.layer_norm(x, (256,), w, w, eps=1e-5))
    _close(lz.silu_and_mul(x), reference._CORE["silu_and_mul"][0](x))
    _close(lz.gelu_and_mul(x), reference.gelu_and_mul(x, approximate="tanh"))
    xr, ang = _t(6, 4, 64, dtype=dtype), torch.rand(6, 32, device=DEV)
    _close(lz.rope(xr, ang.cos(), ang.sin()), reference.rope(xr, ang.cos(), ang.sin(), interleaved=False))
    q, k = _t(1, 200, 8, 64, dtype=dtype), _t(1, 200, 2, 64, dtype=dtype, seed=3)
    _close(lz.attention(q, k, k, layout="BSHD", sliding_window=50),
           reference.attention(q, k, k, causal=True, scale=0.125, sliding_window=50, layout="BSHD"))
