"""Backends: the loader turns failures into reasons, torch kernels match the reference, optional wrappers
report missing libraries and adapt calls correctly (checked with stand-in modules)."""

from __future__ import annotations

import dataclasses
import importlib.util
from types import SimpleNamespace

import pytest
import torch

from layerzero import kernels as backends
from layerzero.kernels import optional, torch_backend
from layerzero.kernels.reference import specs as reference
from layerzero.select import reasons as R
from layerzero.select.context import SelectionContext
from layerzero.select.registry import Registry

TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2, torch.float16: 1e-3}


def test_register_all_records_a_broken_source_and_loads_the_rest(monkeypatch):
    monkeypatch.setattr(backends, "SOURCES", (
        ("reference", "layerzero.kernels.reference.specs", "kernel_specs"),
        ("missing", "lz_no_such_backend_module", "kernel_specs"),
        ("raising", "layerzero.kernels.optional", "no_such_function"),
    ))
    registry = Registry()
    backends.register_all(registry)
    assert registry.reference("attention") is not None
    assert set(registry.load_errors) == {"missing", "raising"}
    assert all(r.code == R.BACKEND_IMPORT_FAILED for r in registry.load_errors.values())


@pytest.mark.parametrize("package, module", [("flash-attn", "flash_attn"), ("flashinfer", "flashinfer"),
                                             ("liger-kernel", "liger_kernel"), ("xformers", "xformers")])
def test_missing_optional_library_is_a_reason(package, module):
    if importlib.util.find_spec(module) is not None:
        pytest.skip(f"{module} is installed here")
    registry = Registry()
    specs = [s for s in optional.kernel_specs() if s.kernel_id.split(".")[0] == module.split("_kernel")[0]]
    assert specs
    for spec in specs:
        registry.register(spec)
        reason = registry.availability(spec)
        assert reason is not None and reason.code == R.NOT_INSTALLED and package in reason.message


def test_a_raising_probe_becomes_backend_import_failed():
    registry = Registry()
    spec = dataclasses.replace(optional.kernel_specs()[0], available=lambda: 1 / 0)
    registry.register(spec)
    assert registry.availability(spec).code == R.BACKEND_IMPORT_FAILED


def test_a_reference_module_that_fails_to_import_is_a_rejected_spec(monkeypatch):
    monkeypatch.setitem(reference._EXTRA, "sample_topk", ("lz_no_such_reference", "sample_topk"))
    spec = next(s for s in reference.kernel_specs() if s.op == "sample_topk")
    registry = Registry()
    registry.register(spec)
    assert registry.availability(spec).code == R.BACKEND_IMPORT_FAILED
    with pytest.raises(ImportError):
        spec.impl(torch.zeros(2, 4), 1)


def _fa_visible(i: int, j: int, window_size: tuple[int, int]) -> bool:
    left, right = window_size
    return (left < 0 or j >= i - left) and (right < 0 or j <= i + right)


def _our_visible(i: int, j: int, causal: bool, window: int | None) -> bool:
    return (not causal or j <= i) and (window is None or i - j < window)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 1, 3])
def test_flash_attn_window_matches_our_semantics(causal, window):
    size = optional._fa_window(causal, window)
    for i in range(8):
        for j in range(8):
            assert _fa_visible(i, j, size) == _our_visible(i, j, causal, window)


def test_flashinfer_fused_wrapper_is_functional(monkeypatch):
    def fused_add_rmsnorm(x, residual, weight, eps):  # flashinfer's in-place contract
        residual += x
        x.copy_(reference.rms_norm(residual, weight, eps=eps, weight_offset=0.0))

    fake = SimpleNamespace(fused_add_rmsnorm=fused_add_rmsnorm)
    monkeypatch.setattr(optional, "_module", lambda name: fake)
    x, r, w = torch.randn(2, 3, 16), torch.randn(2, 3, 16), torch.randn(16)
    x0, r0 = x.clone(), r.clone()
    normed, summed = optional.fi_fused_add_rms_norm(x, r, w, eps=1e-6, weight_offset=0.0)
    expected = reference.fused_add_rms_norm(x0, r0, w, eps=1e-6, weight_offset=0.0)
    torch.testing.assert_close(normed, expected[0])
    torch.testing.assert_close(summed, expected[1])
    assert torch.equal(x, x0) and torch.equal(r, r0)


def test_flash_attn_paged_rejects_small_blocks():
    ctx = SelectionContext(op="paged_attention", params=(("block_size", 16),))
    assert [r.code for r in optional._fa_paged_check(ctx)] == [R.CONSTRAINT_FAILED]
    assert optional._fa_paged_check(ctx.with_(params=(("block_size", 256),))) == []


def _attention_inputs(dtype, sq, sk, h, hkv, d=16, layout="BSHD"):
    g = torch.Generator().manual_seed(sq * 100 + sk)
    shape = (lambda s, heads: (2, s, heads, d)) if layout == "BSHD" else (lambda s, heads: (2, heads, s, d))
    return tuple(torch.randn(*shape(s, heads), generator=g).to(dtype) for s, heads in ((sq, h), (sk, hkv), (sk, hkv)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
@pytest.mark.parametrize("sq, sk, causal, window", [(5, 5, True, None), (1, 9, True, None), (3, 9, True, None),
                                                    (5, 5, False, None), (6, 6, True, 2), (2, 7, False, 3)])
def test_torch_sdpa_matches_reference(dtype, layout, sq, sk, causal, window):
    q, k, v = _attention_inputs(dtype, sq, sk, 4, 2, layout=layout)
    kw = dict(causal=causal, scale=0.3, sliding_window=window, layout=layout)
    torch.testing.assert_close(torch_backend.sdpa(q, k, v, **kw), reference.attention(q, k, v, **kw),
                               rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_torch_norms_match_reference(dtype, offset):
    g = torch.Generator().manual_seed(7)
    x, w, b = torch.randn(3, 5, 64, generator=g).to(dtype), torch.randn(64, generator=g), torch.randn(64, generator=g)
    tol = TOL[dtype] * 2
    torch.testing.assert_close(torch_backend.rms_norm(x, w.to(dtype), eps=1e-6, weight_offset=offset),
                               reference.rms_norm(x, w.to(dtype), eps=1e-6, weight_offset=offset), rtol=tol, atol=tol)
    torch.testing.assert_close(torch_backend.layer_norm(x, (64,), w.to(dtype), b.to(dtype), eps=1e-5),
                               reference.layer_norm(x, (64,), w.to(dtype), b.to(dtype), eps=1e-5), rtol=tol, atol=tol)


def test_flex_attention_only_for_windows_on_cuda():
    flex = next(s for s in torch_backend.kernel_specs() if s.kernel_id == "torch.flex_attention")
    ctx = SelectionContext(op="attention", seq_q=64, seq_k=64, head_dim=48, num_heads=4, num_kv_heads=4)
    assert len(flex.check(ctx)) == 3  # no window, short sequences, head_dim not a power of two
    assert flex.check(ctx.with_(sliding_window=True, seq_q=256, seq_k=256, head_dim=64)) == []
    assert "cuda" in flex.platforms and "cpu" not in flex.platforms
