"""Op signatures: which canonical arguments of each op a SelectionContext reads, and how.

`SIGNATURES[op].extract(args, kwargs)` returns the context fields of one canonical call; `args` and
`kwargs` name exactly the arguments it reads, which the dispatch call cache keys on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from layerzero.select.layout import resolve_layout


@dataclass(frozen=True, slots=True)
class OpSignature:
    """Which canonical arguments an op's context reads: positional indices and keyword names.

    The dispatch fast path keys its call cache on exactly these, so `extract` must read nothing else.
    """

    extract: Callable[[tuple[Any, ...], Mapping[str, Any]], dict[str, Any]]
    args: tuple[int, ...] | None  # None: every positional tensor
    kwargs: tuple[str, ...]


def _rows(x: torch.Tensor) -> int:
    return math.prod(x.shape[:-1]) if x.dim() else 1


def _attention(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    q, k, v = args[:3]
    layout = resolve_layout(q, k, v, kw.get("layout"))
    h, s = (2, 1) if layout == "BSHD" else (1, 2)
    return dict(
        batch=q.shape[0], seq_q=q.shape[s], seq_k=k.shape[s], tokens=q.shape[0] * q.shape[s], num_heads=q.shape[h],
        num_kv_heads=k.shape[h], head_dim=q.shape[3], layout=layout, causal=bool(kw.get("causal", True)),
        sliding_window=kw.get("sliding_window") is not None,
    )


def _varlen(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    q, k = args[:2]
    cu = kw.get("cu_seqlens_q")
    return dict(
        batch=max(cu.shape[0] - 1, 1) if isinstance(cu, torch.Tensor) else 1,
        seq_q=int(kw.get("max_seqlen_q") or q.shape[0]), seq_k=int(kw.get("max_seqlen_k") or k.shape[0]),
        tokens=q.shape[0], num_heads=q.shape[1], num_kv_heads=k.shape[1], head_dim=q.shape[2], layout="THD",
        causal=bool(kw.get("causal", True)), sliding_window=kw.get("sliding_window") is not None,
    )


def _paged(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    q, key_cache = args[:2]
    block_tables = kw["block_tables"]
    capacity = block_tables.shape[1] * key_cache.shape[1]
    return dict(
        batch=q.shape[0], seq_q=1, seq_k=int(kw.get("max_context_len") or capacity), tokens=q.shape[0],
        num_heads=q.shape[1], num_kv_heads=key_cache.shape[2], head_dim=q.shape[2], layout="NHD", causal=True,
        sliding_window=kw.get("sliding_window") is not None, kv_cache_layout="NHD", kv_cache_dtype=key_cache.dtype,
        kv_strategy="paged", params=(("block_size", key_cache.shape[1]),),
    )


def _paged_prefill(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    q, key_cache = args[:2]
    return dict(
        batch=max(kw["cu_seqlens_q"].shape[0] - 1, 1), seq_q=int(kw["max_seqlen_q"]), seq_k=int(kw["max_context_len"]),
        tokens=q.shape[0], num_heads=q.shape[1], num_kv_heads=key_cache.shape[2], head_dim=q.shape[2], layout="THD",
        causal=True, sliding_window=kw.get("sliding_window") is not None, kv_cache_layout="NHD",
        kv_cache_dtype=key_cache.dtype, kv_strategy="paged", params=(("block_size", key_cache.shape[1]),),
    )


def _store(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    key, _, key_cache = args[:3]
    return dict(
        tokens=key.shape[0], num_kv_heads=key.shape[1], head_dim=key.shape[2], kv_cache_layout="NHD",
        kv_cache_dtype=key_cache.dtype, kv_strategy="paged", params=(("block_size", key_cache.shape[1]),),
    )


def _projection(proj: torch.Tensor | None) -> tuple[tuple[str, Any], ...]:
    """The params of a projection an op takes with its input (`proj`): its shape and dtype, 0 x 0 without one."""
    if proj is None:
        return ("proj_rows", 0), ("proj_columns", 0), ("proj_dtype", None)
    return (("proj_rows", proj.shape[0]), ("proj_columns", proj.shape[1]),
            ("proj_dtype", str(proj.dtype).removeprefix("torch.")))


def _rope_store(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    """rope_store_kv: qkv's tokens and heads (x's tokens with a `proj` weight [N, K], whose shape is a param)."""
    qkv, key_cache, q_norm_weight = args[0], args[3], args[6]
    proj = args[8] if len(args) > 8 else None
    heads, head_dim = int(kw["num_heads"]), key_cache.shape[3]
    return dict(
        tokens=qkv.shape[0], num_heads=heads, num_kv_heads=key_cache.shape[2], head_dim=head_dim,
        hidden=head_dim, kv_cache_layout="NHD", kv_cache_dtype=key_cache.dtype, kv_strategy="paged",
        params=(("interleaved", bool(kw.get("interleaved", False))), ("qk_norm", q_norm_weight is not None),
                ("block_size", key_cache.shape[1]), *_projection(proj)),
    )


def _rowwise(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x = args[0]
    extra = tuple((name, kw[name]) for name in ("approximate", "interleaved") if name in kw)
    return dict(tokens=_rows(x), hidden=x.shape[-1] if x.dim() else 1, params=extra)


def _add_norm(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    """fused_add_rms_norm: x's rows, and the residual's dtype (bf16 x may be added to a float32 residual stream)."""
    return {**_rowwise(args, kw), "params": (("residual_dtype", str(args[1].dtype).removeprefix("torch.")),)}


def _rope(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x = args[0]
    return dict(tokens=x.shape[0], num_heads=x.shape[-2], head_dim=x.shape[-1], hidden=x.shape[-1],
                params=(("interleaved", bool(kw.get("interleaved", False))),))


def _layer_norm(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, shape = args[0], tuple(args[1])
    weight, bias = (args[2] if len(args) > 2 else None), (args[3] if len(args) > 3 else None)
    return dict(tokens=max(x.numel() // max(math.prod(shape), 1), 1), hidden=math.prod(shape),
                params=(("norm_dims", len(shape)), ("affine", weight is not None), ("bias", bias is not None)))


def _linear(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, weight = args[:2]
    bias = args[2] if len(args) > 2 else None
    return dict(tokens=_rows(x), hidden=x.shape[-1], params=(
        ("out_features", weight.shape[0]), ("bias", bias is not None),
        ("weight_dtype", str(weight.dtype).removeprefix("torch."))))


def _linear_int4(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, qweight, _, bias = args[:4]
    return dict(tokens=_rows(x), hidden=x.shape[-1],
                params=(("out_features", qweight.shape[0]), ("bias", bias is not None), ("group_size", kw["group_size"])))


def _linear_w8(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, weight, _, bias = args[:4]
    return dict(tokens=_rows(x), hidden=x.shape[-1], quant_format=_w8_format(weight.dtype),
                params=(("out_features", weight.shape[0]), ("bias", bias is not None), ("block_size", kw["block_size"])))


def _w8_format(dtype: torch.dtype) -> str:
    return "int8" if dtype == torch.int8 else "fp8_e4m3"


def _embedding(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    ids, weight = args[:2]
    return dict(tokens=ids.numel(), hidden=weight.shape[-1], dtype=weight.dtype)


def _argmax(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x = args[0]
    return dict(tokens=x.shape[0] if x.dim() else 1, hidden=x.shape[-1] if x.dim() else 1, params=(("ndim", x.dim()),))


MOE_GATHER_PAIRS = 64  # most (token, expert) pairs the gathered MoE path takes: beyond, the copies outgrow the reads
# most pairs the sort-free Triton decode path takes: beyond, pairs share experts and re-reading them costs more than the
# grouped GEMM's sort (benchmarks/reports/moe_gpu_h200.md)
MOE_DECODE_PAIRS = 32


def _moe_route(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    logits = args[0]
    return dict(tokens=_rows(logits), hidden=logits.shape[-1], params=(
        ("top_k", int(args[1])), ("renormalize", bool(kw["renormalize"])), ("scoring", kw.get("scoring", "softmax"))))


def _moe_gate(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, router = args[0], args[1]
    return dict(tokens=_rows(x), hidden=x.shape[-1], params=(
        ("experts", router.shape[0]), ("top_k", int(args[2])), ("renormalize", bool(kw["renormalize"])),
        ("scoring", kw.get("scoring", "softmax"))))


def _stack_dtypes(w13: Any, w2: Any) -> str:
    """The experts' dtype ('bfloat16'), or both where the two stacks differ ('bfloat16 and float32')."""
    names = [str(w.dtype).removeprefix("torch.") for w in (w13, w2)]
    return names[0] if names[0] == names[1] else " and ".join(names)


def _fused_moe(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, w13, w2, _, ids = args[:5]
    pairs = ids.numel()
    return dict(tokens=_rows(x), hidden=x.shape[-1], params=(
        ("experts", w13.shape[0]), ("inner", w13.shape[1] // 2), ("top_k", ids.shape[-1]),
        ("activation", kw.get("activation", "silu")), ("weight_dtype", _stack_dtypes(w13, w2)),
        ("few_pairs", pairs <= MOE_GATHER_PAIRS), ("decode_pairs", pairs <= MOE_DECODE_PAIRS)))


def _reduce_add_norm(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    """all_reduce_add_rms_norm: fused_add_rms_norm's context over the residual's rows (x is the projection's input
    when a `proj` weight is given) and the projection's shape (0 x 0 without one)."""
    residual, proj = args[1], args[3] if len(args) > 3 else None
    ctx = _add_norm((residual, residual), kw)
    return {**ctx, "params": (*ctx["params"], *_projection(proj))}


def _add_norm_router(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    """fused_add_rms_norm_router: fused_add_rms_norm's context over the residual's rows (x is the projection's input
    when a `proj` weight is given), the router's experts and the projection's shape (0 x 0 without one)."""
    residual, router, proj = args[1], args[3], args[4] if len(args) > 4 else None
    ctx = _add_norm((residual, residual), kw)
    return {**ctx, "params": (*ctx["params"], ("experts", router.shape[0]), *_projection(proj))}


def _fused_moe_routed(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, w13, w2, logits, top_k = args[:5]
    pairs = logits.shape[0] * int(top_k)
    return dict(tokens=_rows(x), hidden=x.shape[-1], params=(
        ("experts", w13.shape[0]), ("inner", w13.shape[1] // 2), ("top_k", int(top_k)),
        ("renormalize", bool(kw["renormalize"])), ("scoring", kw.get("scoring", "softmax")),
        ("activation", kw.get("activation", "silu")), ("weight_dtype", _stack_dtypes(w13, w2)),
        ("decode_pairs", pairs <= MOE_DECODE_PAIRS)))


def _fused_moe_quant(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, w13, ids = args[0], args[1], args[6]
    block = ("block_size", tuple(kw["block_size"])) if "block_size" in kw else ("group_size", kw["group_size"])
    fmt = _w8_format(w13.dtype) if "block_size" in kw else None
    return dict(tokens=_rows(x), hidden=x.shape[-1], quant_format=fmt, params=(
        ("experts", w13.shape[0]), ("inner", w13.shape[1] // 2), ("top_k", ids.shape[-1]),
        ("activation", kw.get("activation", "silu")), ("decode_pairs", ids.numel() <= MOE_DECODE_PAIRS), block))


def _lora(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x, w = args[0], args[-2]  # shrink (x, a [S, R, K], ids), expand (y, h, b [S, N, R], ids)
    rank = w.shape[2] if len(args) == 4 else w.shape[1]
    return dict(tokens=_rows(x), hidden=x.shape[-1], params=(("slots", w.shape[0]), ("rank", rank)))


def _generic(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x = next((a for a in args if isinstance(a, torch.Tensor)), None)
    if x is None:
        return {}
    return dict(tokens=_rows(x), hidden=x.shape[-1] if x.dim() else 1)


def _sampling(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    return _generic(args[:1], kw)


def _topk(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    return {**_generic(args[:1], kw), "params": (("k", int(args[1])),)}


def _quantize(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    return {**_generic(args[:1], kw), "quant_format": kw.get("dtype", "int8"),
            "params": (("axis", kw.get("axis", 0)), ("scale_given", kw.get("scale") is not None))}


def _dequantize(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    q = args[0]
    fmt = "int8" if q.dtype == torch.int8 else str(q.dtype).removeprefix("torch.")
    return {**_generic(args[:1], kw), "quant_format": fmt, "params": (("axis", kw.get("axis", 0)),)}


def tokenizer_key(**identity: str) -> str:
    """Full SHA-256 over a tokenizer's identity fields (never truncated: a prefix could collide)."""
    text = "\n".join(f"{k}={identity[k]}" for k in sorted(identity))
    return hashlib.sha256(text.encode()).hexdigest()


def _tokenizer(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    from layerzero.kernels.reference.tokenize import cached_identity  # imports the optional `tokenizers` package

    identity = cached_identity(args[1]).to_dict()
    return {"tokenizer_key": tokenizer_key(**identity), "return_offsets": bool(kw.get("return_offsets", False))}


DEFAULT_SIGNATURE = OpSignature(_generic, None, ())
SIGNATURES: dict[str, OpSignature] = {
    "attention": OpSignature(_attention, (0, 1, 2), ("causal", "sliding_window", "layout")),
    "varlen_attention": OpSignature(
        _varlen, (0, 1, 2), ("cu_seqlens_q", "max_seqlen_q", "max_seqlen_k", "causal", "sliding_window")
    ),
    "paged_attention": OpSignature(_paged, (0, 1, 2), ("block_tables", "max_context_len", "sliding_window")),
    "paged_prefill_attention": OpSignature(
        _paged_prefill, (0, 1, 2), ("block_tables", "cu_seqlens_q", "max_seqlen_q", "max_context_len", "sliding_window")
    ),
    "store_kv_cache": OpSignature(_store, (0, 1, 2, 3), ()),
    "rope_store_kv": OpSignature(_rope_store, (0, 1, 2, 3, 4, 6, 7, 8), ("num_heads", "interleaved")),
    "rms_norm": OpSignature(_rowwise, (0, 1), ()),
    "fused_add_rms_norm": OpSignature(_add_norm, (0, 1, 2), ()),
    "layer_norm": OpSignature(_layer_norm, (0, 1, 2, 3), ()),
    "rope": OpSignature(_rope, (0, 1, 2), ("interleaved",)),
    "silu_and_mul": OpSignature(_rowwise, (0,), ()),
    "gelu_and_mul": OpSignature(_rowwise, (0,), ("approximate",)),
    "linear": OpSignature(_linear, (0, 1, 2), ()),
    "linear_int4": OpSignature(_linear_int4, (0, 1, 2, 3), ("group_size",)),
    "linear_w8": OpSignature(_linear_w8, (0, 1, 2, 3), ("block_size",)),
    "embedding": OpSignature(_embedding, (0, 1), ()),
    "argmax": OpSignature(_argmax, (0,), ()),
    "moe_route": OpSignature(_moe_route, (0,), ("renormalize", "scoring")),
    "moe_gate": OpSignature(_moe_gate, (0, 1), ("renormalize", "scoring")),
    "fused_moe": OpSignature(_fused_moe, (0, 1, 2, 3, 4), ("activation",)),
    "fused_add_rms_norm_router": OpSignature(_add_norm_router, (0, 1, 2, 3, 4), ()),
    "fused_moe_routed": OpSignature(_fused_moe_routed, (0, 1, 2, 3, 4), ("renormalize", "scoring", "activation")),
    "fused_moe_int4": OpSignature(_fused_moe_quant, (0, 1, 2, 3, 4, 5, 6), ("group_size", "activation")),
    "fused_moe_w8": OpSignature(_fused_moe_quant, (0, 1, 2, 3, 4, 5, 6), ("block_size", "activation")),
    "lora_shrink": OpSignature(_lora, (0, 1, 2), ()),
    "lora_expand": OpSignature(_lora, (0, 1, 2, 3), ()),
    "sample_topk": OpSignature(_topk, (0, 1), ()),
    "sample_topp": OpSignature(_sampling, (0,), ()),
    "quantize": OpSignature(_quantize, (0,), ("dtype", "axis", "scale")),
    "dequantize": OpSignature(_dequantize, (0,), ("axis",)),
    # The tokenizer object itself is part of the call key (held, so its id is never reused); its identity
    # is read on a call-cache miss (reference.tokenize.cached_identity).
    # collectives: the group is not part of the context (a process has one tensor-parallel group per model)
    "all_reduce": OpSignature(_rowwise, (0,), ()),
    "all_reduce_add_rms_norm": OpSignature(_reduce_add_norm, (0, 1, 2, 3), ()),
    "all_gather": OpSignature(_rowwise, (0,), ()),
    "broadcast": OpSignature(_rowwise, (0,), ("src",)),
    "tokenize": OpSignature(_tokenizer, (1,), ("return_offsets",)),
    "detokenize": OpSignature(_tokenizer, (1,), ()),
}

# The seed spec's dotted operation names, accepted wherever an op id is (explain, which, lock, bind, ...).
SPEC_ALIASES: dict[str, str] = {
    "tokenize.encode": "tokenize", "tokenize.decode": "detokenize", "embedding.lookup": "embedding",
    "posenc.rope": "rope", "attention.causal": "attention", "attention.full": "attention",
    "attention.paged": "paged_attention", "mlp.linear": "linear", "norm.rms": "rms_norm", "norm.layer": "layer_norm",
    "sampling.topk": "sample_topk", "sampling.topp": "sample_topp",
}
# Spec names with no single op here, and what to use instead.
SPEC_UNMAPPED: dict[str, str] = {
    "mlp.fused": "the gated activation is its own op: silu_and_mul or gelu_and_mul (the projections are linear)",
    "posenc.alibi": "no model served here uses ALiBi, so there is no op for it",
    "sampling.speculative": "speculative decoding is the runtime's (infer's speculative config), not a kernel op",
}


def canonical_op(op: str) -> str:
    """Our op id for `op`, which may be a spec dotted name (`norm.rms` -> `rms_norm`); other names pass through."""
    if op in SPEC_UNMAPPED:
        raise ValueError(f"op {op!r}: {SPEC_UNMAPPED[op]}")
    return SPEC_ALIASES.get(op, op)
