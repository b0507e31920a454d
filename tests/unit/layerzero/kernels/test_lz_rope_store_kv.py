"""rope_store_kv, the fused attention prologue: the reference against a float64 composition, the interpreted Triton
kernel and the native composite against the reference, and `lz.rope_store_kv` end to end on the CPU."""

from __future__ import annotations

import pytest
import torch

import layerzero as lz
from layerzero.kernels.native import rope_kv as native
from layerzero.kernels.reference import rope_store_kv as ref

SLOTS = [3, -1, 17, 0, -1, 22]  # two padding tokens


def _inputs(rng: torch.Generator, heads: int, kv_heads: int, dim: int, dtype: torch.dtype = torch.float32,
            tokens: int = len(SLOTS)) -> dict:
    """qkv as a strided view (a slice of a wider projection output), random caches so untouched rows show."""
    width = (heads + 2 * kv_heads) * dim
    wide = torch.randn(tokens, width + 8, generator=rng).to(dtype)
    angles = torch.rand(tokens, dim // 2, generator=rng) * 50.0
    caches = [torch.randn(6, 4, kv_heads, dim, generator=rng).to(dtype) for _ in range(2)]
    return dict(qkv=wide[:, 8:].view(tokens, heads + 2 * kv_heads, dim), cos=angles.cos(), sin=angles.sin(),
                key_cache=caches[0], value_cache=caches[1], slot_mapping=torch.tensor(SLOTS[:tokens]),
                q_norm_weight=torch.randn(dim, generator=rng).to(dtype),
                k_norm_weight=torch.randn(dim, generator=rng).to(dtype))


def _call(fn, inputs: dict, heads: int, qk_norm: bool, weight_offset: float = 0.0,
          interleaved: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fn's rotated q and the caches it wrote (on copies of the input caches)."""
    kc, vc = inputs["key_cache"].clone(), inputs["value_cache"].clone()
    weights = (inputs["q_norm_weight"], inputs["k_norm_weight"]) if qk_norm else (None, None)
    q = fn(inputs["qkv"], inputs["cos"], inputs["sin"], kc, vc, inputs["slot_mapping"], *weights, num_heads=heads,
           eps=1e-6, weight_offset=weight_offset, interleaved=interleaved)
    return q, kc, vc


def _float64(inputs: dict, heads: int, qk_norm: bool, weight_offset: float,
             interleaved: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The op's definition written out in float64: per-head RMSNorm, rotation, scatter to the slots."""
    x = inputs["qkv"].double()
    kv_heads = (x.shape[1] - heads) // 2
    q, k, v = x[:, :heads], x[:, heads : heads + kv_heads], x[:, heads + kv_heads :]
    if qk_norm:
        def rms(t: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
            return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * (w.double() + weight_offset)
        q, k = rms(q, inputs["q_norm_weight"]), rms(k, inputs["k_norm_weight"])
    c, s = inputs["cos"].double()[:, None], inputs["sin"].double()[:, None]

    def rotate(t: torch.Tensor) -> torch.Tensor:
        if interleaved:
            a, b = t[..., 0::2], t[..., 1::2]
            return torch.stack((a * c - b * s, b * c + a * s), dim=-1).flatten(-2)
        a, b = t.chunk(2, dim=-1)
        return torch.cat((a * c - b * s, b * c + a * s), dim=-1)

    q, k = rotate(q), rotate(k)
    kc, vc = inputs["key_cache"].double(), inputs["value_cache"].double()
    for token, slot in enumerate(inputs["slot_mapping"].tolist()):
        if slot >= 0:
            kc.view(-1, kv_heads, x.shape[2])[slot] = k[token]
            vc.view(-1, kv_heads, x.shape[2])[slot] = v[token]
    return q, kc, vc


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("weight_offset", [0.0, 1.0])
@pytest.mark.parametrize("interleaved", [False, True])
def test_reference_matches_float64(rng, qk_norm: bool, weight_offset: float, interleaved: bool) -> None:
    inputs = _inputs(rng, heads=4, kv_heads=2, dim=16)
    got = _call(ref.rope_store_kv, inputs, 4, qk_norm, weight_offset, interleaved)
    want = _float64(inputs, 4, qk_norm, weight_offset, interleaved)
    assert got[0].shape == (len(SLOTS), 4, 16) and got[0].is_contiguous()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g.double(), w, rtol=1e-5, atol=1e-5,
                                   msg=lambda m: f"{m} (seed {rng.initial_seed()})")


@pytest.fixture(scope="module")
def kernels(triton_interpreted):
    return triton_interpreted("rope_kv")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
def test_triton_matches_reference(kernels, rng, assert_matches, dtype: torch.dtype, qk_norm: bool,
                                  interleaved: bool) -> None:
    # 3 q heads and 1 kv head: one program's block holds q and k heads; D/2 = 12 is not a power of two
    inputs = _inputs(rng, heads=3, kv_heads=1, dim=24, dtype=dtype)
    got = _call(kernels.rope_store_kv, inputs, 3, qk_norm, 1.0 if qk_norm else 0.0, interleaved)
    want = _call(ref.rope_store_kv, inputs, 3, qk_norm, 1.0 if qk_norm else 0.0, interleaved)
    for g, w in zip(got, want, strict=True):
        assert_matches(g, w)


def test_triton_leaves_padding_slots_untouched_over_several_head_blocks(kernels, rng) -> None:
    """40 q + k heads of 128 are two programs per token; every cache row but the written slots keeps its value."""
    inputs = _inputs(rng, heads=32, kv_heads=8, dim=128, tokens=3)
    q, kc, vc = _call(kernels.rope_store_kv, inputs, 32, qk_norm=True)
    want_q, want_k, want_v = _call(ref.rope_store_kv, inputs, 32, qk_norm=True)
    torch.testing.assert_close(q, want_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kc, want_k, rtol=1e-5, atol=1e-5)
    assert torch.equal(vc, want_v)
    flat_k, flat_v = kc.view(-1, 8, 128), vc.view(-1, 8, 128)
    untouched = [s for s in range(flat_k.shape[0]) if s not in (3, 17)]
    assert torch.equal(flat_k[untouched], inputs["key_cache"].view(-1, 8, 128)[untouched])
    assert torch.equal(flat_v[untouched], inputs["value_cache"].view(-1, 8, 128)[untouched])
    assert torch.equal(flat_v[17], inputs["qkv"][2, 40:])


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("tokens", [1, len(SLOTS)])
def test_native_matches_reference(rng, qk_norm: bool, interleaved: bool, tokens: int) -> None:
    inputs = _inputs(rng, heads=4, kv_heads=2, dim=32, tokens=tokens)
    got = _call(native.rope_store_kv, inputs, 4, qk_norm, 1.0, interleaved)
    want = _call(ref.rope_store_kv, inputs, 4, qk_norm, 1.0, interleaved)
    assert got[0].is_contiguous()
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5, msg=lambda m: f"{m} (seed {rng.initial_seed()})")


@pytest.mark.parametrize("qk_norm", [False, True])
def test_lz_rope_store_kv_end_to_end(rng, qk_norm: bool) -> None:
    inputs = _inputs(rng, heads=4, kv_heads=2, dim=16)
    want = _call(ref.rope_store_kv, inputs, 4, qk_norm, 1.0)
    got = _call(lambda *args, **kw: lz.rope_store_kv(*args, **kw), inputs, 4, qk_norm, 1.0)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    weights = (inputs["q_norm_weight"], inputs["k_norm_weight"]) if qk_norm else (None, None)
    call = (inputs["qkv"], inputs["cos"], inputs["sin"], inputs["key_cache"], inputs["value_cache"],
            inputs["slot_mapping"], *weights)
    report = lz.explain("rope_store_kv", *call, num_heads=4, eps=1e-6, weight_offset=1.0, interleaved=False)
    assert {"reference.rope_store_kv", "native.rope_store_kv_cpu"} <= {c.kernel_id for c in report.candidates}


def test_lz_rope_store_kv_rejects_one_norm_weight_and_foreign_shapes(rng) -> None:
    inputs = _inputs(rng, heads=4, kv_heads=2, dim=16)
    args = (inputs["qkv"], inputs["cos"], inputs["sin"], inputs["key_cache"], inputs["value_cache"],
            inputs["slot_mapping"])
    with pytest.raises(ValueError, match="both"):
        lz.rope_store_kv(*args, inputs["q_norm_weight"], num_heads=4)
    with pytest.raises(ValueError, match="kv heads"):
        lz.rope_store_kv(*args, num_heads=5)


def _projected_inputs(rng: torch.Generator, heads: int, kv_heads: int, dim: int, columns: int,
                      dtype: torch.dtype, tokens: int = 3) -> tuple[dict, torch.Tensor]:
    """The prologue's inputs with x [T, columns] and a QKV weight in place of qkv, and the weight."""
    inputs = _inputs(rng, heads, kv_heads, dim, dtype, tokens)
    proj = (torch.randn((heads + 2 * kv_heads) * dim, columns, generator=rng) * columns ** -0.5).to(dtype)
    return {**inputs, "qkv": torch.randn(tokens, columns, generator=rng).to(dtype)}, proj


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("qk_norm", [False, True])
def test_triton_sums_the_projections_slices_in_the_prologue(kernels, triton_interpreted, monkeypatch, rng,
                                                            dtype: torch.dtype, qk_norm: bool) -> None:
    """With `proj`, the QKV projection's split-K slices are summed where the prologue reads them: the projection
    rounded to x's dtype, then the prologue, as the reference's linear-then-prologue."""
    monkeypatch.setattr(kernels, "splitk_partials", triton_interpreted("gemv").splitk_partials)
    inputs, proj = _projected_inputs(rng, heads=3, kv_heads=1, dim=24, columns=1024, dtype=dtype)
    folded = lambda *a, **kw: kernels.rope_store_kv_splitk(*a, proj, **kw)  # noqa: E731
    got = _call(folded, inputs, 3, qk_norm, 1.0 if qk_norm else 0.0)
    want = _call(lambda *a, **kw: ref.rope_store_kv(*a, proj=proj, **kw), inputs, 3, qk_norm,
                 1.0 if qk_norm else 0.0)
    tol = 1e-4 if dtype == torch.float32 else 5e-2  # a float32 sum in another order, then one bf16 rounding apart
    for g, w in zip(got, want, strict=True):
        assert g.dtype == w.dtype
        torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=lambda m: f"{m} (seed {rng.initial_seed()})")
    with pytest.raises(ValueError, match="multiple of the head dim"):
        _call(lambda *a, **kw: kernels.rope_store_kv_splitk(*a, proj[:-1], **kw), inputs, 3, qk_norm)


def test_lz_rope_store_kv_projects_first_where_no_kernel_folds(rng) -> None:
    """On the CPU `proj` is lz.linear then the prologue: the same bits as the two ops; a step of no tokens is an
    empty q, as without `proj`."""
    inputs, proj = _projected_inputs(rng, heads=4, kv_heads=2, dim=16, columns=64, dtype=torch.float32)
    got = _call(lambda *a, **kw: lz.rope_store_kv(*a, proj=proj, **kw), inputs, 4, True, 1.0)
    qkv = lz.linear(inputs["qkv"], proj).view(3, 8, 16)
    want = _call(lambda *a, **kw: lz.rope_store_kv(*a, **kw), {**inputs, "qkv": qkv}, 4, True, 1.0)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    empty = {**inputs, "qkv": inputs["qkv"][:0], "cos": inputs["cos"][:0], "sin": inputs["sin"][:0],
             "slot_mapping": inputs["slot_mapping"][:0]}
    assert _call(lambda *a, **kw: lz.rope_store_kv(*a, proj=proj, **kw), empty, 4, True, 1.0)[0].shape == (0, 4, 16)
    with pytest.raises(ValueError, match="with proj expects"):
        lz.rope_store_kv(*(inputs[k] for k in ("qkv", "cos", "sin", "key_cache", "value_cache", "slot_mapping")),
                         num_heads=4, proj=proj[:, :-1])
