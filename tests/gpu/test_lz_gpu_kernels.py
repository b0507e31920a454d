"""layerzero's Triton kernels compiled on CUDA at real model shapes: match the PyTorch reference,
launch without host syncs, and capture and replay in a CUDA graph with new inputs."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz

from layerzero.kernels.reference import activation as act_ref
from layerzero.kernels.reference import attention as attn_ref
from layerzero.kernels.reference import kv_cache as kv_ref
from layerzero.kernels.reference import norm as norm_ref
from layerzero.kernels.reference import rope as rope_ref

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

pytest.importorskip("triton")
from layerzero.kernels.triton import activation, kv_cache, norm, paged_attention, rope, varlen_attention  # noqa: E402

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 1e-2}  # tools/inspect.py TOLERANCES
# (heads, kv_heads, head_dim, window): Llama-3.2-1B, Llama-3.1-8B, Gemma-3-1B (sliding layers)
ATTENTION_SHAPES = [(32, 8, 64, None), (32, 8, 128, None), (4, 1, 256, 512)]


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    tol = TOL[expected.dtype]
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


def _attention_expected(fn, dtype, *args, **kwargs) -> torch.Tensor:
    """The reference on the same (rounded) inputs evaluated in float32, rounded once: SDPA's own
    half-precision backends would add errors of their own at these lengths."""
    up = [a.float() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    return fn(*up, **kwargs).to(dtype)


def _graph_replay(fn, refresh, check) -> None:
    """Warm up (compiles), capture `fn` into a CUDA graph, refresh the static inputs in place, replay, check."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    refresh()
    graph.replay()
    torch.cuda.synchronize()
    check(out)


class _NoSync:
    """Inside: any host-device synchronization raises."""

    def __enter__(self) -> None:
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")

    def __exit__(self, *exc: object) -> None:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1152, 2048, 4096, 12288])
def test_rms_norm_and_fused_add(dtype, hidden):
    x = torch.randn(1000, hidden, device="cuda", dtype=dtype)
    r = torch.randn_like(x)
    w = torch.randn(hidden, device="cuda", dtype=dtype)
    with _NoSync():
        out = norm.rms_norm(x, w, eps=1e-6, weight_offset=1.0)
        normed, summed = norm.fused_add_rms_norm(x, r, w, eps=1e-6, weight_offset=0.0)
    _close(out, norm_ref.rms_norm(x, w, 1e-6, 1.0))
    ref_normed, ref_summed = norm_ref.fused_add_rms_norm(x, r, w, 1e-6, 0.0)
    _close(summed, ref_summed)
    _close(normed, ref_normed)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("heads,head_dim", [(32, 64), (32, 128), (4, 256), (12, 80)])
def test_rope(dtype, interleaved, heads, head_dim):
    x = torch.randn(777, heads, head_dim, device="cuda", dtype=dtype)
    angles = torch.rand(777, head_dim // 2, device="cuda") * 100.0
    cos, sin = angles.cos(), angles.sin()
    with _NoSync():
        out = rope.rope(x, cos, sin, interleaved=interleaved)
    _close(out, rope_ref.rope(x, cos, sin, interleaved))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("inner", [6912, 8192, 14336])
def test_gated_activations(dtype, inner):
    x = torch.randn(300, 2 * inner, device="cuda", dtype=dtype) * 3.0
    with _NoSync():
        silu = activation.silu_and_mul(x)
        gelu_tanh = activation.gelu_and_mul(x, approximate="tanh")
        gelu = activation.gelu_and_mul(x, approximate="none")
    # float32 evaluation rounded once: the half-precision reference rounds act(gate) before the product
    _close(silu, act_ref.silu_and_mul(x.float()).to(dtype))
    _close(gelu_tanh, act_ref.gelu_and_mul(x.float(), "tanh").to(dtype))
    _close(gelu, act_ref.gelu_and_mul(x.float(), "none").to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_store_kv_cache(dtype):
    blocks, block_size, kv_heads, d, tokens = 512, 16, 8, 128, 300
    k_cache = torch.randn(blocks, block_size, kv_heads, d, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    key = torch.randn(tokens, kv_heads, d, device="cuda", dtype=dtype)
    value = torch.randn_like(key)
    slots = torch.randperm(blocks * block_size, device="cuda")[:tokens]
    slots[::7] = -1
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    with _NoSync():
        kv_cache.store_kv_cache(key, value, k_cache, v_cache, slots)
    kv_ref.store_kv_cache(key, value, ref_k, ref_v, slots)
    assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)


def _paged_inputs(batch, heads, kv_heads, head_dim, dtype, max_len, block_size=16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    width = -(-max_len // block_size)
    blocks = batch * width + 7
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    v_cache = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    tables = torch.randperm(blocks, device="cuda", generator=g)[: batch * width].view(batch, width).int()
    ctx = torch.randint(1, max_len + 1, (batch,), device="cuda", generator=g, dtype=torch.int32)
    ctx[0] = max_len
    q = torch.randn(batch, heads, head_dim, device="cuda", dtype=dtype, generator=g)
    return q, k_cache, v_cache, tables, ctx


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window", ATTENTION_SHAPES)
# 128 and 256 sequences take the tiles for many programs per SM (as do 64 with 7 splits)
@pytest.mark.parametrize("batch,max_len", [(1, 4096), (16, 1024), (64, 777), (128, 300), (256, 211)])
def test_paged_attention(dtype, heads, kv_heads, head_dim, window, batch, max_len):
    q, kc, vc, tables, ctx = _paged_inputs(batch, heads, kv_heads, head_dim, dtype, max_len)
    scale = head_dim**-0.5
    expected = _attention_expected(attn_ref.paged_attention, dtype, q, kc, vc, tables, ctx, scale, window, max_len)
    for splits in (None, 1, 7):
        with _NoSync():
            out = paged_attention.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=scale,
                                                  sliding_window=window, max_context_len=max_len, num_splits=splits)
        _close(out, expected)


def _varlen_inputs(q_lens, k_lens, heads, kv_heads, head_dim, dtype, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(sum(q_lens), heads, head_dim, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(sum(k_lens), kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(sum(k_lens), kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    cu_q = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(k_lens).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window", [*ATTENTION_SHAPES, (8, 8, 96, None), (4, 2, 8, None)])
@pytest.mark.parametrize("causal", [True, False])
def test_varlen_attention(dtype, heads, kv_heads, head_dim, window, causal):
    q_lens, k_lens = [1024, 1, 300, 77, 0], [1024, 513, 300, 1100, 5]  # prefill, decode, chunked prefill, empty
    q, k, v, cu_q, cu_k = _varlen_inputs(q_lens, k_lens, heads, kv_heads, head_dim, dtype)
    scale = head_dim**-0.5
    with _NoSync():
        out = varlen_attention.varlen_attention(
            q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max(q_lens), max_seqlen_k=max(k_lens),
            causal=causal, scale=scale, sliding_window=window, cu_seqlens_host=None,
        )
    expected = _attention_expected(attn_ref.varlen_attention, dtype, q, k, v, cu_q.tolist(), cu_k.tolist(),
                                   causal, scale, window)
    _close(out, expected)


def test_graph_capture_replay_norms_rope_activations():
    x = torch.randn(64, 2048, device="cuda", dtype=torch.bfloat16)
    r, w = torch.randn_like(x), torch.randn(2048, device="cuda", dtype=torch.bfloat16)
    qk = torch.randn(64, 40, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = torch.rand(64, 64, device="cuda"), torch.rand(64, 64, device="cuda")
    gate_up = torch.randn(64, 2 * 8192, device="cuda", dtype=torch.bfloat16)

    def run():
        return (norm.rms_norm(x, w, eps=1e-6, weight_offset=1.0),
                *norm.fused_add_rms_norm(x, r, w, eps=1e-6, weight_offset=0.0),
                rope.rope(qk, cos, sin, interleaved=False),
                activation.silu_and_mul(gate_up), activation.gelu_and_mul(gate_up, approximate="tanh"))

    def refresh():
        for t in (x, r, qk, gate_up, cos, sin):
            t.copy_(torch.randn_like(t))

    def check(out):
        _close(out[0], norm_ref.rms_norm(x, w, 1e-6, 1.0))
        ref_normed, ref_summed = norm_ref.fused_add_rms_norm(x, r, w, 1e-6, 0.0)
        _close(out[1], ref_normed)
        _close(out[2], ref_summed)
        _close(out[3], rope_ref.rope(qk, cos, sin, False))
        _close(out[4], act_ref.silu_and_mul(gate_up.float()).to(torch.bfloat16))
        _close(out[5], act_ref.gelu_and_mul(gate_up.float(), "tanh").to(torch.bfloat16))

    _graph_replay(run, refresh, check)


def test_graph_capture_replay_kv_store_with_padding():
    k_cache = torch.zeros(64, 16, 8, 128, device="cuda", dtype=torch.bfloat16)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(32, 8, 128, device="cuda", dtype=torch.bfloat16)
    value = torch.randn_like(key)
    slots = torch.arange(32, device="cuda")

    def refresh():
        key.copy_(torch.randn_like(key))
        value.copy_(torch.randn_like(value))
        new = torch.randperm(64 * 16, device="cuda")[:32]
        new[20:] = -1  # the padded tail of a bucketed batch
        slots.copy_(new)
        k_cache.zero_()
        v_cache.zero_()

    def check(_):
        ref_k, ref_v = torch.zeros_like(k_cache), torch.zeros_like(v_cache)
        kv_ref.store_kv_cache(key, value, ref_k, ref_v, slots)
        assert torch.equal(k_cache, ref_k) and torch.equal(v_cache, ref_v)

    _graph_replay(lambda: kv_cache.store_kv_cache(key, value, k_cache, v_cache, slots), refresh, check)


@pytest.mark.parametrize("splits", [None, 1])
def test_graph_capture_replay_paged_attention(splits):
    batch, heads, kv_heads, d, max_len = 8, 32, 8, 128, 2048
    q, kc, vc, tables, ctx = _paged_inputs(batch, heads, kv_heads, d, torch.bfloat16, max_len)

    def run():
        return paged_attention.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=d**-0.5,
                                               sliding_window=None, max_context_len=max_len, num_splits=splits)

    def refresh():
        nq, nkc, nvc, nt, nctx = _paged_inputs(batch, heads, kv_heads, d, torch.bfloat16, max_len, seed=1)
        for static, new in ((q, nq), (kc, nkc), (vc, nvc), (tables, nt), (ctx, nctx)):
            static.copy_(new)

    def check(out):
        expected = _attention_expected(attn_ref.paged_attention, torch.bfloat16, q, kc, vc, tables, ctx,
                                       d**-0.5, None, max_len)
        _close(out, expected)

    _graph_replay(run, refresh, check)


@pytest.mark.parametrize("window", [None, 100])
def test_paged_attention_skips_empty_splits_in_a_graph(nan_fresh_tensors, window):
    """A batch-1 decode's capacity of 1,152 keys (18 splits) over contexts of 1-300 keys, as a short sequence meets a
    long max_seq_len: the splits past the keys return before their wait and write nothing (the partials start as NaN
    here), the merge reads only those that hold keys; replayed from a graph with new context lengths, no host sync."""
    heads, kv_heads, d, capacity = 32, 4, 128, 1152
    q, kc, vc, tables, ctx = _paged_inputs(1, heads, kv_heads, d, torch.bfloat16, capacity)
    ctx.fill_(193)

    def run():
        return paged_attention.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=d**-0.5,
                                               sliding_window=window, max_context_len=capacity)

    def check(out):
        expected = _attention_expected(attn_ref.paged_attention, torch.bfloat16, q, kc, vc, tables, ctx, d**-0.5,
                                       window, capacity)
        _close(out, expected)

    assert paged_attention.choose_splits(1, kv_heads, capacity, paged_attention.sm_count(q.device)) > 8
    with _NoSync():
        out = run()
    check(out)
    for length in (1, 64, 65, 300):
        _graph_replay(run, lambda: ctx.fill_(length), check)


def test_graph_capture_replay_varlen_attention():
    """Captured once for a bound on the query length; replayed with other sequence lengths of that bound."""
    heads, kv_heads, d, max_q = 32, 8, 64, 512
    q, k, v, cu_q, cu_k = _varlen_inputs([512, 100, 12], [512, 400, 12], heads, kv_heads, d, torch.float16)

    def run():
        return varlen_attention.varlen_attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q,
                                                 max_seqlen_k=max_q, causal=True, scale=d**-0.5,
                                                 sliding_window=None, cu_seqlens_host=None)

    def refresh():
        cu_q.copy_(torch.tensor([0, 300, 600, 624], dtype=torch.int32))
        cu_k.copy_(torch.tensor([0, 500, 900, 924], dtype=torch.int32))
        for t in (q, k, v):
            t.copy_(torch.randn_like(t))

    def check(out):
        expected = _attention_expected(attn_ref.varlen_attention, torch.float16, q, k, v, cu_q.tolist(),
                                       cu_k.tolist(), True, d**-0.5, None)
        _close(out, expected)

    _graph_replay(run, refresh, check)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,window", ATTENTION_SHAPES)
def test_paged_prefill_attention(dtype, heads, kv_heads, head_dim, window):
    """Chunks after cached prefixes, a whole prompt and decode rows in one mixed batch, over scattered blocks."""
    q_lens, ctx_lens, block_size = [512, 1, 300, 77, 1], [1536, 513, 300, 1100, 9], 16
    g = torch.Generator(device="cuda").manual_seed(1)
    width = -(-max(ctx_lens) // block_size)
    blocks = len(ctx_lens) * width + 5
    kc = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    vc = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    tables = torch.randperm(blocks, device="cuda", generator=g)[: len(ctx_lens) * width].view(len(ctx_lens), width).int()
    q = torch.randn(sum(q_lens), heads, head_dim, device="cuda", dtype=dtype, generator=g)
    bounds = [0, *torch.tensor(q_lens).cumsum(0).tolist()]
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    ctx = torch.tensor(ctx_lens, dtype=torch.int32, device="cuda")
    scale = head_dim**-0.5
    with _NoSync():
        out = varlen_attention.paged_prefill_attention(
            q, kc, vc, block_tables=tables, cu_seqlens_q=cu, context_lens=ctx, max_seqlen_q=max(q_lens),
            max_context_len=max(ctx_lens), scale=scale, sliding_window=window,
        )
    expected = _attention_expected(attn_ref.paged_prefill_attention, dtype, q, kc, vc, tables, bounds, ctx_lens,
                                   scale, window)
    _close(out, expected)



def test_attention_compiles_once_whatever_the_block_table_width():
    """A batch's block-table width (its longest context in blocks) and the decode split count change from step to
    step: neither may compile a new binary in the middle of serving, and every width still computes right."""
    from triton import knobs

    compiled: list[str] = []
    hook = knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: compiled.append(str(kw.get("repr", "?")).split("[")[0])
    try:
        heads, kv_heads, head_dim, block_size, dtype = 8, 2, 64, 16, torch.bfloat16
        after_width: list[int] = []
        for width in (1, 16, 17, 33, 48, 5):
            ctx_len = width * block_size - 3
            kc = torch.randn(width * 2, block_size, kv_heads, head_dim, device="cuda", dtype=dtype)
            vc = torch.randn_like(kc)
            tables = torch.randperm(width * 2, device="cuda").to(torch.int32).view(2, width)
            ctx = torch.tensor([ctx_len, 2], dtype=torch.int32, device="cuda")
            q = torch.randn(2, heads, head_dim, device="cuda", dtype=dtype)
            expected = _attention_expected(attn_ref.paged_attention, dtype, q, kc, vc, tables, ctx, 0.125, None,
                                           ctx_len)
            for splits in (1, 2, 16, 3):
                _close(paged_attention.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx, scale=0.125,
                                                       sliding_window=None, max_context_len=ctx_len,
                                                       num_splits=splits), expected)
            cu = torch.tensor([0, 1, 2], dtype=torch.int32, device="cuda")
            _close(varlen_attention.paged_prefill_attention(q, kc, vc, block_tables=tables, cu_seqlens_q=cu,
                                                            context_lens=ctx, max_seqlen_q=1, max_context_len=ctx_len,
                                                            scale=0.125, sliding_window=None), expected)
            after_width.append(len(compiled))
    finally:
        knobs.runtime.jit_post_compile_hook = hook
    assert after_width[1:] == after_width[:1] * (len(after_width) - 1), \
        f"binaries compiled by the end of each width: {after_width} ({compiled})"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,kv_heads,head_dim,qk_norm", [(32, 8, 64, False), (32, 8, 128, True), (4, 1, 256, True)])
def test_rope_store_kv(dtype, heads, kv_heads, head_dim, qk_norm):
    """The fused attention prologue (QK-norm, RoPE, K/V store) matches the reference composition, slot -1 skipped,
    and replays in a graph with new inputs."""
    from layerzero.kernels.reference import rope_store_kv as fused_ref
    from layerzero.kernels.triton import rope_kv

    g = torch.Generator(device="cuda").manual_seed(3)
    tokens, blocks, block_size = 300, 64, 16
    wide = torch.randn(tokens, heads + 2 * kv_heads + 1, head_dim, device="cuda", dtype=dtype, generator=g)
    qkv = wide[:, : heads + 2 * kv_heads]  # a strided view, as sliced from the projection
    angles = torch.rand(tokens, head_dim // 2, device="cuda", generator=g) * 6.28
    cos, sin = angles.cos(), angles.sin()
    weights = [torch.rand(head_dim, device="cuda", dtype=dtype, generator=g) + 0.5 for _ in range(2)] if qk_norm \
        else [None, None]
    slots = torch.randperm(blocks * block_size, device="cuda", generator=g)[:tokens]
    slots[::5] = -1
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    v_cache = torch.randn_like(k_cache)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    options = dict(num_heads=heads, eps=1e-6, weight_offset=1.0 if qk_norm else 0.0, interleaved=False)

    def run() -> torch.Tensor:
        return rope_kv.rope_store_kv(qkv, cos, sin, k_cache, v_cache, slots, *weights, **options)

    with _NoSync():
        q = run()
    want = fused_ref.rope_store_kv(qkv, cos, sin, ref_k, ref_v, slots, *weights, **options)
    if dtype == torch.float16:  # norm then rotation: a rounding apart, one half-precision ulp at magnitude ~4
        torch.testing.assert_close(q, want, rtol=4e-3, atol=4e-3)
    else:
        _close(q, want)
    torch.testing.assert_close(k_cache, ref_k, rtol=2 * TOL[dtype], atol=4 * TOL[dtype])
    _close(v_cache, ref_v)

    def refresh() -> None:
        wide.copy_(torch.randn_like(wide))

    def check(out: torch.Tensor) -> None:
        expected = fused_ref.rope_store_kv(qkv, cos, sin, ref_k, ref_v, slots, *weights, **options)
        torch.testing.assert_close(out, expected, rtol=2 * TOL[dtype], atol=4 * TOL[dtype])
        torch.testing.assert_close(k_cache, ref_k, rtol=2 * TOL[dtype], atol=4 * TOL[dtype])

    _graph_replay(run, refresh, check)


@pytest.mark.parametrize("tokens", [1, 8])
@pytest.mark.parametrize("hidden,heads,kv_heads", [(2048, 32, 4), (4096, 32, 8)])  # Qwen3-30B-A3B, Llama-3.1-8B
def test_rope_store_kv_sums_its_projections_slices(tokens, hidden, heads, kv_heads):
    """With its QKV weight, the prologue's kernel (triton.rope_store_kv_splitk) sums the split-K GEMV's slices where
    it reads them: against the reference's linear-then-prologue in bf16, with fresh inputs replayed from a graph."""
    from layerzero.kernels.reference import rope_store_kv as fused_ref

    g = torch.Generator(device="cuda").manual_seed(tokens)
    head_dim, blocks, block_size = 128, 16, 16
    dtype = torch.bfloat16
    x = torch.randn(tokens, hidden, device="cuda", dtype=dtype, generator=g)
    proj = (torch.randn((heads + 2 * kv_heads) * head_dim, hidden, device="cuda", generator=g) * hidden ** -0.5) \
        .to(dtype)
    angles = torch.rand(tokens, head_dim // 2, device="cuda", generator=g) * 6.28
    cos, sin = angles.cos(), angles.sin()
    weights = [torch.rand(head_dim, device="cuda", dtype=dtype, generator=g) + 0.5 for _ in range(2)]
    slots = torch.randperm(blocks * block_size, device="cuda", generator=g)[:tokens]
    k_cache = torch.randn(blocks, block_size, kv_heads, head_dim, device="cuda", dtype=dtype, generator=g)
    v_cache = torch.randn_like(k_cache)
    ref_k, ref_v = k_cache.clone(), v_cache.clone()
    options = dict(num_heads=heads, eps=1e-6, weight_offset=0.0, interleaved=False)
    call = (x, cos, sin, k_cache, v_cache, slots, *weights)
    assert lz.which("rope_store_kv", *call, proj, **options)["kernel_id"] == "triton.rope_store_kv_splitk"

    def run() -> torch.Tensor:
        return lz.rope_store_kv(*call, proj=proj, **options)

    def refresh() -> None:
        x.copy_(torch.randn(x.shape, device="cuda", generator=g))

    def check(out: torch.Tensor) -> None:
        expected = fused_ref.rope_store_kv(x, cos, sin, ref_k, ref_v, slots, *weights, proj=proj, **options)
        torch.testing.assert_close(out, expected, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(k_cache, ref_k, rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(v_cache, ref_v, rtol=2e-2, atol=2e-2)

    with _NoSync():
        out = run()
    check(out)
    _graph_replay(run, refresh, check)


@pytest.mark.parametrize("rows", [1, 8])
@pytest.mark.parametrize("kernel,n,k", [
    ("linear", 16384, 2048), ("linear", 4096, 14336),  # Llama-3.2-1B gate+up, Llama-3.1-8B down
    ("linear_splitk", 2048, 4096), ("linear_splitk", 2048, 8192),  # Qwen3-30B-A3B's O, Llama-3.2-1B's down
    ("linear_splitk", 3072, 4096), ("linear_splitk", 4096, 4096),  # Llama-3.1-8B's QKV at TP=2, its O
])
def test_skinny_linear(rows, kernel, n, k):
    """Decode's projections through the Triton GEMV or its split-K form: close to cuBLAS's result, chosen by
    layerzero at these shapes, replayed in a graph with new inputs (split-K's partials from the graph's pool)."""
    import layerzero as lz
    from layerzero.kernels.triton import gemv

    fn = gemv.linear_gemv if kernel == "linear" else gemv.linear_splitk
    g = torch.Generator(device="cuda").manual_seed(5)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g) * 0.02
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g)
    assert lz.which("linear", x, w)["kernel_id"] == f"triton.{kernel}"
    with _NoSync():
        y = fn(x, w, bias)
    want = (x.float() @ w.float().T + bias.float()).to(torch.bfloat16)
    torch.testing.assert_close(y, want, rtol=2e-2, atol=2e-2)

    def refresh() -> None:
        x.copy_(torch.randn_like(x))

    def check(out: torch.Tensor) -> None:
        torch.testing.assert_close(out, (x.float() @ w.float().T + bias.float()).to(torch.bfloat16), rtol=2e-2,
                                   atol=2e-2)

    _graph_replay(lambda: fn(x, w, bias), refresh, check)
