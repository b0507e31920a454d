"""SelectionContext: everything about one call that decides which kernels may run it and how fast.

Built from the canonical call of an op (the arguments kernels receive). Device facts are read per tensor
device (sm from `torch.cuda.get_device_capability(device)`, cached per device), never process-wide.
`validity_key()` holds the fields that decide validity exactly; `perf_bucket()` buckets the sizes that only
change speed.
"""

from __future__ import annotations

import hashlib
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from layerzero.graphs import is_capturing
from layerzero.layout import resolve_layout

SEQ_BUCKETS = (1, 16, 128, 512, 2048, 8192, 32768)
BATCH_BUCKETS = (1, 4, 16, 64, 256)
PERF_FIELDS = frozenset({"batch", "seq_q", "seq_k", "tokens"})

# appendix J.1, with Ada corrected to 4th-generation tensor cores
_GENERATIONS = ((75, 80, "turing", 2), (80, 89, "ampere", 3), (89, 90, "ada", 4), (90, 100, "hopper", 4),
                (100, 200, "blackwell", 5))
_TOKENIZER_FIELDS = ("tokenizer_id", "vocab_hash", "merges_hash", "added_tokens_hash", "normalizer_id",
                     "pretokenizer_id", "special_tokens_hash")


def gpu_generation(sm: int | None) -> tuple[str | None, int | None]:
    """(generation name, tensor-core generation) of an SM version; (None, None) off CUDA or before Turing."""
    if sm is not None:
        for lo, hi, name, tc in _GENERATIONS:
            if lo <= sm < hi:
                return name, tc
    return None, None


def instruction_sets(sm: int | None) -> frozenset[str]:
    """Tensor-core instruction families of an SM: wgmma is sm_90 only, tcgen05 is datacenter Blackwell (sm_10x/11x)."""
    if sm is None or sm < 75:
        return frozenset()
    sets = {"mma.sync"}
    if sm == 90:
        sets.add("wgmma")
    if 100 <= sm < 120:
        sets.add("tcgen05.mma")
    return frozenset(sets)


class _DeviceFacts:
    """Per-device capability cache; `refresh()` re-reads it and bumps `version` (the caches key on it)."""

    def __init__(self) -> None:
        self._sm: dict[int, int] = {}
        self._lock = threading.Lock()
        self.version = 0

    def sm(self, device: torch.device) -> int | None:
        if device.type != "cuda":
            return None
        index = device.index if device.index is not None else torch.cuda.current_device()
        cached = self._sm.get(index)
        if cached is None:
            major, minor = torch.cuda.get_device_capability(index)
            cached = major * 10 + minor
            with self._lock:
                self._sm[index] = cached
        return cached

    def refresh(self) -> None:
        with self._lock:
            self._sm.clear()
            self.version += 1


DEVICES = _DeviceFacts()


def _cuda_version() -> tuple[int, int] | None:
    if not torch.version.cuda:
        return None
    major, minor = torch.version.cuda.split(".")[:2]
    return int(major), int(minor)


@dataclass(frozen=True, slots=True)
class SelectionContext:
    """One call as selection sees it. Sizes that do not apply to an op stay at their defaults."""

    op: str
    device: str = "cpu"
    platform: str = "cpu"
    sm: int | None = None
    cuda_version: tuple[int, int] | None = None
    dtype: torch.dtype | None = None
    batch: int = 1
    seq_q: int = 1
    seq_k: int = 1
    tokens: int = 1
    num_heads: int = 0
    num_kv_heads: int = 0
    head_dim: int = 0
    hidden: int = 0
    layout: str | None = None
    last_dim_contiguous: bool = True
    causal: bool = False
    sliding_window: bool = False
    attn_mask_type: str = "none"
    kv_cache_layout: str | None = None
    kv_cache_dtype: torch.dtype | None = None
    packed_weights_id: str | None = None
    quant_format: str | None = None
    input_quant_format: str | None = None
    max_accuracy_drop_pct: float | None = None
    tokenizer_key: str | None = None
    return_offsets: bool = False
    capturing: bool = False
    deterministic: bool = False
    tp_size: int = 1
    require_tp_invariant: bool = False
    reduction_order: str | None = None
    kv_strategy: str | None = None
    free_memory_bytes: int | None = None
    virtual_free_bytes: int | None = None
    spec_algorithm: str | None = None
    pp_size: int = 1
    draft_tp_size: int = 1
    spec_share_kv: bool = False
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def generation(self) -> str | None:
        return gpu_generation(self.sm)[0]

    @property
    def tensor_core_gen(self) -> int | None:
        return gpu_generation(self.sm)[1]

    @property
    def gqa(self) -> bool:
        return self.num_kv_heads not in (0, self.num_heads)

    def param(self, name: str, default: Any = None) -> Any:
        """An op-specific parameter recorded in `params` (e.g. "interleaved" for rope)."""
        for key, value in self.params:
            if key == name:
                return value
        return default

    def validity_key(self) -> tuple[Any, ...]:
        """Every field except the bucketed sizes, exactly."""
        return tuple(getattr(self, name) for name in _VALIDITY_FIELDS)

    def perf_bucket(self) -> str:
        """Sizes bucketed for the cache and the PerfDB (upper bound of each bucket; `inf` past the last)."""
        return (
            f"b{_bucket(self.batch, BATCH_BUCKETS)}.q{_bucket(self.seq_q, SEQ_BUCKETS)}"
            f".k{_bucket(self.seq_k, SEQ_BUCKETS)}.t{_bucket(self.tokens, SEQ_BUCKETS)}"
        )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view (dtypes as names)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, torch.dtype):
                value = str(value).removeprefix("torch.")
            elif f.name == "params":
                value = {k: v if isinstance(v, (int, float, str, bool, type(None))) else repr(v) for k, v in value}
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out

    def with_(self, **changes: Any) -> SelectionContext:
        """A copy with some fields changed."""
        return replace(self, **changes)

    @classmethod
    def from_tensors(cls, op: str, *args: Any, **params: Any) -> SelectionContext:
        """Context of a canonical call `op(*args, **params)`; extra keywords may set any context field."""
        signature = SIGNATURES.get(op, DEFAULT_SIGNATURE)
        values = signature.extract(args, params)
        first = next((a for a in args if isinstance(a, torch.Tensor)), None)
        device = first.device if first is not None else torch.device("cpu")
        values.setdefault("dtype", first.dtype if first is not None else None)
        values["device"] = str(device)
        values["platform"] = device.type
        values["sm"] = DEVICES.sm(device)
        values["cuda_version"] = _cuda_version() if device.type == "cuda" else None
        values["last_dim_contiguous"] = all(
            a.dim() == 0 or a.stride(-1) == 1 for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()
        )
        values["capturing"] = device.type == "cuda" and is_capturing(device)
        values["deterministic"] = torch.are_deterministic_algorithms_enabled()
        tokenizer = {k: params[k] for k in _TOKENIZER_FIELDS if params.get(k) is not None}
        if tokenizer:
            values["tokenizer_key"] = tokenizer_key(**tokenizer)
        for name in CONTEXT_PARAMS:
            if params.get(name) is not None:
                values[name] = params[name]
        return cls(op=op, **values)


def tokenizer_key(**identity: str) -> str:
    """Full SHA-256 over a tokenizer's identity fields (appendix I.8: never truncated)."""
    text = "\n".join(f"{k}={identity[k]}" for k in sorted(identity))
    return hashlib.sha256(text.encode()).hexdigest()


def _bucket(value: int, bounds: tuple[int, ...]) -> str:
    for bound in bounds:
        if value <= bound:
            return str(bound)
    return "inf"


_VALIDITY_FIELDS = tuple(f.name for f in fields(SelectionContext) if f.name not in PERF_FIELDS)
# Call facts no op argument carries (deployment, quantization, tokenizer options); from_tensors takes them
# as keywords. An op whose canonical signature has one must list it in its OpSignature.kwargs.
CONTEXT_PARAMS = (
    "attn_mask_type", "packed_weights_id", "quant_format", "input_quant_format", "max_accuracy_drop_pct",
    "return_offsets", "capturing", "deterministic", "tp_size", "require_tp_invariant",
    "reduction_order", "kv_strategy", "free_memory_bytes", "virtual_free_bytes", "spec_algorithm", "pp_size",
    "draft_tp_size", "spec_share_kv",
)


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


def _store(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    key, _, key_cache = args[:3]
    return dict(
        tokens=key.shape[0], num_kv_heads=key.shape[1], head_dim=key.shape[2], kv_cache_layout="NHD",
        kv_cache_dtype=key_cache.dtype, kv_strategy="paged", params=(("block_size", key_cache.shape[1]),),
    )


def _rowwise(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    x = args[0]
    extra = tuple((name, kw[name]) for name in ("approximate", "interleaved") if name in kw)
    return dict(tokens=_rows(x), hidden=x.shape[-1] if x.dim() else 1, params=extra)


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
    return dict(tokens=_rows(x), hidden=x.shape[-1],
                params=(("out_features", weight.shape[0]), ("bias", bias is not None)))


def _embedding(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    ids, weight = args[:2]
    return dict(tokens=ids.numel(), hidden=weight.shape[-1], dtype=weight.dtype)


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


def _tokenizer(args: tuple[Any, ...], kw: Mapping[str, Any]) -> dict[str, Any]:
    from layerzero.reference.tokenize import tokenizer_identity

    identity = tokenizer_identity(args[1]).to_dict()
    return {"tokenizer_key": tokenizer_key(**identity), "return_offsets": bool(kw.get("return_offsets", False))}


DEFAULT_SIGNATURE = OpSignature(_generic, None, ())
SIGNATURES: dict[str, OpSignature] = {
    "attention": OpSignature(_attention, (0, 1, 2), ("causal", "sliding_window", "layout")),
    "varlen_attention": OpSignature(
        _varlen, (0, 1, 2), ("cu_seqlens_q", "max_seqlen_q", "max_seqlen_k", "causal", "sliding_window")
    ),
    "paged_attention": OpSignature(_paged, (0, 1, 2), ("block_tables", "max_context_len", "sliding_window")),
    "store_kv_cache": OpSignature(_store, (0, 1, 2, 3), ()),
    "rms_norm": OpSignature(_rowwise, (0, 1), ()),
    "fused_add_rms_norm": OpSignature(_rowwise, (0, 1, 2), ()),
    "layer_norm": OpSignature(_layer_norm, (0, 1, 2, 3), ()),
    "rope": OpSignature(_rope, (0, 1, 2), ("interleaved",)),
    "silu_and_mul": OpSignature(_rowwise, (0,), ()),
    "gelu_and_mul": OpSignature(_rowwise, (0,), ("approximate",)),
    "linear": OpSignature(_linear, (0, 1, 2), ()),
    "embedding": OpSignature(_embedding, (0, 1), ()),
    "sample_topk": OpSignature(_topk, (0, 1), ()),
    "sample_topp": OpSignature(_sampling, (0,), ()),
    "quantize": OpSignature(_quantize, (0,), ("dtype", "axis", "scale")),
    "dequantize": OpSignature(_dequantize, (0,), ("axis",)),
    # The tokenizer object itself is part of the call key (held, so its id is never reused); its full
    # identity hash is computed once per call-cache miss.
    "tokenize": OpSignature(_tokenizer, (1,), ("return_offsets",)),
    "detokenize": OpSignature(_tokenizer, (1,), ()),
}
