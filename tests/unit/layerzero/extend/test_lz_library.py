"""torch.library ops: opcheck on every op, call_op against the reference, torch.compile(fullgraph=True) of the lz API."""

from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

import layerzero as lz
from layerzero.extend.library import OPS, call_op
from layerzero.kernels.reference import activation, argmax, kv_cache, norm, quantize, sampling
from layerzero.kernels.reference import attention as attn_ref
from layerzero.kernels.reference import rope as rope_ref
from layerzero.kernels.reference import rope_store_kv


_GEN = torch.Generator().manual_seed(0)  # the cases are built at collection: the same inputs whatever ran before


def _rand(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, dtype=torch.float32, generator=_GEN)


def _cases() -> list[tuple[str, tuple, dict, object]]:
    """(op, canonical args, canonical kwargs, expected output from the PyTorch reference)."""
    cases = []
    q, k, v = _rand(2, 5, 4, 8), _rand(2, 5, 2, 8), _rand(2, 5, 2, 8)
    for window in (None, 3):
        expected = attn_ref.attention_bhsd(*(t.transpose(1, 2) for t in (q, k, v)), True, 0.3, window).transpose(1, 2)
        cases.append(("attention", (q, k, v), dict(causal=True, scale=0.3, sliding_window=window, layout="BSHD"),
                      expected))
    qh, kh, vh = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    cases.append(("attention", (qh, kh, vh), dict(causal=False, scale=0.3, sliding_window=None, layout="BHSD"),
                  attn_ref.attention_bhsd(qh, kh, vh, False, 0.3, None)))

    tq, tk = _rand(7, 4, 8), _rand(9, 2, 8)
    tv = _rand(9, 2, 8)
    cu_q, cu_k = torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 4, 9], dtype=torch.int32)
    expected = attn_ref.varlen_attention(tq, tk, tv, [0, 3, 7], [0, 4, 9], True, 0.3, 2)
    for host in (([0, 3, 7], [0, 4, 9]), None):
        cases.append(("varlen_attention", (tq, tk, tv), dict(
            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=4, max_seqlen_k=5, causal=True, scale=0.3,
            sliding_window=2, cu_seqlens_host=host), expected))

    pq, kc, vc = _rand(2, 4, 8), _rand(6, 4, 2, 8), _rand(6, 4, 2, 8)
    tables, lens = torch.tensor([[0, 2], [5, 3]], dtype=torch.int32), torch.tensor([5, 8], dtype=torch.int32)
    cases.append(("paged_attention", (pq, kc, vc), dict(
        block_tables=tables, context_lens=lens, scale=0.3, sliding_window=None, max_context_len=8),
        attn_ref.paged_attention(pq, kc, vc, tables, lens, 0.3, None, 8)))
    cu_p, cq = torch.tensor([0, 3, 4], dtype=torch.int32), _rand(4, 4, 8)  # a 3-token chunk after 2 cached, a decode row
    expected = attn_ref.paged_prefill_attention(cq, kc, vc, tables, [0, 3, 4], [5, 8], 0.3, None)
    for host in (([0, 3, 4], [5, 8]), (None, None)):
        cases.append(("paged_prefill_attention", (cq, kc, vc, tables, cu_p, lens), dict(
            max_seqlen_q=3, max_context_len=8, scale=0.3, sliding_window=None, cu_seqlens_q_host=host[0],
            context_lens_host=host[1]), expected))

    x, res, w = _rand(3, 16), _rand(3, 16), _rand(16)
    cases.append(("rms_norm", (x, w), dict(eps=1e-6, weight_offset=1.0), norm.rms_norm(x, w, 1e-6, 1.0)))
    cases.append(("fused_add_rms_norm", (x, res, w), dict(eps=1e-6, weight_offset=0.0),
                  norm.fused_add_rms_norm(x, res, w, 1e-6, 0.0)))
    b = _rand(16)
    cases.append(("layer_norm", (x, (16,), w, b), dict(eps=1e-5), norm.layer_norm(x, (16,), w, b, 1e-5)))
    cases.append(("layer_norm", (x, (16,), None, None), dict(eps=1e-5), norm.layer_norm(x, (16,), None, None, 1e-5)))
    rx, cos, sin = _rand(5, 2, 8), _rand(5, 4), _rand(5, 4)
    for inter in (False, True):
        cases.append(("rope", (rx, cos, sin), dict(interleaved=inter), rope_ref.rope(rx, cos, sin, inter)))
    cases.append(("silu_and_mul", (x,), {}, activation.silu_and_mul(x)))
    cases.append(("gelu_and_mul", (x,), dict(approximate="tanh"), activation.gelu_and_mul(x, "tanh")))
    lw, lb = _rand(6, 16), _rand(6)
    cases.append(("linear", (x, lw, lb), {}, F.linear(x, lw, lb)))
    cases.append(("linear", (x, lw, None), {}, F.linear(x, lw)))
    # 24 output features: the native kernel answers (the packed torch one needs 16 | N), float32 sums in its own
    # order; the integers from _GEN too, so the case's rounding is the same on every run
    x4, qw, sz = _rand(3, 64), quantize.pack_int4(torch.randint(0, 16, (24, 64), generator=_GEN)), _rand(2, 24, 2)
    cases.append(("linear_int4", (x4, qw, sz, None), dict(group_size=32),
                  quantize.linear_int4(x4, qw, sz, None, group_size=32)))
    w8, s8 = torch.randint(-127, 128, (24, 64), dtype=torch.int8, generator=_GEN), _rand(1, 2).abs()  # 128-row blocks: the reference
    cases.append(("linear_w8", (x4, w8, s8, None), dict(block_size=(128, 32)),
                  quantize.linear_w8(x4, w8, s8, None, block_size=(128, 32))))
    ids, table = torch.tensor([[1, 0, 9], [4, 4, 2]]), _rand(10, 8)
    cases.append(("embedding", (ids, table), {}, F.embedding(ids, table)))

    logits, noise = _rand(3, 20), torch.rand(3, 20).clamp(1e-6, 1 - 1e-6)
    cases.append(("sample_topk", (logits, 5), dict(temperature=0.7, generator=None, noise=noise),
                  sampling.sample_topk(logits, 5, temperature=0.7, noise=noise)))
    cases.append(("sample_topp", (logits, 0.8), dict(temperature=1.3, generator=None, noise=noise),
                  sampling.sample_topp(logits, 0.8, temperature=1.3, noise=noise)))
    wide = _rand(3, 300)
    cases.append(("argmax", (wide[:, :256],), {}, argmax.argmax(wide[:, :256])))
    w8 = _rand(6, 16)
    for dtype, axis, scale in (("int8", 0, None), ("int8", -1, torch.rand(16) + 0.1), ("fp8_e4m3", 0, None)):
        q8, s8 = quantize.quantize(w8, dtype=dtype, scale=scale, axis=axis)
        cases.append(("quantize", (w8,), dict(dtype=dtype, scale=scale, axis=axis), (q8, s8)))
        cases.append(("dequantize", (q8, s8), dict(axis=axis, out_dtype=torch.bfloat16),
                      quantize.dequantize(q8, s8, axis=axis, out_dtype=torch.bfloat16)))
    return cases


CASES = _cases()


def _tuple(value) -> tuple:
    return value if isinstance(value, tuple) else (value,)


def _checks(args: tuple, *tests: str) -> tuple[str, ...]:
    """opcheck tests for these inputs: the schema test multiplies inputs, which float8 tensors do not support."""
    if any(isinstance(a, torch.Tensor) and a.dtype == torch.float8_e4m3fn for a in args):
        return tuple(t for t in tests if t != "test_schema")
    return tests


def _ids(case) -> str:
    return case[0]


def _schema_call(op: str, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """The same canonical call, in the form the torch.ops schema takes (what call_op builds)."""
    kwargs = dict(kwargs)
    if op == "varlen_attention":
        host = kwargs.pop("cu_seqlens_host")
        kwargs["cu_seqlens_host_q"], kwargs["cu_seqlens_host_k"] = (None, None) if host is None else host
    if op == "layer_norm":
        args = (args[0], list(args[1]), *args[2:])
    if op.startswith("sample_"):
        del kwargs["generator"]
    return args, kwargs


def test_every_tensor_op_is_registered() -> None:
    expected = {"attention", "varlen_attention", "paged_attention", "paged_prefill_attention", "store_kv_cache", "rms_norm",
                "fused_add_rms_norm", "layer_norm", "rope", "silu_and_mul", "gelu_and_mul", "linear", "linear_int4", "linear_w8",
                "embedding", "sample_topk", "sample_topp", "quantize", "dequantize", "rope_store_kv",
                "argmax"}
    assert set(OPS) == expected
    assert all(hasattr(torch.ops.layerzero, op) for op in expected)
    assert {c[0] for c in CASES} | {"store_kv_cache", "rope_store_kv"} == expected  # in-place ops: tested below


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_opcheck(case) -> None:
    op, args, kwargs, _ = case
    args, kwargs = _schema_call(op, args, kwargs)
    tests = _checks(args, "test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
    torch.library.opcheck(getattr(torch.ops.layerzero, op), args, kwargs, test_utils=tests)


@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_call_op_matches_reference(case) -> None:
    op, args, kwargs, expected = case
    out = call_op(op, *args, **kwargs)
    for got, want in zip(_tuple(out), _tuple(expected), strict=True):
        assert got.is_contiguous()
        assert got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-5, atol=1e-5)


def _store_inputs() -> tuple:
    key, value = _rand(3, 2, 8), _rand(3, 2, 8)
    return key, value, torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8), torch.tensor([0, 13, -1])


def test_store_kv_cache_mutates_caches() -> None:
    key, value, kc, vc, slots = _store_inputs()
    torch.library.opcheck(torch.ops.layerzero.store_kv_cache, (key, value, kc, vc, slots))
    key, value, kc, vc, slots = _store_inputs()
    want_k, want_v = kc.clone(), vc.clone()
    kv_cache.store_kv_cache(key, value, want_k, want_v, slots)
    assert call_op("store_kv_cache", key, value, kc, vc, slots) is None
    torch.testing.assert_close(kc, want_k)
    torch.testing.assert_close(vc, want_v)
    assert kc.view(-1, 2, 8)[13].equal(key[1]) and kc.view(-1, 2, 8)[0].equal(key[0])


def _rope_store_inputs(qk_norm: bool) -> tuple[tuple, dict]:
    _GEN.manual_seed(0)
    norms = (_rand(8), _rand(8)) if qk_norm else (None, None)
    args = (_rand(3, 4 + 2 * 2, 8), _rand(3, 4), _rand(3, 4), torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8),
            torch.tensor([0, 13, -1]), *norms)
    return args, dict(num_heads=4, eps=1e-6, weight_offset=1.0, interleaved=False)


@pytest.mark.parametrize("qk_norm", [False, True])
def test_rope_store_kv_returns_q_and_mutates_caches(qk_norm: bool) -> None:
    args, kwargs = _rope_store_inputs(qk_norm)
    torch.library.opcheck(torch.ops.layerzero.rope_store_kv, args, kwargs)
    args, kwargs = _rope_store_inputs(qk_norm)
    want_k, want_v = args[3].clone(), args[4].clone()
    want_q = rope_store_kv.rope_store_kv(*args[:3], want_k, want_v, *args[5:], **kwargs)
    got_q = call_op("rope_store_kv", *args, **kwargs)
    assert got_q.is_contiguous()
    torch.testing.assert_close(got_q, want_q)
    torch.testing.assert_close(args[3], want_k)
    torch.testing.assert_close(args[4], want_v)


def test_call_op_rejects_unknown_op_and_generators() -> None:
    with pytest.raises(KeyError):
        call_op("no_such_op", torch.ones(1))
    with pytest.raises(ValueError, match="noise"):
        call_op("sample_topk", torch.ones(2, 4), 2, generator=torch.Generator())


def _layerzero_targets(seen: list[str]):
    def backend(gm: torch.fx.GraphModule, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    return backend


def _block(x, residual, w, cos, sin, wq, wo, ids, table):
    """A tiny decoder block through the public API: embedding, fused norm, rope, attention, gated MLP, KV store."""
    h = lz.embedding(ids, table) + x
    normed, residual = lz.fused_add_rms_norm(h, residual, w)
    q = lz.linear(normed, wq).view(4, 2, 8)
    q = lz.rope(q, cos, sin)
    attn = lz.attention(q.unsqueeze(0), q[:, :1].unsqueeze(0), q[:, :1].unsqueeze(0), causal=True, layout="BSHD")
    out = lz.linear(attn.reshape(4, 16), wo)
    return lz.silu_and_mul(out) + lz.rms_norm(residual, w)[:, :8]


def _block_inputs() -> tuple:
    return (_rand(4, 16), _rand(4, 16), _rand(16), _rand(4, 4), _rand(4, 4), _rand(16, 16), _rand(16, 16),
            torch.tensor([1, 2, 3, 0]), _rand(5, 16))


def test_compile_fullgraph_keeps_layerzero_ops_opaque() -> None:
    torch._dynamo.reset()
    inputs = _block_inputs()
    seen: list[str] = []
    compiled = torch.compile(_block, fullgraph=True, backend=_layerzero_targets(seen))
    torch.testing.assert_close(compiled(*inputs), _block(*inputs), rtol=1e-5, atol=1e-5)
    ops = {t.split(".")[1] for t in seen if t.startswith("layerzero.")}
    assert ops == {"embedding", "fused_add_rms_norm", "linear", "rope", "attention", "silu_and_mul", "rms_norm"}


def test_compile_aot_eager_varlen_paged_and_store() -> None:
    torch._dynamo.reset()

    def serve_step(tq, tk, tv, cu, pq, kc, vc, tables, lens, slots):
        lz.store_kv_cache(tk[:2], tv[:2], kc, vc, slots)
        prefill = lz.varlen_attention(tq, tk, tv, cu, cu, 4, 4, causal=True, cu_seqlens_host=([0, 3, 7], [0, 3, 7]))
        decode = lz.paged_attention(pq, kc, vc, tables, lens, max_context_len=8)
        return prefill, decode

    def inputs():
        _GEN.manual_seed(0)  # both calls build the same inputs
        return (_rand(7, 4, 8), _rand(7, 2, 8), _rand(7, 2, 8), torch.tensor([0, 3, 7], dtype=torch.int32),
                _rand(2, 4, 8), _rand(6, 4, 2, 8), _rand(6, 4, 2, 8), torch.tensor([[0, 2], [5, 3]], dtype=torch.int32),
                torch.tensor([5, 8], dtype=torch.int32), torch.tensor([1, 22]))

    eager_in, compiled_in = inputs(), inputs()
    want = serve_step(*eager_in)
    got = torch.compile(serve_step, fullgraph=True, backend="aot_eager")(*compiled_in)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled_in[5], eager_in[5])  # the in-place store happened under compile too


def test_compile_aot_eager_sampling_and_quantization() -> None:
    torch._dynamo.reset()

    def step(logits, noise, w):
        q, scale = lz.quantize(w, dtype="int8", axis=0)
        return (lz.sample_topk(logits, 4, noise=noise), lz.sample_topp(logits, 0.9, noise=noise),
                lz.dequantize(q, scale), lz.argmax(logits))

    inputs = (_rand(2, 30), torch.rand(2, 30).clamp(1e-6, 1 - 1e-6), _rand(8, 4))
    for got, want in zip(torch.compile(step, fullgraph=True, backend="aot_eager")(*inputs), step(*inputs), strict=True):
        torch.testing.assert_close(got, want)


def test_compile_inductor_default_backend() -> None:
    """Inductor turns each layerzero op into an extern call; only lz ops here, so no C++ kernel has to be built."""
    torch._dynamo.reset()

    def mlp(x, w_up, w_norm):
        return lz.silu_and_mul(lz.rms_norm(lz.linear(x, w_up), w_norm))

    inputs = (_rand(4, 16), _rand(32, 16), _rand(32))
    start = time.perf_counter()
    compiled = torch.compile(mlp, fullgraph=True)
    torch.testing.assert_close(compiled(*inputs), mlp(*inputs), rtol=1e-5, atol=1e-5)
    assert time.perf_counter() - start < 30


def _to(value, device: str):
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, tuple):
        return tuple(_to(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to(v, device) for k, v in value.items()}
    return value


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("case", CASES, ids=_ids)
def test_cuda_opcheck_and_reference(case) -> None:
    op, args, kwargs, expected = _to(case, "cuda")
    schema_args, schema_kwargs = _schema_call(op, args, kwargs)
    torch.library.opcheck(getattr(torch.ops.layerzero, op), schema_args, schema_kwargs,
                          test_utils=_checks(schema_args, "test_schema", "test_faketensor"))
    out = call_op(op, *args, **kwargs)
    for got, want in zip(_tuple(out), _tuple(expected), strict=True):
        assert got.is_cuda and got.is_contiguous() and got.dtype == want.dtype
        torch.testing.assert_close(got.float(), want.float(), rtol=1e-4, atol=1e-4)
