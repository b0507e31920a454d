"""The layerzero op surface: one explicit function per op.

Each function normalizes its arguments into the op's canonical kernel call (layout resolved, default
scale, 3-D paged query, a host bound on the context length) and hands it to `dispatch`, which selects
a kernel (with reasons), runs it and falls back at run time. Under torch.compile the call goes through
the `torch.ops.layerzero` custom ops instead (`layerzero.extend.library.call_op`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from layerzero.dispatch.call import dispatch
from layerzero.select.layout import resolve_layout

_HOST_OPS = frozenset({"tokenize", "detokenize"})


def _call(op: str, *args: Any, **kwargs: Any) -> Any:
    if op not in _HOST_OPS and torch.compiler.is_compiling():
        from layerzero.extend.library import call_op  # imported late: library's ops call back into dispatch

        return call_op(op, *args, **kwargs)
    return dispatch(op, *args, **kwargs)


def _scale(scale: float | None, head_dim: int) -> float:
    return head_dim**-0.5 if scale is None else float(scale)


def attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    causal: bool = True,
    scale: float | None = None,
    layout: str | None = None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """Dense attention over [B, S, H, D] (BSHD) or [B, H, S, D] (BHSD); output keeps the input layout.

    Without `layout`, shapes decide, then strides (a transposed view of token-major memory is BHSD);
    when neither does (e.g. S == H, or equal q/k sequence and head counts) a LayoutError asks for it.
    """
    layout = resolve_layout(query, key, value, layout)
    return _call("attention", query, key, value, causal=bool(causal), scale=_scale(scale, query.shape[-1]),
                 sliding_window=sliding_window, layout=layout)


def varlen_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = True,
    scale: float | None = None,
    sliding_window: int | None = None,
    cu_seqlens_host: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """Packed variable-length attention: q [Tq, H, D], k/v [Tk, Hkv, D], sequences delimited by cu_seqlens.

    max_seqlen_* and cu_seqlens_host (host copies of cu_seqlens_q and cu_seqlens_k) are hints the
    caller already has on the host; with them no implementation needs to read the device tensors back.
    """
    host = None if cu_seqlens_host is None else (list(cu_seqlens_host[0]), list(cu_seqlens_host[1]))
    return _call("varlen_attention", query, key, value, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
                 max_seqlen_q=int(max_seqlen_q), max_seqlen_k=int(max_seqlen_k), causal=bool(causal),
                 scale=_scale(scale, query.shape[-1]), sliding_window=sliding_window, cu_seqlens_host=host)


def _context_bound(block_tables: torch.Tensor, key_cache: torch.Tensor, max_context_len: int | None) -> int:
    """The host bound on context length a paged op receives: as given (checked against the tables), or their capacity."""
    limit = block_tables.shape[1] * key_cache.shape[1]
    if max_context_len is not None and max_context_len > limit:
        raise ValueError(f"max_context_len={max_context_len} exceeds the block tables' capacity ({limit} tokens)")
    return limit if max_context_len is None else int(max_context_len)


def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float | None = None,
    sliding_window: int | None = None,
    max_context_len: int | None = None,
) -> torch.Tensor:
    """Decode attention over a paged cache: query [B, H, D] or [B, 1, H, D], one new token per sequence.

    block_tables [B, max_blocks] maps logical to physical blocks; context_lens [B] counts the tokens
    in cache including the current one; max_context_len (a host int) bounds the work.
    """
    squeeze = query.dim() == 4
    q = query.squeeze(1) if squeeze else query
    out = _call("paged_attention", q, key_cache, value_cache, block_tables=block_tables, context_lens=context_lens,
                scale=_scale(scale, q.shape[-1]), sliding_window=sliding_window,
                max_context_len=_context_bound(block_tables, key_cache, max_context_len))
    return out.unsqueeze(1) if squeeze else out


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_seqlen_q: int,
    max_context_len: int,
    scale: float | None = None,
    sliding_window: int | None = None,
    host_bounds: tuple[Sequence[int], Sequence[int]] | None = None,
) -> torch.Tensor:
    """Prefill (or mixed) attention over a paged cache: query [T, H, D] packed by cu_seqlens_q [B+1].

    Sequence i's q_len queries are its last q_len cached positions (their keys already stored):
    a chunk attends causally to itself and to everything before it in the cache (earlier chunks,
    cached prefixes). context_lens [B] counts cached tokens including the new ones; max_seqlen_q and
    max_context_len are host ints; host_bounds = (cu_seqlens_q, context_lens) on the host, so that no
    implementation needs to read them back.
    """
    host_q, host_ctx = (None, None) if host_bounds is None else (list(host_bounds[0]), list(host_bounds[1]))
    return _call("paged_prefill_attention", query, key_cache, value_cache, block_tables=block_tables,
                 cu_seqlens_q=cu_seqlens_q, context_lens=context_lens, max_seqlen_q=int(max_seqlen_q),
                 max_context_len=_context_bound(block_tables, key_cache, max_context_len),
                 scale=_scale(scale, query.shape[-1]),
                 sliding_window=sliding_window, cu_seqlens_q_host=host_q, context_lens_host=host_ctx)


def store_kv_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, Hkv, D] into paged caches at flat slots (block * block_size + offset); slots < 0 are skipped."""
    _call("store_kv_cache", key, value, key_cache, value_cache, slot_mapping)


def rope_store_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    q_norm_weight: torch.Tensor | None = None,
    k_norm_weight: torch.Tensor | None = None,
    *,
    num_heads: int,
    eps: float = 1e-6,
    weight_offset: float = 0.0,
    interleaved: bool = False,
    proj: torch.Tensor | None = None,
) -> torch.Tensor:
    """The attention prologue in one op, as rms_norm (both weights or neither), rope and store_kv_cache would do it on
    qkv [T, H + 2*Hkv, D]'s q and k heads (v stored raw); returns the rotated q [T, H, D]. With `proj` [(H + 2*Hkv)
    * D, K] (a bias-free QKV weight), qkv is x [T, K] and the op projects it first: on CUDA's decode the projection's
    split-K slices are summed by the prologue's kernel, with no sum kernel between."""
    if (q_norm_weight is None) != (k_norm_weight is None):
        raise ValueError("rope_store_kv takes both QK-norm weights or neither")
    if proj is not None and (qkv.dim() != 2 or proj.dim() != 2 or proj.shape[1] != qkv.shape[1]):
        raise ValueError(f"rope_store_kv with proj expects x [T, K] and proj [N, K]; got {tuple(qkv.shape)} and "
                         f"{tuple(proj.shape)}")
    return _call("rope_store_kv", qkv, cos, sin, key_cache, value_cache, slot_mapping, q_norm_weight, k_norm_weight,
                 proj, num_heads=int(num_heads), eps=float(eps), weight_offset=float(weight_offset),
                 interleaved=bool(interleaved))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, weight_offset: float = 0.0) -> torch.Tensor:
    """RMSNorm over the last dim; weight_offset=1.0 gives Gemma's x * (1 + w)."""
    return _call("rms_norm", x, weight, eps=float(eps), weight_offset=float(weight_offset))


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6, weight_offset: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (rms_norm(x + residual), x + residual): the residual update and the next norm in one op. The norm comes
    back in x's dtype, the sum in the wider dtype: bf16 x (a projection's output) on a float32 residual gives the
    next bf16 matmul its rows and keeps the stream float32."""
    return _call("fused_add_rms_norm", x, residual, weight, eps=float(eps), weight_offset=float(weight_offset))


def layer_norm(
    x: torch.Tensor,
    normalized_shape: tuple[int, ...],
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """LayerNorm computed in float32."""
    return _call("layer_norm", x, tuple(normalized_shape), weight, bias, eps=float(eps))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotary embedding of x [T, H, D] with per-token tables cos/sin [T, D/2]."""
    return _call("rope", x, cos, sin, interleaved=bool(interleaved))


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: silu(x[..., :I]) * x[..., I:]."""
    return _call("silu_and_mul", x)


def gelu_and_mul(x: torch.Tensor, approximate: str = "tanh") -> torch.Tensor:
    """GeGLU gate: gelu(x[..., :I]) * x[..., I:]."""
    if approximate not in ("tanh", "none"):
        raise ValueError(f"approximate must be 'tanh' or 'none', got {approximate!r}")
    return _call("gelu_and_mul", x, approximate=approximate)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias)."""
    return _call("linear", x, weight, bias)


def linear_int4(
    x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, group_size: int, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x @ W.T (+ bias) for a 4-bit weight W [N, K] kept packed: qweight [N, K/2] uint8 holds two columns per
    byte (the even one in the low nibble); scales_zeros [K/group_size, N, 2] gives each group of `group_size`
    columns W = (q - 8) * scale + zero. The output has x's dtype."""
    if qweight.dtype != torch.uint8 or qweight.dim() != 2:
        raise ValueError(f"qweight must be a 2-D uint8 tensor of packed 4-bit values, got {qweight.dtype} {tuple(qweight.shape)}")
    k = 2 * qweight.shape[1]
    if x.shape[-1] != k or k % group_size or scales_zeros.shape != (k // group_size, qweight.shape[0], 2):
        raise ValueError(f"linear_int4: x [..., {x.shape[-1]}], qweight {tuple(qweight.shape)}, group_size {group_size} "
                         f"and scales_zeros {tuple(scales_zeros.shape)} do not fit (expected [{k // max(group_size, 1)}, "
                         f"{qweight.shape[0]}, 2] for K = {k})")
    return _call("linear_int4", x, qweight, scales_zeros, bias, group_size=int(group_size))


W8_DTYPES = (torch.int8, torch.float8_e4m3fn)


def linear_w8(
    x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int],
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """x @ W.T (+ bias) for an 8-bit weight [N, K] (int8 or float8_e4m3fn) with block scales: W[n, k] =
    weight[n, k] * scale[n // bn, k // bk], scale [ceil(N/bn), ceil(K/bk)] float32 for block_size (bn, bk).
    Per-channel scales are blocks (1, K); FP8 checkpoints' blocks are (128, 128). The output has x's dtype."""
    if weight.dtype not in W8_DTYPES or weight.dim() != 2:
        raise ValueError(f"linear_w8: weight must be a 2-D int8 or float8_e4m3fn tensor, got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    bn, bk = (int(b) for b in block_size)
    n, k = weight.shape
    expected = (-(-n // max(bn, 1)), -(-k // max(bk, 1)))
    if bn < 1 or bk < 1 or x.shape[-1] != k or tuple(scale.shape) != expected or scale.dtype != torch.float32:
        raise ValueError(f"linear_w8: x [..., {x.shape[-1]}], weight {tuple(weight.shape)}, block_size {(bn, bk)} "
                         f"and scale {scale.dtype} {tuple(scale.shape)} do not fit (expected float32 {list(expected)})")
    return _call("linear_w8", x, weight, scale, bias, block_size=(bn, bk))


def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Row lookup of token ids in an embedding table."""
    return _call("embedding", ids, weight)


def all_reduce(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Sum x over a tensor-parallel process group's ranks; returns the sum (x itself, or a new tensor on the GPUs'
    small-message path: use the returned tensor)."""
    return _call("all_reduce", x, group=group)


def all_reduce_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, group: Any,
                            eps: float = 1e-6, weight_offset: float = 0.0,
                            proj: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A tensor-parallel layer's end: x (this rank's partial sum) summed over the group's ranks, then
    `fused_add_rms_norm` of that sum and the residual: returns (rms_norm(sum + residual), sum + residual). With
    `proj` [H, K] (this rank's shard of the layer's last projection), x [T, K] is its input and linear(x, proj) is
    the partial sum: on a GPU's decode rows the projection's split-K slices are summed inside the reduce kernel."""
    return _call("all_reduce_add_rms_norm", x, residual, weight, proj, eps=float(eps),
                 weight_offset=float(weight_offset), group=group)


def all_gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The group's ranks' x [..., d] side by side in rank order: [..., size * d]."""
    return _call("all_gather", x, group=group)


def broadcast(x: torch.Tensor, group: Any, src: int = 0) -> torch.Tensor:
    """Rank `src`'s x (its rank within the group) on every rank of the group, in place; returns x."""
    return _call("broadcast", x, group=group, src=int(src))


def sample_topk(
    logits: torch.Tensor,
    k: int,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row from softmax(logits / temperature) restricted to the top-k logits (int64 [...])."""
    return _call("sample_topk", logits, int(k), temperature=float(temperature), generator=generator, noise=noise)


def sample_topp(
    logits: torch.Tensor,
    p: float,
    *,
    temperature: float = 1.0,
    generator: torch.Generator | None = None,
    noise: torch.Tensor | None = None,
) -> torch.Tensor:
    """One token id per row from the smallest set of most likely tokens whose probability mass reaches p."""
    return _call("sample_topp", logits, float(p), temperature=float(temperature), generator=generator, noise=noise)


def argmax(x: torch.Tensor) -> torch.Tensor:
    """torch.argmax(x, dim=-1) of x [rows, V] (int64 [rows]): the first index among equal maxima, the first NaN
    if a row has one; greedy decoding's token choice."""
    if x.dim() != 2 or x.shape[1] == 0:
        raise ValueError(f"argmax expects x [rows, V] with V >= 1, got shape {tuple(x.shape)}")
    return _call("argmax", x)


def moe_route(logits: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture of experts' routing: (weights float32 [T, k], expert ids int64 [T, k]) of router logits [T, E], the
    k best experts by softmax (or sigmoid) score, their weights divided by their sum when `renormalize`."""
    if logits.dim() != 2 or not 0 < top_k <= logits.shape[-1]:
        raise ValueError(f"moe_route expects logits [T, E] and 0 < top_k <= E, got {tuple(logits.shape)}, top_k={top_k}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"moe_route: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    return _call("moe_route", logits, int(top_k), renormalize=bool(renormalize), scoring=scoring)


def moe_gate(x: torch.Tensor, router: torch.Tensor, top_k: int, *, renormalize: bool, scoring: str = "softmax"
             ) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixture of experts' router and routing: `moe_route` of the float32 logits x [T, H] @ router [E, H]^T
    (computed in float32 whatever x's dtype, so a token's experts do not depend on its step's other tokens)."""
    if x.dim() != 2 or router.dim() != 2 or router.shape[1] != x.shape[1] or not 0 < top_k <= router.shape[0]:
        raise ValueError(f"moe_gate expects x [T, H], router [E, H] and 0 < top_k <= E, got {tuple(x.shape)}, "
                         f"{tuple(router.shape)}, top_k={top_k}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"moe_gate: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    return _call("moe_gate", x, router, int(top_k), renormalize=bool(renormalize), scoring=scoring)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
              activation: str = "silu") -> torch.Tensor:
    """x [T, H] through each token's routed experts: sum_j weights[t, j] * w2[e] @ (act(gate) * up), gate and up the
    halves of w13[e] @ x_t, e = ids[t, j]; w13 [E, 2I, H] (gate rows first), w2 [E, H, I]. Returns [T, H]."""
    experts, inner2, hidden = w13.shape
    if x.dim() != 2 or x.shape[1] != hidden or w2.shape != (experts, hidden, inner2 // 2) or ids.shape != weights.shape:
        raise ValueError(f"fused_moe expects x [T, H], w13 [E, 2I, H], w2 [E, H, I], weights and ids [T, k]; got "
                         f"{tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}, {tuple(weights.shape)}, "
                         f"{tuple(ids.shape)}")
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"fused_moe: activation must be 'silu' or 'gelu_tanh', got {activation!r}")
    return _call("fused_moe", x, w13, w2, weights, ids, activation=activation)


def fused_add_rms_norm_router(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, router: torch.Tensor,
                              eps: float = 1e-6, weight_offset: float = 0.0, proj: torch.Tensor | None = None
                              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`fused_add_rms_norm` and the router of the experts that follow it: (normed, x + residual, float32 logits
    normed @ router [E, H]^T), so a decode step's norm writes the logits `fused_moe_routed` routes (one kernel on
    CUDA, where a separate router would be one more on every MoE layer). With `proj` [H, K] (a bias-free projection,
    the attention's O), x [T, K] is its input and `linear(x, proj)` what is added: on CUDA's decode the projection's
    split-K slices are summed by the norm's kernel, with no sum kernel between."""
    hidden = residual.shape[-1]
    columns = hidden if proj is None else proj.shape[1]
    if x.dim() != 2 or residual.shape != (x.shape[0], hidden) or x.shape[1] != columns or router.dim() != 2 \
            or router.shape[1] != hidden or weight.shape != (hidden,) \
            or (proj is not None and (proj.dim() != 2 or proj.shape[0] != hidden)):
        raise ValueError(f"fused_add_rms_norm_router expects x [T, K], residual [T, H], weight [H], router [E, H] and "
                         f"proj [H, K] (or no proj, K = H); got {tuple(x.shape)}, {tuple(residual.shape)}, "
                         f"{tuple(weight.shape)}, {tuple(router.shape)}, {None if proj is None else tuple(proj.shape)}")
    return _call("fused_add_rms_norm_router", x, residual, weight, router, proj, eps=float(eps),
                 weight_offset=float(weight_offset))


def fused_moe_routed(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, top_k: int, *,
                     renormalize: bool, scoring: str = "softmax", activation: str = "silu") -> torch.Tensor:
    """`fused_moe` of `moe_route`'s routing of router logits [T, E]: the experts' sum with the routing inside the op,
    so a few tokens' kernels route for themselves (no routing kernel between the router and the experts)."""
    experts, inner2, hidden = w13.shape
    if x.dim() != 2 or x.shape[1] != hidden or w2.shape != (experts, hidden, inner2 // 2) \
            or logits.shape != (x.shape[0], experts) or not 0 < top_k <= experts:
        raise ValueError(f"fused_moe_routed expects x [T, H], w13 [E, 2I, H], w2 [E, H, I], logits [T, E] and "
                         f"0 < top_k <= E; got {tuple(x.shape)}, {tuple(w13.shape)}, {tuple(w2.shape)}, "
                         f"{tuple(logits.shape)}, top_k={top_k}")
    if scoring not in ("softmax", "sigmoid"):
        raise ValueError(f"fused_moe_routed: scoring must be 'softmax' or 'sigmoid', got {scoring!r}")
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"fused_moe_routed: activation must be 'silu' or 'gelu_tanh', got {activation!r}")
    return _call("fused_moe_routed", x, w13, w2, logits, int(top_k), renormalize=bool(renormalize), scoring=scoring,
                 activation=activation)


def _check_moe_quant(op: str, x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor,
                     ids: torch.Tensor, columns: int, activation: str) -> None:
    """The shapes every quantized fused MoE shares; `columns`: stored columns per input (2 for 4-bit: two a byte)."""
    experts, inner2, hidden = w13.shape[0], w13.shape[1], x.shape[-1]
    if (x.dim() != 2 or w13.dim() != 3 or w13.shape[2] * columns != hidden or inner2 % 2
            or tuple(w2.shape) != (experts, hidden, inner2 // 2 // columns) or ids.shape != weights.shape
            or ids.dim() != 2 or ids.shape[0] != x.shape[0]):
        raise ValueError(f"{op} expects x [T, H], w13 [E, 2I, H{'/2' if columns == 2 else ''}], "
                         f"w2 [E, H, I{'/2' if columns == 2 else ''}], weights and ids [T, k]; got {tuple(x.shape)}, "
                         f"{tuple(w13.shape)}, {tuple(w2.shape)}, {tuple(weights.shape)}, {tuple(ids.shape)}")
    if activation not in ("silu", "gelu_tanh"):
        raise ValueError(f"{op}: activation must be 'silu' or 'gelu_tanh', got {activation!r}")


def fused_moe_int4(x: torch.Tensor, w13: torch.Tensor, w13_scales: torch.Tensor, w2: torch.Tensor,
                   w2_scales: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *, group_size: int,
                   activation: str = "silu") -> torch.Tensor:
    """fused_moe over experts kept 4-bit: w13 [E, 2I, H/2] and w2 [E, H, I/2] uint8 (column 2j in the low nibble of
    byte j), scales [2, E, N, K/group_size] float32 holding each group's (scale, offset): w = q * scale + offset for
    q in 0..15. Returns [T, H] in x's dtype."""
    _check_moe_quant("fused_moe_int4", x, w13, w2, weights, ids, 2, activation)
    for name, w, s in (("w13", w13, w13_scales), ("w2", w2, w2_scales)):
        if tuple(s.shape) != (2, *w.shape[:2], 2 * w.shape[2] // group_size) or (2 * w.shape[2]) % group_size:
            raise ValueError(f"fused_moe_int4: {name}_scales must be [2, E, N, K/{group_size}] for {name} "
                             f"{tuple(w.shape)}, got {tuple(s.shape)}")
    return _call("fused_moe_int4", x, w13, w13_scales, w2, w2_scales, weights, ids, group_size=int(group_size),
                 activation=activation)


def fused_moe_w8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor, w2_scale: torch.Tensor,
                 weights: torch.Tensor, ids: torch.Tensor, *, block_size: tuple[int, int],
                 activation: str = "silu") -> torch.Tensor:
    """fused_moe over experts kept 8-bit: w13 [E, 2I, H] and w2 [E, H, I] int8 or float8_e4m3fn with block scales
    [E, ceil(N/bn), ceil(K/bk)] float32 for block_size (bn, bk): w = q * the scale of its block. Returns [T, H] in
    x's dtype."""
    _check_moe_quant("fused_moe_w8", x, w13, w2, weights, ids, 1, activation)
    bn, bk = block_size
    for name, w, s in (("w13", w13, w13_scale), ("w2", w2, w2_scale)):
        if tuple(s.shape) != (w.shape[0], -(-w.shape[1] // bn), -(-w.shape[2] // bk)):
            raise ValueError(f"fused_moe_w8: {name}_scale must be [E, ceil(N/{bn}), ceil(K/{bk})] for {name} "
                             f"{tuple(w.shape)}, got {tuple(s.shape)}")
    return _call("fused_moe_w8", x, w13, w13_scale, w2, w2_scale, weights, ids, block_size=(int(bn), int(bk)),
                 activation=activation)


def lora_shrink(x: torch.Tensor, a: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """LoRA's first matmul for rows whose adapters differ: h[t] = a[ids[t]] @ x[t] (float32 [T, R]; zero where
    ids[t] < 0, a row without an adapter). x [T, K], a [S, R, K] (each slot's down-projections, rank padded), ids [T]
    int32 or int64 slot ids on x's device."""
    if x.dim() != 2 or a.dim() != 3 or a.shape[2] != x.shape[1] or ids.shape != (x.shape[0],):
        raise ValueError(f"lora_shrink expects x [T, K], a [S, R, K] and ids [T]; got {tuple(x.shape)}, "
                         f"{tuple(a.shape)}, {tuple(ids.shape)}")
    if ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lora_shrink: ids must be int32 or int64, got {ids.dtype}")
    return _call("lora_shrink", x, a, ids)


def lora_expand(y: torch.Tensor, h: torch.Tensor, b: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """LoRA's second matmul, added into the base projection's output in place: y[t] += b[ids[t]] @ h[t] for rows
    with ids[t] >= 0 (b [S, N, R] holds each slot's up-projections with its scaling folded in; h [T, R] from
    `lora_shrink`). Returns y."""
    if y.dim() != 2 or b.dim() != 3 or b.shape[1] != y.shape[1] or h.shape != (y.shape[0], b.shape[2]) \
            or ids.shape != (y.shape[0],):
        raise ValueError(f"lora_expand expects y [T, N], h [T, R], b [S, N, R] and ids [T]; got {tuple(y.shape)}, "
                         f"{tuple(h.shape)}, {tuple(b.shape)}, {tuple(ids.shape)}")
    return _call("lora_expand", y, h, b, ids)


def quantize(
    x: torch.Tensor, *, dtype: str = "int8", scale: torch.Tensor | None = None, axis: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x to "int8" (per channel along `axis`) or "fp8_e4m3" (per tensor); returns (q, scale), x ~= q * scale."""
    return _call("quantize", x, dtype=dtype, scale=scale, axis=int(axis))


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, *, axis: int = 0, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of quantize: q * scale computed in float32, returned as out_dtype."""
    return _call("dequantize", q, scale, axis=int(axis), out_dtype=out_dtype)


def tokenize(
    texts: str | Sequence[str], tokenizer: Any, *, add_special_tokens: bool = True, return_offsets: bool = False
) -> dict[str, list]:
    """Encode a text (flat lists) or a batch of texts with a `tokenizers.Tokenizer`: {"input_ids", ["offsets"]}."""
    return _call("tokenize", texts, tokenizer, add_special_tokens=add_special_tokens, return_offsets=return_offsets)


def detokenize(tokens: Any, tokenizer: Any, *, skip_special_tokens: bool = True) -> str | list[str]:
    """Decode a flat token list to a string, or a batch (nested lists or a 2-D tensor) to a list of strings."""
    return _call("detokenize", tokens, tokenizer, skip_special_tokens=skip_special_tokens)
