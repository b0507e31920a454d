"""CUDA-graph safety: capture detection, dummy-capture validation, strict-mode checks.

A kernel is safe to run inside a capture only when its spec declares `graph_safe=True`; unknown kernels
default to unsafe. In graph strict mode a declared-safe kernel must also have passed a dummy capture
(`verify`) for the same call shape before the real capture starts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

import torch

from layerzero.select.capture import cuda_available, is_capturing
from layerzero.select.reasons import CUDA_GRAPH_UNSAFE, Reason

if TYPE_CHECKING:
    from layerzero.select.context import SelectionContext
    from layerzero.select.kernel_spec import KernelSpec

MEMORY_WARNING_BYTES = 1 << 20  # allocation during capture above this is logged
WARMUP_ITERATIONS = 3

_log = logging.getLogger("layerzero")
_verified: dict[tuple[str, Hashable, str], Reason | None] = {}
_verified_lock = threading.Lock()


def validate_capture(
    fn: Callable[..., Any], *args: Any, warmup: int = WARMUP_ITERATIONS, **kwargs: Any
) -> Reason | None:
    """Prove that fn(*args, **kwargs) survives a CUDA graph capture and replay; the failure as a Reason.

    Warms fn up on a side stream first (lazy cuBLAS/Triton initialisation must not happen inside a
    capture), then captures it into a throwaway graph with thread-local error checking (a host sync or
    an unsupported call inside the capture raises) and replays it once.
    """
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    device = next((t.device for t in tensors if t.device.type == "cuda"), None)
    if device is None or not cuda_available():
        return Reason(CUDA_GRAPH_UNSAFE, "no CUDA tensor among the inputs: a CUDA graph capture cannot be validated")
    if is_capturing(device):
        return Reason(CUDA_GRAPH_UNSAFE, "cannot validate inside a running capture; validate before capturing")
    with torch.cuda.device(device):
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        try:
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    fn(*args, **kwargs)
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            before = torch.cuda.memory_allocated(device)
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                fn(*args, **kwargs)
            allocated = torch.cuda.memory_allocated(device) - before
            graph.replay()
            torch.cuda.synchronize(device)
        except Exception as exc:  # any failure means "not capturable", whatever raised it
            return Reason(CUDA_GRAPH_UNSAFE, f"dummy capture failed: {type(exc).__name__}: {exc}".strip())
    if allocated > MEMORY_WARNING_BYTES:
        _log.warning("%s allocated %d bytes inside a CUDA graph capture", getattr(fn, "__name__", fn), allocated)
    return None


def _key(kernel_id: str, ctx: SelectionContext) -> tuple[str, Hashable, str]:
    # verification happens outside the capture, so the capturing flag itself is not part of the shape key
    return (kernel_id, ctx.with_(capturing=False).validity_key(), ctx.perf_bucket())


def verify(spec: KernelSpec, *args: Any, **kwargs: Any) -> Reason | None:
    """Dummy-capture `spec` on this canonical call and remember the outcome for graph strict mode."""
    from layerzero.select.context import SelectionContext

    ctx = SelectionContext.from_tensors(spec.op, *args, **kwargs)
    reason = validate_capture(spec.impl, *args, **kwargs) if spec.graph_safe else _undeclared()
    with _verified_lock:
        _verified[_key(spec.kernel_id, ctx)] = reason
    return reason


def graph_safety_reason(spec: KernelSpec, ctx: SelectionContext, *, strict: bool = False) -> Reason | None:
    """Why `spec` may not run in `ctx` because of a CUDA graph capture; None when it may (or nothing is captured)."""
    if not ctx.capturing:
        return None
    if not spec.graph_safe:
        return _undeclared()
    if strict:
        key = _key(spec.kernel_id, ctx)
        if key not in _verified:
            return Reason(
                CUDA_GRAPH_UNSAFE,
                "graph strict mode: not verified by a dummy capture for this shape (layerzero.select.graphs.verify before capture)",
            )
        return _verified[key]
    return None


def clear_verified() -> None:
    """Forget every strict-mode verification, so kernels must be verified again before the next capture."""
    with _verified_lock:
        _verified.clear()


def _undeclared() -> Reason:
    return Reason(CUDA_GRAPH_UNSAFE, "not declared graph-safe (kernels are unsafe for capture unless declared safe)")
