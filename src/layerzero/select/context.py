"""SelectionContext: everything about one call that decides which kernels may run it and how fast.

Built from the canonical call of an op (the arguments kernels receive). Device facts are read per tensor
device (sm from `torch.cuda.get_device_capability(device)`, cached per device), never process-wide.
`validity_key()` holds the fields that decide validity exactly; `perf_bucket()` buckets the sizes that only
change speed.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from layerzero.select.capture import is_capturing
from layerzero.select.generation import GENERATION
from layerzero.select.signatures import DEFAULT_SIGNATURE, SIGNATURES

SEQ_BUCKETS = (1, 16, 128, 512, 2048, 8192, 32768)
BATCH_BUCKETS = (1, 4, 16, 64, 256)
PERF_FIELDS = frozenset({"batch", "seq_q", "seq_k", "tokens"})

# SM ranges [lo, hi) of each GPU generation, for policy rules that match on `generation`
_GENERATIONS = ((75, 80, "turing"), (80, 89, "ampere"), (89, 90, "ada"), (90, 100, "hopper"), (100, 200, "blackwell"))


def gpu_generation(sm: int | None) -> str | None:
    """GPU generation name of an SM version (policy rules match on it); None off CUDA or before Turing."""
    if sm is not None:
        for lo, hi, name in _GENERATIONS:
            if lo <= sm < hi:
                return name
    return None


class _DeviceFacts:
    """Per-device capability cache; `refresh()` re-reads it and moves GENERATION (the caches clear)."""

    def __init__(self) -> None:
        self._sm: dict[int, int] = {}
        self._lock = threading.Lock()

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
            GENERATION.bump()


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
    # Required by the kernel contract, set only by a caller's keyword (no op argument carries a mask type).
    attn_mask_type: str = "none"
    kv_cache_layout: str | None = None
    kv_cache_dtype: torch.dtype | None = None
    # Required by the kernel contract: which prepacked weights the call brings, for kernels with
    # requires_packed_weights. Set only by a caller's keyword; no built-in op prepacks.
    packed_weights_id: str | None = None
    quant_format: str | None = None
    tokenizer_key: str | None = None
    return_offsets: bool = False
    capturing: bool = False
    deterministic: bool = False
    kv_strategy: str | None = None
    params: tuple[tuple[str, Any], ...] = field(default=())

    @property
    def generation(self) -> str | None:
        return gpu_generation(self.sm)

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
        for name in CONTEXT_PARAMS:
            if params.get(name) is not None:
                values[name] = params[name]
        return cls(op=op, **values)


def _bucket(value: int, bounds: tuple[int, ...]) -> str:
    for bound in bounds:
        if value <= bound:
            return str(bound)
    return "inf"


_VALIDITY_FIELDS = tuple(f.name for f in fields(SelectionContext) if f.name not in PERF_FIELDS)
# Call facts no op argument carries (mask type, prepacked weights, quantization, tokenizer options, capture
# and determinism overrides); from_tensors takes them as keywords. An op whose canonical signature has one
# must list it in its signatures.OpSignature.kwargs.
CONTEXT_PARAMS = (
    "attn_mask_type", "packed_weights_id", "quant_format", "return_offsets", "capturing", "deterministic",
    "kv_strategy",
)
