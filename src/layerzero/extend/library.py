"""torch.library custom ops `torch.ops.layerzero.<op>`: what torch.compile sees instead of the dispatcher.

Each op has a fake (meta) implementation for tracing; its real implementation runs
`layerzero.dispatch.call.dispatch`, so kernel selection happens at run time, outside the compiled graph.
Outputs are always fresh contiguous tensors, as the fake implementations promise.
`call_op` maps a canonical kernel call (the contract's signatures) onto these schemas.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.library import custom_op


def _dispatch(op: str, *args: Any, **kwargs: Any) -> Any:
    from layerzero.dispatch.call import dispatch

    return dispatch(op, *args, **kwargs)


def _fresh(out: Tensor, inputs: Sequence[object]) -> Tensor:
    """A contiguous output sharing no storage with any input (custom ops may not return aliases)."""
    storage = out.untyped_storage().data_ptr()
    shared = any(isinstance(t, Tensor) and t.untyped_storage().data_ptr() == storage for t in inputs)
    return out.clone(memory_format=torch.contiguous_format) if shared or not out.is_contiguous() else out


def _attention_shape(query: Tensor, value: Tensor) -> list[int]:
    return [*query.shape[:-1], value.shape[-1]]


@custom_op("layerzero::attention", mutates_args=())
def attention(
    query: Tensor, key: Tensor, value: Tensor, *, causal: bool, scale: float, sliding_window: int | None, layout: str
) -> Tensor:
    """Dense attention, BSHD or BHSD; output in the query's layout."""
    out = _dispatch(
        "attention", query, key, value, causal=causal, scale=scale, sliding_window=sliding_window, layout=layout
    )
    return _fresh(out, (query, key, value))


@attention.register_fake
def _(query, key, value, *, causal, scale, sliding_window, layout):
    return query.new_empty(_attention_shape(query, value))


@custom_op("layerzero::varlen_attention", mutates_args=())
def varlen_attention(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool,
    scale: float,
    sliding_window: int | None,
    cu_seqlens_host_q: list[int] | None,
    cu_seqlens_host_k: list[int] | None,
) -> Tensor:
    """Packed variable-length attention; the host copies of cu_seqlens arrive as two int lists (or None)."""
    given = cu_seqlens_host_q is not None and cu_seqlens_host_k is not None
    host = (list(cu_seqlens_host_q), list(cu_seqlens_host_k)) if given else None
    out = _dispatch(
        "varlen_attention", query, key, value, cu_seqlens_q=cu_seqlens_q, cu_seqlens_k=cu_seqlens_k,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal, scale=scale,
        sliding_window=sliding_window, cu_seqlens_host=host,
    )
    return _fresh(out, (query, key, value))


@varlen_attention.register_fake
def _(query, key, value, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *, causal, scale, sliding_window,
      cu_seqlens_host_q, cu_seqlens_host_k):
    return query.new_empty(_attention_shape(query, value))


@custom_op("layerzero::paged_attention", mutates_args=())
def paged_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    context_lens: Tensor,
    *,
    scale: float,
    sliding_window: int | None,
    max_context_len: int,
) -> Tensor:
    """Decode attention over a paged KV cache: query [B, H, D] -> [B, H, Dv]."""
    out = _dispatch(
        "paged_attention", query, key_cache, value_cache, block_tables=block_tables, context_lens=context_lens,
        scale=scale, sliding_window=sliding_window, max_context_len=max_context_len,
    )
    return _fresh(out, (query, key_cache, value_cache))


@paged_attention.register_fake
def _(query, key_cache, value_cache, block_tables, context_lens, *, scale, sliding_window, max_context_len):
    return query.new_empty(_attention_shape(query, value_cache))


@custom_op("layerzero::paged_prefill_attention", mutates_args=())
def paged_prefill_attention(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    cu_seqlens_q: Tensor,
    context_lens: Tensor,
    *,
    max_seqlen_q: int,
    max_context_len: int,
    scale: float,
    sliding_window: int | None,
    cu_seqlens_q_host: list[int] | None,
    context_lens_host: list[int] | None,
) -> Tensor:
    """Packed prefill attention over a paged KV cache: query [T, H, D] -> [T, H, Dv]."""
    out = _dispatch(
        "paged_prefill_attention", query, key_cache, value_cache, block_tables=block_tables,
        cu_seqlens_q=cu_seqlens_q, context_lens=context_lens, max_seqlen_q=max_seqlen_q,
        max_context_len=max_context_len, scale=scale, sliding_window=sliding_window,
        cu_seqlens_q_host=cu_seqlens_q_host, context_lens_host=context_lens_host,
    )
    return _fresh(out, (query, key_cache, value_cache))


@paged_prefill_attention.register_fake
def _(query, key_cache, value_cache, block_tables, cu_seqlens_q, context_lens, *, max_seqlen_q, max_context_len,
      scale, sliding_window, cu_seqlens_q_host, context_lens_host):
    return query.new_empty(_attention_shape(query, value_cache))


@custom_op("layerzero::store_kv_cache", mutates_args=("key_cache", "value_cache"))
def store_kv_cache(key: Tensor, value: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor) -> None:
    """Scatter key/value [T, Hkv, D] into the paged caches, in place; slots < 0 are skipped."""
    _dispatch("store_kv_cache", key, value, key_cache, value_cache, slot_mapping)


@store_kv_cache.register_fake
def _(key, value, key_cache, value_cache, slot_mapping):
    return None


@custom_op("layerzero::rope_store_kv", mutates_args=("key_cache", "value_cache"))
def rope_store_kv(
    qkv: Tensor, cos: Tensor, sin: Tensor, key_cache: Tensor, value_cache: Tensor, slot_mapping: Tensor,
    q_norm_weight: Tensor | None, k_norm_weight: Tensor | None, proj: Tensor | None = None, *, num_heads: int,
    eps: float, weight_offset: float, interleaved: bool,
) -> Tensor:
    """Optional QK-norm and RoPE of qkv's q and k heads, K/V stored in the caches in place; returns q [T, H, D]. With
    `proj`, qkv is x [T, K], projected first."""
    out = _dispatch("rope_store_kv", qkv, cos, sin, key_cache, value_cache, slot_mapping, q_norm_weight,
                    k_norm_weight, proj, num_heads=num_heads, eps=eps, weight_offset=weight_offset,
                    interleaved=interleaved)
    return _fresh(out, (qkv, cos, sin, key_cache, value_cache, q_norm_weight, k_norm_weight, proj))


@rope_store_kv.register_fake
def _(qkv, cos, sin, key_cache, value_cache, slot_mapping, q_norm_weight, k_norm_weight, proj=None, *, num_heads,
      eps, weight_offset, interleaved):
    return qkv.new_empty([qkv.shape[0], num_heads, key_cache.shape[3]])


@custom_op("layerzero::rms_norm", mutates_args=())
def rms_norm(x: Tensor, weight: Tensor, *, eps: float, weight_offset: float) -> Tensor:
    """RMSNorm over the last dim, output in x.dtype."""
    return _fresh(_dispatch("rms_norm", x, weight, eps=eps, weight_offset=weight_offset), (x, weight))


@rms_norm.register_fake
def _(x, weight, *, eps, weight_offset):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@custom_op("layerzero::fused_add_rms_norm", mutates_args=())
def fused_add_rms_norm(
    x: Tensor, residual: Tensor, weight: Tensor, *, eps: float, weight_offset: float
) -> tuple[Tensor, Tensor]:
    """(rms_norm(x + residual) in x.dtype, x + residual), inputs untouched."""
    normed, summed = _dispatch("fused_add_rms_norm", x, residual, weight, eps=eps, weight_offset=weight_offset)
    inputs = (x, residual, weight)
    return _fresh(normed, inputs), _fresh(summed, (*inputs, normed))


@fused_add_rms_norm.register_fake
def _(x, residual, weight, *, eps, weight_offset):
    shape = torch.broadcast_shapes(x.shape, residual.shape)
    return x.new_empty(shape), x.new_empty(shape, dtype=torch.result_type(x, residual))


@custom_op("layerzero::layer_norm", mutates_args=())
def layer_norm(
    x: Tensor, normalized_shape: list[int], weight: Tensor | None, bias: Tensor | None, *, eps: float
) -> Tensor:
    """LayerNorm over the trailing `normalized_shape` dims, output in x.dtype."""
    out = _dispatch("layer_norm", x, tuple(normalized_shape), weight, bias, eps=eps)
    return _fresh(out, (x, weight, bias))


@layer_norm.register_fake
def _(x, normalized_shape, weight, bias, *, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@custom_op("layerzero::rope", mutates_args=())
def rope(x: Tensor, cos: Tensor, sin: Tensor, *, interleaved: bool) -> Tensor:
    """Rotary embedding of x [T, H, D] with per-token cos/sin [T, D/2]."""
    return _fresh(_dispatch("rope", x, cos, sin, interleaved=interleaved), (x, cos, sin))


@rope.register_fake
def _(x, cos, sin, *, interleaved):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _gated_fake(x: Tensor) -> Tensor:
    return x.new_empty([*x.shape[:-1], x.shape[-1] // 2])


@custom_op("layerzero::silu_and_mul", mutates_args=())
def silu_and_mul(x: Tensor) -> Tensor:
    """silu(x[..., :I]) * x[..., I:]."""
    return _fresh(_dispatch("silu_and_mul", x), (x,))


silu_and_mul.register_fake(_gated_fake)


@custom_op("layerzero::gelu_and_mul", mutates_args=())
def gelu_and_mul(x: Tensor, *, approximate: str) -> Tensor:
    """gelu(x[..., :I], approximate) * x[..., I:]."""
    return _fresh(_dispatch("gelu_and_mul", x, approximate=approximate), (x,))


@gelu_and_mul.register_fake
def _(x, *, approximate):
    return _gated_fake(x)


@custom_op("layerzero::linear", mutates_args=())
def linear(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    """x @ weight.T (+ bias)."""
    return _fresh(_dispatch("linear", x, weight, bias), (x, weight, bias))


@linear.register_fake
def _(x, weight, bias):
    return x.new_empty([*x.shape[:-1], weight.shape[0]])


@custom_op("layerzero::linear_int4", mutates_args=())
def linear_int4(x: Tensor, qweight: Tensor, scales_zeros: Tensor, bias: Tensor | None, *, group_size: int) -> Tensor:
    """x @ W.T (+ bias) for a 4-bit packed weight (layerzero.api.linear_int4)."""
    return _fresh(_dispatch("linear_int4", x, qweight, scales_zeros, bias, group_size=group_size),
                  (x, qweight, scales_zeros, bias))


@linear_int4.register_fake
def _(x, qweight, scales_zeros, bias, *, group_size):
    return x.new_empty([*x.shape[:-1], qweight.shape[0]])


@custom_op("layerzero::linear_w8", mutates_args=())
def linear_w8(x: Tensor, weight: Tensor, scale: Tensor, bias: Tensor | None, *, block_size: list[int]) -> Tensor:
    """x @ W.T (+ bias) for an 8-bit weight with block scales (layerzero.api.linear_w8)."""
    return _fresh(_dispatch("linear_w8", x, weight, scale, bias, block_size=tuple(block_size)), (x, weight, scale, bias))


@linear_w8.register_fake
def _(x, weight, scale, bias, *, block_size):
    return x.new_empty([*x.shape[:-1], weight.shape[0]])


@custom_op("layerzero::embedding", mutates_args=())
def embedding(ids: Tensor, weight: Tensor) -> Tensor:
    """Rows of `weight` at `ids`."""
    return _fresh(_dispatch("embedding", ids, weight), (ids, weight))


@embedding.register_fake
def _(ids, weight):
    return weight.new_empty([*ids.shape, weight.shape[-1]])


@custom_op("layerzero::sample_topk", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def sample_topk(logits: Tensor, k: int, noise: Tensor | None, *, temperature: float) -> Tensor:
    """One token id per row from the top-k logits; uniform `noise` makes it deterministic (no generator here)."""
    return _fresh(_dispatch("sample_topk", logits, k, temperature=temperature, generator=None, noise=noise), (logits,))


@custom_op("layerzero::sample_topp", mutates_args=(), tags=(torch.Tag.nondeterministic_seeded,))
def sample_topp(logits: Tensor, p: float, noise: Tensor | None, *, temperature: float) -> Tensor:
    """One token id per row from the top-p nucleus; uniform `noise` makes it deterministic (no generator here)."""
    return _fresh(_dispatch("sample_topp", logits, p, temperature=temperature, generator=None, noise=noise), (logits,))


def _sample_fake(logits, k_or_p, noise, *, temperature):
    return logits.new_empty(logits.shape[:-1], dtype=torch.int64)


sample_topk.register_fake(_sample_fake)
sample_topp.register_fake(_sample_fake)


@custom_op("layerzero::argmax", mutates_args=())
def argmax(x: Tensor) -> Tensor:
    """torch.argmax(x, dim=-1) of x [rows, V]: int64 [rows]."""
    return _fresh(_dispatch("argmax", x), (x,))


@argmax.register_fake
def _(x):
    return x.new_empty(x.shape[:-1], dtype=torch.int64)


@custom_op("layerzero::quantize", mutates_args=())
def quantize(x: Tensor, scale: Tensor | None, *, dtype: str, axis: int) -> tuple[Tensor, Tensor]:
    """(q, scale): int8 per channel along `axis`, or fp8_e4m3 per tensor."""
    q, out_scale = _dispatch("quantize", x, dtype=dtype, scale=scale, axis=axis)
    return _fresh(q, (x, scale)), _fresh(out_scale, (x, scale))


@quantize.register_fake
def _(x, scale, *, dtype, axis):
    q_dtype = torch.int8 if dtype == "int8" else torch.float8_e4m3fn
    scale_shape = scale.shape if scale is not None else ([x.shape[axis]] if dtype == "int8" else [])
    return x.new_empty(x.shape, dtype=q_dtype), x.new_empty(scale_shape, dtype=torch.float32)


@custom_op("layerzero::dequantize", mutates_args=())
def dequantize(q: Tensor, scale: Tensor, *, axis: int, out_dtype: torch.dtype) -> Tensor:
    """q * scale in float32, returned as out_dtype."""
    return _fresh(_dispatch("dequantize", q, scale, axis=axis, out_dtype=out_dtype), (q, scale))


@dequantize.register_fake
def _(q, scale, *, axis, out_dtype):
    return q.new_empty(q.shape, dtype=out_dtype)


OPS: dict[str, Any] = {
    "attention": attention, "varlen_attention": varlen_attention, "paged_attention": paged_attention,
    "paged_prefill_attention": paged_prefill_attention, "store_kv_cache": store_kv_cache,
    "rope_store_kv": rope_store_kv, "rms_norm": rms_norm, "fused_add_rms_norm": fused_add_rms_norm,
    "layer_norm": layer_norm, "rope": rope, "silu_and_mul": silu_and_mul, "gelu_and_mul": gelu_and_mul,
    "linear": linear, "linear_int4": linear_int4, "linear_w8": linear_w8, "embedding": embedding, "sample_topk": sample_topk, "sample_topp": sample_topp,
    "argmax": argmax, "quantize": quantize, "dequantize": dequantize,
}


def _varlen_call(*args: Any, cu_seqlens_host: tuple[Sequence[int], Sequence[int]] | None = None, **kwargs: Any) -> Any:
    host_q, host_k = (None, None) if cu_seqlens_host is None else (list(cu_seqlens_host[0]), list(cu_seqlens_host[1]))
    return torch.ops.layerzero.varlen_attention(*args, cu_seqlens_host_q=host_q, cu_seqlens_host_k=host_k, **kwargs)


def _sample_call(op: str) -> Callable[..., Any]:
    def call(logits: Tensor, k_or_p: float, *, temperature: float = 1.0, generator: object = None,
             noise: Tensor | None = None) -> Any:
        if generator is not None:
            raise ValueError(f"lz.{op} under torch.compile takes `noise` (uniform in (0, 1)), not a torch.Generator")
        return getattr(torch.ops.layerzero, op)(logits, k_or_p, temperature=temperature, noise=noise)

    return call


def _layer_norm_call(x: Tensor, normalized_shape: Sequence[int], *args: Any, **kwargs: Any) -> Any:
    return torch.ops.layerzero.layer_norm(x, list(normalized_shape), *args, **kwargs)


_ADAPTERS: dict[str, Callable[..., Any]] = {
    "varlen_attention": _varlen_call, "layer_norm": _layer_norm_call,
    "sample_topk": _sample_call("sample_topk"), "sample_topp": _sample_call("sample_topp"),
}


def call_op(op: str, *args: Any, **kwargs: Any) -> Any:
    """Run the canonical call `op(*args, **kwargs)` through `torch.ops.layerzero.<op>` (traceable by torch.compile)."""
    adapter = _ADAPTERS.get(op)
    if adapter is not None:
        return adapter(*args, **kwargs)
    if op not in OPS:
        raise KeyError(f"no torch.library op for {op!r}; ops: {sorted(OPS)}")
    return getattr(torch.ops.layerzero, op)(*args, **kwargs)
