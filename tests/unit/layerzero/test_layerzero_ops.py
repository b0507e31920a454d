"""layerzero ops against float64 naive math on fresh random inputs (GQA, windows, random page maps)."""

from __future__ import annotations

import math

import pytest
import torch

import layerzero as lz

DTYPE_TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2}


def naive_attention(q, k, v, scale, window=None):
    """float64 per-query loop; q [Sq, H, D], k/v [Sk, Hkv, D], causal aligned to the end of k."""
    q, k, v = q.double(), k.double(), v.double()
    sq, h, _ = q.shape
    sk, hkv, _ = k.shape
    out = torch.zeros_like(q)
    for i in range(sq):
        pos = sk - sq + i
        for head in range(h):
            kh = head // (h // hkv)
            scores = []
            for j in range(sk):
                visible = j <= pos and (window is None or pos - j < window)
                scores.append(float(q[i, head] @ k[j, kh]) * scale if visible else -math.inf)
            w = torch.softmax(torch.tensor(scores, dtype=torch.float64), 0)
            out[i, head] = w @ v[:, kh]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window", [None, 3])
def test_varlen_attention_matches_naive(dtype, window):
    g = torch.Generator().manual_seed(0)
    lens = [5, 1, 7]
    q = torch.randn(sum(lens), 4, 8, generator=g).to(dtype)
    k = torch.randn(sum(lens), 2, 8, generator=g).to(dtype)
    v = torch.randn(sum(lens), 2, 8, generator=g).to(dtype)
    cu = torch.tensor([0, 5, 6, 13], dtype=torch.int32)
    out = lz.varlen_attention(q, k, v, cu, cu, 7, 7, scale=0.3, sliding_window=window)
    hinted = lz.varlen_attention(q, k, v, cu, cu, 7, 7, scale=0.3, sliding_window=window,
                                 cu_seqlens_host=(cu.tolist(), cu.tolist()))
    torch.testing.assert_close(hinted, out)
    for s, e in zip(cu[:-1].tolist(), cu[1:].tolist()):
        ref = naive_attention(q[s:e], k[s:e], v[s:e], 0.3, window)
        torch.testing.assert_close(out[s:e].double(), ref, atol=DTYPE_TOL[dtype], rtol=DTYPE_TOL[dtype])


@pytest.mark.parametrize("window", [None, 4])
def test_paged_attention_matches_naive_with_random_block_tables(window):
    g = torch.Generator().manual_seed(1)
    block_size, num_blocks, hkv, h, d = 4, 16, 2, 6, 8
    k_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g)
    v_cache = torch.randn(num_blocks, block_size, hkv, d, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables = [perm[0:3], perm[3:5], perm[5:9]]
    ctx = [10, 5, 16]
    width = max(map(len, tables))
    bt = torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.int32)
    q = torch.randn(3, h, d, generator=g)
    out = lz.paged_attention(q, k_cache, v_cache, bt, torch.tensor(ctx, dtype=torch.int32),
                             scale=0.25, sliding_window=window, max_context_len=max(ctx))
    for b in range(3):
        slots = [tables[b][p // block_size] * block_size + p % block_size for p in range(ctx[b])]
        k = k_cache.view(-1, hkv, d)[slots]
        v = v_cache.view(-1, hkv, d)[slots]
        ref = naive_attention(q[b : b + 1], k, v, 0.25, window)[0]
        torch.testing.assert_close(out[b].double(), ref, atol=1e-5, rtol=1e-5)
    out4 = lz.paged_attention(q.unsqueeze(1), k_cache, v_cache, bt, torch.tensor(ctx, dtype=torch.int32),
                              scale=0.25, sliding_window=window)
    torch.testing.assert_close(out4.squeeze(1), out)


def test_store_kv_cache_writes_exact_slots():
    k_cache = torch.zeros(4, 2, 1, 3)
    v_cache = torch.zeros(4, 2, 1, 3)
    key, value = torch.randn(3, 1, 3), torch.randn(3, 1, 3)
    lz.store_kv_cache(key, value, k_cache, v_cache, torch.tensor([7, 0, 4]))
    torch.testing.assert_close(k_cache[3, 1], key[0])
    torch.testing.assert_close(k_cache[0, 0], key[1])
    torch.testing.assert_close(v_cache[2, 0], value[2])
    assert k_cache.abs().sum(-1).ne(0).sum() == 3


@pytest.mark.parametrize("offset", [0.0, 1.0])
def test_rms_norm_and_fused_add(offset):
    x, r, w = torch.randn(5, 16), torch.randn(5, 16), torch.randn(16)
    xd = (x + r).double()
    ref = xd / torch.sqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * (w.double() + offset)
    normed, summed = lz.fused_add_rms_norm(x, r, w, 1e-6, offset)
    torch.testing.assert_close(normed.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(summed, x + r)
    torch.testing.assert_close(lz.rms_norm(x + r, w, 1e-6, offset), normed)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rope_is_a_complex_rotation(interleaved):
    x = torch.randn(4, 3, 8)
    angles = torch.rand(4, 4) * 6.0
    out = lz.rope(x, angles.cos(), angles.sin(), interleaved=interleaved)
    if interleaved:
        pairs = torch.complex(x[..., 0::2].double(), x[..., 1::2].double())
    else:
        pairs = torch.complex(x[..., :4].double(), x[..., 4:].double())
    rotated = pairs * torch.polar(torch.ones_like(angles.double()), angles.double()).unsqueeze(1)
    ref = (torch.stack((rotated.real, rotated.imag), -1).flatten(-2) if interleaved
           else torch.cat((rotated.real, rotated.imag), -1))
    torch.testing.assert_close(out.double(), ref, atol=1e-5, rtol=1e-5)


def test_gated_activations():
    x = torch.randn(3, 10).double()
    gate, up = x[:, :5], x[:, 5:]
    torch.testing.assert_close(lz.silu_and_mul(x), gate * torch.sigmoid(gate) * up)
    tanh_gelu = 0.5 * gate * (1 + torch.tanh(math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)))
    torch.testing.assert_close(lz.gelu_and_mul(x), tanh_gelu * up)


@pytest.mark.parametrize("layout", ["BSHD", "BHSD"])
def test_dense_attention_layouts_agree(layout):
    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    if layout == "BHSD":
        out = lz.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="BHSD").transpose(1, 2)
    else:
        out = lz.attention(q, k, v, layout="BSHD")
    for b in range(2):
        torch.testing.assert_close(out[b].double(), naive_attention(q[b], k[b], v[b], 8**-0.5), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="layout"):
        lz.attention(q, k, v, layout="SBHD")
