"""KernelSpec: what one kernel implementation needs and offers, so selection can filter it with reasons."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from layerzero.select.context import SelectionContext
    from layerzero.select.reasons import Reason

ANY_PLATFORM = frozenset({"cpu", "cuda"})


@dataclass(frozen=True, slots=True)
class LaunchConfig:
    """The CUDA launch a kernel would make for a context: grid (x, y, z) and threads per block."""

    grid: tuple[int, int, int]
    threads_per_block: int


@dataclass(frozen=True, eq=False)
class KernelSpec:
    """One implementation of one op. `None` constraints mean "no limit"; `impl` takes the canonical signature.

    `check` may read any context field; it runs on every selection-cache miss. `available` probes the
    backend once (the registry caches the answer) and returns a NOT_INSTALLED / BACKEND_IMPORT_FAILED
    reason when it cannot run.
    """

    kernel_id: str
    op: str
    backend: str
    impl: Callable[..., Any]
    version: str = ""
    platforms: frozenset[str] = ANY_PLATFORM
    min_sm: int | None = None
    max_sm: int | None = None
    dtypes: frozenset[torch.dtype] | None = None
    min_head_dim: int | None = None
    max_head_dim: int | None = None
    head_dim_multiple: int | None = None
    layouts: frozenset[str] | None = None
    supports_gqa: bool = True
    supports_sliding_window: bool = True
    requires_last_dim_contiguous: bool = False
    graph_safe: bool = False
    deterministic: bool = True
    priority: int = 50
    check: Callable[[SelectionContext], list[Reason]] | None = None
    available: Callable[[], Reason | None] | None = None
    # Fields below are optional.
    max_seq_len: int | None = None
    attn_mask_types: frozenset[str] = frozenset({"none"})
    kv_cache_layouts: frozenset[str] | None = None
    kv_cache_dtypes: frozenset[torch.dtype] | None = None
    # Required by the kernel contract: a kernel that runs only on prepacked weights (the call must name them
    # in SelectionContext.packed_weights_id). No built-in kernel needs it; plugins may.
    requires_packed_weights: bool = False
    min_cuda_version: tuple[int, int] | None = None
    launch: Callable[[SelectionContext], LaunchConfig] | None = None
    quant_formats: frozenset[str] | None = None
    kv_strategies: frozenset[str] | None = None
    is_reference: bool = False  # the always-correct fallback of its op

    def __post_init__(self) -> None:
        if not self.kernel_id or not self.op or not self.backend:
            raise ValueError("KernelSpec needs kernel_id, op and backend")
        if not callable(self.impl):
            raise TypeError(f"KernelSpec {self.kernel_id}: impl must be callable")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.impl(*args, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        """The declarative part of the spec, JSON-serializable (for explain/list_kernels/doctor)."""
        out: dict[str, Any] = {}
        for name in (
            "kernel_id", "op", "backend", "version", "min_sm", "max_sm", "min_head_dim", "max_head_dim",
            "head_dim_multiple", "supports_gqa", "supports_sliding_window", "requires_last_dim_contiguous",
            "graph_safe", "deterministic", "priority", "max_seq_len", "is_reference",
        ):
            out[name] = getattr(self, name)
        out["platforms"] = sorted(self.platforms)
        out["dtypes"] = None if self.dtypes is None else sorted(str(d).removeprefix("torch.") for d in self.dtypes)
        out["layouts"] = None if self.layouts is None else sorted(self.layouts)
        return out
