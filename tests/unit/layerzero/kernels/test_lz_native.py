"""The native C kernels (layerzero/kernels/native) against float64 references on fresh random inputs: the 4-bit,
8-bit, bfloat16- and float32-weight linears in their AVX-512 and portable builds, RMSNorm, RoPE, the KV store, the gated activations, and paged
attention for decode, prefill and mixed steps; a row's result must not depend on what shares its call; builds that
fail say why."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.kernels.native import activation, attention, linear, norm, rope_kv
from layerzero.kernels.native.build import NativeBuildError, build
from layerzero.kernels.reference import activation as act_ref
from layerzero.kernels.reference import attention as attn_ref
from layerzero.kernels.reference import kv_cache as kv_ref
from layerzero.kernels.reference import rope as rope_ref
from layerzero.kernels.reference.quantize import dequantize_int4, pack_int4

AVX2 = ("-mno-avx512f",)  # the build for CPUs without AVX-512 (AVX2 and FMA where this CPU has them)
PORTABLE = ("-mno-avx512f", "-mno-avx2")  # plain C: CPUs with neither
BUILDS = pytest.mark.parametrize("extra", [(), AVX2, PORTABLE], ids=["native-build", "avx2-build", "portable-build"])


def _int4_case(seed: int, rows: int, n: int, k: int, group: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    qweight = pack_int4(torch.randint(0, 16, (n, k), generator=gen))
    sz = torch.randn(k // group, n, 2, generator=gen) * torch.tensor([0.02, 0.1])
    return torch.randn(rows, k, generator=gen), qweight, sz, torch.randn(n, generator=gen)


@BUILDS
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 9), n=st.integers(1, 40), chunks=st.integers(1, 6),
       group=st.sampled_from([32, 64]), bias=st.booleans())
def test_int4_linear_matches_float64(extra: tuple[str, ...], seed: int, rows: int, n: int, chunks: int, group: int,
                                     bias: bool) -> None:
    k = chunks * group
    x, qweight, sz, b = _int4_case(seed, rows, n, k, group)
    b = b if bias else None
    got = linear.linear_int4(x, qweight, sz, b, group_size=group, _extra=extra)
    want = x.double() @ dequantize_int4(qweight, sz.double(), group).double().T + (0 if b is None else b.double())
    assert got.dtype == torch.float32 and got.shape == (rows, n)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * want.abs().max().item())
    alone = torch.cat([linear.linear_int4(x[i : i + 1], qweight, sz, b, group_size=group, _extra=extra)
                       for i in range(rows)])
    assert torch.equal(alone, got)  # bit for bit: rows are tiled four at a time, each with the same arithmetic


@BUILDS
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 9), n=st.integers(1, 40), blocks=st.integers(1, 6),
       block=st.sampled_from([16, 32, 64]), bias=st.booleans())
def test_int8_block_linear_matches_float64(extra: tuple[str, ...], seed: int, rows: int, n: int, blocks: int,
                                           block: int, bias: bool) -> None:
    gen = torch.Generator().manual_seed(seed)
    k = blocks * block
    w = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
    scale = torch.rand(n, blocks, generator=gen) * 0.02  # GGUF Q8_0 is blocks of 32
    x, b = torch.randn(rows, k, generator=gen), (torch.randn(n, generator=gen) if bias else None)
    got = linear.linear_w8_int8(x, w, scale, b, block_size=(1, block), _extra=extra)
    dense = w.double() * scale.double().repeat_interleave(block, dim=1)
    want = x.double() @ dense.T + (0 if b is None else b.double())
    # float32 accumulation errs relative to the terms' magnitudes, not the sum's (which may cancel to ~0)
    terms = x.double().abs() @ dense.abs().T
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * terms.max().item())
    alone = torch.cat([linear.linear_w8_int8(x[i : i + 1], w, scale, b, block_size=(1, block), _extra=extra)
                       for i in range(rows)])
    assert torch.equal(alone, got)


@BUILDS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), rows=st.integers(1, 9), n=st.integers(1, 40), steps=st.integers(1, 40),
       bias=st.booleans())
def test_dense_linear_matches_float64(extra: tuple[str, ...], dtype: torch.dtype, seed: int, rows: int, n: int,
                                      steps: int, bias: bool) -> None:
    """The bf16 and float32 GEMVs: float32 products of the stored weights, summed within float32's error."""
    fn = linear.linear_bf16 if dtype == torch.bfloat16 else linear.linear_f32
    gen = torch.Generator().manual_seed(seed)
    k = 16 * steps
    w = torch.randn(n, k, generator=gen).to(dtype)
    x, b = torch.randn(rows, k, generator=gen), (torch.randn(n, generator=gen) if bias else None)
    got = fn(x, w, b, _extra=extra)
    want = x.double() @ w.double().T + (0 if b is None else b.double())  # the stored values, exactly
    terms = x.double().abs() @ w.double().abs().T
    assert got.dtype == torch.float32
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5 * terms.max().item())
    alone = torch.cat([fn(x[i : i + 1], w, b, _extra=extra) for i in range(rows)])
    assert torch.equal(alone, got)



@BUILDS
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "f32"])
@pytest.mark.parametrize("n", [4, 7, 16, 21, 37])
@pytest.mark.parametrize("k", [96, 1024])
def test_a_lone_row_takes_four_outputs_at_a_time_with_the_bits_of_a_batch(extra: tuple[str, ...],
                                                                          dtype: torch.dtype, n: int, k: int) -> None:
    """One row of x runs four output rows at a time (the rest in pairs; long rows fetch the next four ahead); each
    output has the bits that row gets among others (the pairs' path), whatever is left over after the fours."""
    fn = linear.linear_bf16 if dtype == torch.bfloat16 else linear.linear_f32
    gen = torch.Generator().manual_seed(n)
    w, x, b = torch.randn(n, k, generator=gen).to(dtype), torch.randn(3, k, generator=gen), torch.randn(n, generator=gen)
    batch = fn(x, w, b, _extra=extra)
    for i in range(3):
        assert torch.equal(fn(x[i : i + 1], w, b, _extra=extra), batch[i : i + 1])
    want = x.double() @ w.double().T + b.double()
    assert torch.allclose(batch.double(), want, rtol=1e-5, atol=1e-4)

def test_f32_linear_is_chosen_for_a_decodes_rows() -> None:
    w = torch.randn(8, 64)
    assert lz.which("linear", torch.randn(linear.F32_MAX_ROWS, 64), w)["kernel_id"] == "native.linear_f32_cpu"
    report = lz.explain("linear", torch.randn(linear.F32_MAX_ROWS + 1, 64), w)
    assert f"past {linear.F32_MAX_ROWS}" in str(next(c for c in report.candidates
                                                   if c.kernel_id == "native.linear_f32_cpu"))
    report = lz.explain("linear", torch.randn(2, 40), torch.randn(8, 40))
    assert "16 columns a step" in str(next(c for c in report.candidates if c.kernel_id == "native.linear_f32_cpu"))
    report = lz.explain("linear", torch.randn(2, 64), w.bfloat16())
    assert "float32 weights only" in str(next(c for c in report.candidates if c.kernel_id == "native.linear_f32_cpu"))


def test_bf16_linear_is_chosen_for_float32_inputs_only() -> None:
    w = torch.randn(8, 64).bfloat16()
    assert lz.which("linear", torch.randn(2, 64), w)["kernel_id"] == "native.linear_bf16_cpu"
    for x in (torch.randn(2, 64).bfloat16(), torch.randn(2, 64).half()):  # never via the float32 cast of both
        report = lz.explain("linear", x, w.to(x.dtype))
        native = next(c for c in report.candidates if c.kernel_id == "native.linear_bf16_cpu")
        assert not native.valid and "float32 activations" in str(native.reasons)
    report = lz.explain("linear", torch.randn(2, 40), torch.randn(8, 40).bfloat16())
    assert "16 columns a step" in str(next(c for c in report.candidates if c.kernel_id == "native.linear_bf16_cpu"))
    with pytest.raises(TypeError, match="bfloat16 weights"):
        linear.linear_bf16(torch.randn(2, 64), torch.randn(8, 64))


def test_int4_linear_takes_bf16_and_3d_inputs() -> None:
    x, qweight, sz, _ = _int4_case(3, 6, 48, 128, 32)
    want = linear.linear_int4(x, qweight, sz, None, group_size=32)
    got = linear.linear_int4(x.view(2, 3, 128), qweight, sz, None, group_size=32)
    assert got.shape == (2, 3, 48) and torch.equal(got.view(6, 48), want)
    half = linear.linear_int4(x.bfloat16(), qweight, sz, None, group_size=32)
    assert half.dtype == torch.bfloat16


def test_group_and_block_constraints_are_explained() -> None:
    x, qweight, _, _ = _int4_case(1, 1, 16, 64, 32)
    report = lz.explain("linear_int4", x, qweight, torch.randn(4, 16, 2), None, group_size=16)
    native = next(c for c in report.candidates if c.kernel_id == "native.linear_int4_cpu")
    assert not native.valid and "32-column chunks" in str(native.reasons)
    w = torch.zeros(16, 64, dtype=torch.int8)
    report = lz.explain("linear_w8", x, w, torch.ones(16, 8), None, block_size=(1, 8))
    native = next(c for c in report.candidates if c.kernel_id == "native.linear_w8_int8_cpu")
    assert not native.valid and "multiple of 16" in str(native.reasons)


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_matches_float64(offset: float) -> None:
    gen = torch.Generator().manual_seed(7)
    x, res = torch.randn(5, 3, 72, generator=gen), torch.randn(5, 3, 72, generator=gen)
    w = torch.randn(72, generator=gen)
    x_before, res_before = x.clone(), res.clone()

    def ref(v: torch.Tensor) -> torch.Tensor:
        v = v.double()
        return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + 1e-6) * (w.double() + offset)

    got = norm.rms_norm(x, w, eps=1e-6, weight_offset=offset)
    assert torch.allclose(got.double(), ref(x), rtol=1e-5, atol=1e-5)
    normed, summed = norm.fused_add_rms_norm(x, res, w, eps=1e-6, weight_offset=offset)
    assert torch.equal(summed, x + res) and torch.allclose(normed.double(), ref(x + res), rtol=1e-5, atol=1e-5)
    assert torch.equal(x, x_before) and torch.equal(res, res_before)  # the inputs are left alone
    strided = torch.randn(4, 200)[:, :72]  # a non-contiguous view normalizes the same
    assert torch.equal(norm.rms_norm(strided, w, eps=1e-6, weight_offset=offset),
                       norm.rms_norm(strided.contiguous(), w, eps=1e-6, weight_offset=offset))


@BUILDS
@pytest.mark.parametrize("act", ["silu", "tanh", "none"])
def test_gated_activations_match_float64(extra: tuple[str, ...], act: str) -> None:
    x = torch.randn(3, 2, 2 * 40, generator=torch.Generator().manual_seed(11)) * 4
    x[0, 0, :8] = torch.tensor([-200.0, -104.5, -90.0, -87.5, 85.0, 88.0, 95.0, 0.0])  # exp's clamps and denormals
    if act == "silu":
        got, want = activation.silu_and_mul(x, _extra=extra), act_ref.silu_and_mul(x.double())
    else:
        got, want = activation.gelu_and_mul(x, approximate=act, _extra=extra), act_ref.gelu_and_mul(x.double(), act)
    assert got.shape == (3, 2, 40) and torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)


def _paged(seed: int, lens: list[int], heads: int, kv_heads: int, dim: int, block: int = 4):
    gen = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // block) for n in lens]
    num_blocks = sum(per_seq) + 3
    kc = torch.randn(num_blocks, block, kv_heads, dim, generator=gen)
    vc = torch.randn(num_blocks, block, kv_heads, dim, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.zeros(len(lens), max(per_seq), dtype=torch.int32)
    for i, count in enumerate(per_seq):
        tables[i, :count] = torch.tensor([order.pop() for _ in range(count)])
    return gen, kc, vc, tables


@BUILDS
@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(4, 2, 32), (3, 3, 20), (9, 3, 64), (4, 1, 128)])
def test_paged_attention_decode_and_prefill_match_the_reference(extra: tuple[str, ...], window: int | None,
                                                                heads: int, kv_heads: int, dim: int) -> None:
    lens, q_lens = [9, 1, 14], [3, 1, 14]  # a chunk after cached tokens, a decode row, a whole prompt
    gen, kc, vc, tables = _paged(heads * dim, lens, heads, kv_heads, dim)
    context = torch.tensor(lens, dtype=torch.int32)
    bounds = [0, 3, 4, 18]
    q = torch.randn(bounds[-1], heads, dim, generator=gen)
    got = attention.paged_prefill_attention(
        q, kc, vc, block_tables=tables, cu_seqlens_q=torch.tensor(bounds, dtype=torch.int32), context_lens=context,
        max_seqlen_q=14, max_context_len=14, scale=0.3, sliding_window=window, cu_seqlens_q_host=bounds,
        context_lens_host=lens, _extra=extra)
    want = attn_ref.paged_prefill_attention(q.double(), kc.double(), vc.double(), tables, bounds, lens, 0.3, window)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)
    last = torch.tensor([2, 3, 17])  # each sequence's newest token, as a decode step would see it
    decode = attention.paged_attention(q[last].contiguous(), kc, vc, block_tables=tables, context_lens=context,
                                       scale=0.3, sliding_window=window, max_context_len=14, _extra=extra)
    assert torch.equal(decode, got[last])  # the same bits in a decode step as in a mixed one
    ref = attn_ref.paged_attention(q[last].double(), kc.double(), vc.double(), tables, context, 0.3, window, 14)
    assert torch.allclose(decode.double(), ref, rtol=1e-5, atol=1e-5)


def test_long_prefill_chunks_go_through_sdpa_and_decode_rows_keep_their_bits() -> None:
    long = attention.LONG_CHUNK + 6
    lens, bounds = [long + 3, 5], [0, long, long + 1]  # a long chunk after 3 cached tokens, then a decode row
    gen, kc, vc, tables = _paged(21, lens, 4, 2, 16)
    q = torch.randn(bounds[-1], 4, 16, generator=gen)
    context = torch.tensor(lens, dtype=torch.int32)
    got = attention.paged_prefill_attention(
        q, kc, vc, block_tables=tables, cu_seqlens_q=torch.tensor(bounds, dtype=torch.int32), context_lens=context,
        max_seqlen_q=long, max_context_len=max(lens), scale=0.25, sliding_window=None, cu_seqlens_q_host=bounds,
        context_lens_host=lens)
    want = attn_ref.paged_prefill_attention(q.double(), kc.double(), vc.double(), tables, bounds, lens, 0.25, None)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)
    decode = attention.paged_attention(q[[long - 1, long]].contiguous(), kc, vc, block_tables=tables,
                                       context_lens=context, scale=0.25, sliding_window=None, max_context_len=max(lens))
    assert torch.equal(decode[1], got[long])  # the decode row: C in both steps


def test_a_step_of_long_prefill_chunks_only_is_attended_whole() -> None:
    """No short chunk: the C kernel is not called, every row comes from SDPA (none left unwritten)."""
    long = attention.LONG_CHUNK + 1
    lens, bounds = [long + 5, long], [0, long, 2 * long]  # after 5 cached tokens, and a fresh prompt
    gen, kc, vc, tables = _paged(23, lens, 4, 2, 16)
    q = torch.randn(bounds[-1], 4, 16, generator=gen)
    got = attention.paged_prefill_attention(
        q, kc, vc, block_tables=tables, cu_seqlens_q=torch.tensor(bounds, dtype=torch.int32),
        context_lens=torch.tensor(lens, dtype=torch.int32), max_seqlen_q=long, max_context_len=max(lens), scale=0.25,
        sliding_window=None, cu_seqlens_q_host=bounds, context_lens_host=lens)
    want = attn_ref.paged_prefill_attention(q.double(), kc.double(), vc.double(), tables, bounds, lens, 0.25, None)
    assert torch.allclose(got.double(), want, rtol=1e-5, atol=1e-5)


@BUILDS
@pytest.mark.parametrize("dim", [64, 128])
def test_a_decode_row_gets_the_same_bits_alone_and_among_many(extra: tuple[str, ...], dim: int) -> None:
    """The registers path (head sizes 64 and 128) splits work per head for a few rows and per KV head's group of
    query heads for many: a row's result must not depend on which."""
    lens = [40 + 7 * i for i in range(12)]
    gen, kc, vc, tables = _paged(dim, lens, 8, 2, dim)
    q = torch.randn(len(lens), 8, dim, generator=gen)
    context = torch.tensor(lens, dtype=torch.int32)
    kwargs = dict(scale=dim**-0.5, sliding_window=None, max_context_len=max(lens), _extra=extra)
    many = attention.paged_attention(q, kc, vc, block_tables=tables, context_lens=context, **kwargs)
    for i in (0, 5, 11):
        alone = attention.paged_attention(q[i : i + 1].contiguous(), kc, vc, block_tables=tables[i : i + 1],
                                          context_lens=context[i : i + 1], **kwargs)
        assert torch.equal(alone[0], many[i])
    ref = attn_ref.paged_attention(q.double(), kc.double(), vc.double(), tables, context, dim**-0.5, None, max(lens))
    assert torch.allclose(many.double(), ref, rtol=1e-5, atol=1e-5)


def test_paged_attention_takes_a_strided_query_and_zeroes_padding_rows() -> None:
    _, kc, vc, tables = _paged(2, [6, 5], 4, 2, 16)
    qkv = torch.randn(2, 8 * 16)
    q = qkv[:, : 4 * 16].view(2, 4, 16)  # a view into a fused projection, as the models pass it
    kwargs = dict(block_tables=tables, scale=0.5, sliding_window=None, max_context_len=6)
    got = attention.paged_attention(q, kc, vc, context_lens=torch.tensor([6, 5], dtype=torch.int32), **kwargs)
    assert torch.equal(got, attention.paged_attention(q.contiguous(), kc, vc,
                                                      context_lens=torch.tensor([6, 5], dtype=torch.int32), **kwargs))
    padded = attention.paged_attention(q, kc, vc, context_lens=torch.tensor([6, 0], dtype=torch.int32), **kwargs)
    assert torch.equal(padded[0], got[0]) and not padded[1].any()


def test_paged_attention_refuses_lengths_past_the_table() -> None:
    _, kc, vc, tables = _paged(1, [6], 2, 2, 16)
    q = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="context length"):
        attention.paged_attention(q, kc, vc, block_tables=tables, context_lens=torch.tensor([40], dtype=torch.int32),
                                  scale=1.0, sliding_window=None, max_context_len=40)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_matches_the_reference_on_a_strided_view(interleaved: bool) -> None:
    gen = torch.Generator().manual_seed(int(interleaved))
    qkv = torch.randn(5, 7 * 32, generator=gen)
    x = qkv[:, : 6 * 32].view(5, 6, 32)  # q and k heads of a fused projection
    cos, sin = torch.randn(5, 16, generator=gen), torch.randn(5, 16, generator=gen)
    got = rope_kv.rope(x, cos, sin, interleaved=interleaved)
    want = rope_ref.rope(x.double(), cos.double(), sin.double(), interleaved)
    assert got.is_contiguous() and torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6)



def test_prompt_sized_norm_and_rope_split_over_threads_match_row_by_row() -> None:
    """A prompt's rows (past the kernels' threshold for OpenMP) give each row the bits it gets alone."""
    gen = torch.Generator().manual_seed(11)
    x, res = torch.randn(160, 576, generator=gen), torch.randn(160, 576, generator=gen)
    w = torch.randn(576, generator=gen)
    normed, summed = norm.fused_add_rms_norm(x, res, w, eps=1e-5, weight_offset=0.0)
    for r in (0, 77, 159):
        one, one_sum = norm.fused_add_rms_norm(x[r:r + 1], res[r:r + 1], w, eps=1e-5, weight_offset=0.0)
        assert torch.equal(normed[r:r + 1], one) and torch.equal(summed[r:r + 1], one_sum)
        assert torch.equal(norm.rms_norm(x, w, eps=1e-5, weight_offset=0.0)[r], norm.rms_norm(x[r:r + 1], w, eps=1e-5,
                                                                                              weight_offset=0.0)[0])
    qk = torch.randn(160, 12, 64, generator=gen)
    cos, sin = torch.randn(160, 32, generator=gen), torch.randn(160, 32, generator=gen)
    for interleaved in (False, True):
        got = rope_kv.rope(qk, cos, sin, interleaved=interleaved)
        want = rope_ref.rope(qk.double(), cos.double(), sin.double(), interleaved)
        assert torch.allclose(got.double(), want, rtol=1e-6, atol=1e-6)
        assert torch.equal(got[77], rope_kv.rope(qk[77:78], cos[77:78], sin[77:78], interleaved=interleaved)[0])


def test_store_kv_cache_matches_the_reference() -> None:
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(4, 3 * 2 * 8, generator=gen)
    k, v = qkv[:, 16:32].view(4, 2, 8), qkv[:, 32:].view(4, 2, 8)  # strided views, as the models pass them
    slots = torch.tensor([5, -1, 0, 11])
    caches = [torch.zeros(3, 4, 2, 8) for _ in range(4)]
    rope_kv.store_kv_cache(k, v, caches[0], caches[1], slots)
    kv_ref.store_kv_cache(k, v, caches[2], caches[3], slots)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    with pytest.raises(ValueError, match="past the cache"):
        rope_kv.store_kv_cache(k, v, caches[0], caches[1], torch.tensor([0, 1, 2, 12]))


@pytest.mark.parametrize("dim", [20, 64, 128])  # the generic loop and both register paths
def test_a_bf16_cache_gives_what_a_float32_cache_of_its_values_gives(dim: int) -> None:
    """A CPU bf16 model's cache: decode rows and short prefill chunks over bf16 K/V equal, bit for bit, the float32
    kernel over the same values widened; a long chunk's SDPA runs in bf16, within bf16's error of the reference."""
    long = attention.LONG_CHUNK + 3
    lens, bounds = [9, 1, long], [0, 3, 4, 4 + long]
    gen, kc, vc, tables = _paged(dim + 1, lens, 6, 2, dim)
    kc, vc = kc.bfloat16(), vc.bfloat16()
    q = torch.randn(bounds[-1], 6, dim, generator=gen)
    context = torch.tensor(lens, dtype=torch.int32)
    kwargs = dict(block_tables=tables, cu_seqlens_q=torch.tensor(bounds, dtype=torch.int32), context_lens=context,
                  max_seqlen_q=long, max_context_len=long, scale=0.3, sliding_window=None, cu_seqlens_q_host=bounds,
                  context_lens_host=lens)
    got = attention.paged_prefill_attention(q, kc, vc, **kwargs)
    widened = attention.paged_prefill_attention(q, kc.float(), vc.float(), **kwargs)
    assert got.dtype == torch.float32 and torch.equal(got[:4], widened[:4])
    torch.testing.assert_close(got[4:], widened[4:], rtol=2e-2, atol=2e-2)
    decode = attention.paged_attention(q[[2, 3]].contiguous(), kc, vc, block_tables=tables[:2],
                                       context_lens=context[:2], scale=0.3, sliding_window=None, max_context_len=9)
    assert torch.equal(decode, got[[2, 3]])


def test_store_into_a_bf16_cache_rounds_as_torch_does() -> None:
    gen = torch.Generator().manual_seed(4)
    k, v = torch.randn(3, 2, 64, generator=gen) * 30, torch.randn(3, 2, 64, generator=gen)
    caches = [torch.full((2, 4, 2, 64), 7.0, dtype=torch.bfloat16) for _ in range(2)]
    rope_kv.store_kv_cache(k, v, *caches, torch.tensor([5, -1, 0]))
    flat_k, flat_v = caches[0].view(-1, 2, 64), caches[1].view(-1, 2, 64)
    assert torch.equal(flat_k[5], k[0].bfloat16()) and torch.equal(flat_v[0], v[2].bfloat16())
    assert (flat_k[[1, 2, 3, 4, 6, 7]] == 7.0).all()  # the padding token's slot and the others untouched
    with pytest.raises(ValueError, match="one dtype"):
        rope_kv.store_kv_cache(k, v, caches[0], caches[1].float(), torch.tensor([0, 1, 2]))


def test_the_native_kernels_are_selected_on_the_cpu() -> None:
    x = torch.randn(2, 64)
    assert lz.which("rms_norm", x, torch.ones(64), eps=1e-6, weight_offset=0.0)["kernel_id"] == "native.rms_norm_cpu"


def test_a_build_that_fails_says_why(tmp_path, monkeypatch) -> None:
    broken = tmp_path / "broken.c"
    broken.write_text("int f(void) { return missing; }\n")
    monkeypatch.setattr("layerzero.kernels.native.build.CACHE_DIR", tmp_path / "cache")
    with pytest.raises(NativeBuildError, match="(?s)could not compile broken.c.*missing"):
        build(broken)
    monkeypatch.setattr("layerzero.kernels.native.build.CACHE_DIR", broken / "not-a-folder")
    with pytest.raises(NativeBuildError, match="cannot write the kernel cache"):
        build(broken)
    monkeypatch.setenv("CC", "no-such-compiler")
    with pytest.raises(NativeBuildError, match="no C compiler"):
        build(broken)


def test_bf16_linear_leaves_more_than_a_few_rows_to_a_gemm() -> None:
    report = lz.explain("linear", torch.randn(linear.BF16_MAX_ROWS + 1, 64), torch.randn(8, 64).bfloat16())
    native = next(c for c in report.candidates if c.kernel_id == "native.linear_bf16_cpu")
    assert not native.valid and f"past {linear.BF16_MAX_ROWS}" in str(native.reasons)
