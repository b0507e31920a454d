"""Inspection: which, explain, list_kernels, validate (readiness_check lives in layerzero.tools.readiness).

`which`, `explain` and `validate` take an op's canonical call, the arguments `dispatch(op, ...)` receives
(for most ops the public positional arguments work as they are: `explain("attention", q, k, v)`), or a
ready SelectionContext in place of the arguments (`explain("attention", ctx)`), which lets one ask about
another device than the one at hand.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from layerzero.kernels import get_registry
from layerzero.policy.state import get_policy
from layerzero.select import constraints
from layerzero.select.context import SelectionContext
from layerzero.select.engine import Choice, SelectionReport, get_engine
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CONSTRAINT_FAILED, NOT_INSTALLED, OP_UNSUPPORTED, Reason
from layerzero.select.signatures import canonical_op
from layerzero.tools.readiness import readiness_check

__all__ = ["describe", "explain", "list_kernels", "readiness_check", "validate", "which", "ValidationResult"]

# Tolerances (rtol, atol) vs the PyTorch reference, by output dtype.
TOLERANCES: dict[torch.dtype, tuple[float, float]] = {
    torch.float16: (1e-3, 1e-3),
    torch.bfloat16: (1e-2, 1e-2),
    torch.float32: (1e-5, 1e-5),
    torch.float64: (1e-7, 1e-7),
}


def _context(op: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> SelectionContext:
    op = canonical_op(op)
    if len(args) == 1 and not kwargs and isinstance(args[0], SelectionContext):
        ctx = args[0]
        if ctx.op != op:
            raise ValueError(f"context is for op {ctx.op!r}, not {op!r}")
        return ctx
    return SelectionContext.from_tensors(op, *args, **kwargs)


def which(op: str, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """The kernel dispatch would choose for this call: {"kernel_id", "score"} (raises NoKernelFoundError)."""
    choice = get_engine().choose(_context(op, args, kwargs))
    return {"kernel_id": choice.spec.kernel_id, "score": choice.score}


def explain(op: str, *args: Any, **kwargs: Any) -> SelectionReport:
    """Every candidate for this call with its score or its rejection reasons, and the choice (never raises)."""
    return get_engine().explain(_context(op, args, kwargs))


def describe(spec: KernelSpec) -> dict[str, Any]:
    """A kernel's declarative spec plus its availability (None, or the reason it cannot run here)."""
    reason = get_registry().availability(spec)
    unavailable = None if reason is None else reason.to_dict()
    return {**spec.to_dict(), "available": reason is None, "unavailable_reason": unavailable}


def list_kernels(op: str | None = None) -> list[dict[str, Any]]:
    """Registered kernels (of `op`, or all), best priority first within each op, with their availability."""
    registry = get_registry()
    ops = [canonical_op(op)] if op is not None else registry.ops()
    ranked = (sorted(registry.kernels(name), key=lambda s: (-s.priority, s.kernel_id)) for name in ops)
    return [describe(spec) for specs in ranked for spec in specs]


@dataclass
class ValidationResult:
    """Outcome of `validate`: unpacks as (valid, reasons) like the spec; errors are vs the op's reference."""

    kernel_id: str
    valid: bool
    reasons: list[Reason]
    reference_id: str | None = None
    max_abs_error: float | None = None
    worst_ratio: float | None = None  # max |out - ref| / (atol + rtol |ref|); <= 1 is within tolerance
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)

    def __iter__(self):
        return iter((self.valid, self.reasons))

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel_id, "valid": self.valid, "reasons": [r.to_dict() for r in self.reasons],
            "reference_id": self.reference_id, "max_abs_error": self.max_abs_error, "worst_ratio": self.worst_ratio,
            "tolerances": {k: list(v) for k, v in self.tolerances.items()},
        }


def _clone(value: Any) -> Any:
    """Independent copy of a call argument, so in-place kernels and generators see the same inputs twice."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, torch.Generator):
        copy = torch.Generator(device=value.device)
        copy.set_state(value.get_state())
        return copy
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    return value


def _flatten(value: Any) -> list[Any]:
    if isinstance(value, (list, tuple)):
        return [leaf for item in value for leaf in _flatten(item)]
    if isinstance(value, dict):
        return [leaf for key in sorted(value) for leaf in _flatten(value[key])]
    return [value]


@dataclass
class _Comparison:
    max_abs: float = 0.0
    worst: float = 0.0
    tolerances: dict[str, tuple[float, float]] = field(default_factory=dict)
    mismatches: list[str] = field(default_factory=list)

    def tensor(self, index: int, got: torch.Tensor, want: torch.Tensor) -> None:
        if got.shape != want.shape or got.dtype != want.dtype:
            self.mismatches.append(f"output {index}: {got.dtype}{tuple(got.shape)} vs reference "
                                   f"{want.dtype}{tuple(want.shape)}")
            return
        if not want.is_floating_point() or want.dtype not in TOLERANCES:
            # integers, bools, fp8: exact
            if not torch.equal(got.float() if got.is_floating_point() else got,
                               want.float() if want.is_floating_point() else want):
                self.mismatches.append(f"output {index}: {want.dtype} values differ from the reference")
            return
        rtol, atol = TOLERANCES[want.dtype]
        self.tolerances[str(want.dtype).removeprefix("torch.")] = (rtol, atol)
        g, w = got.double(), want.double()
        nan = g.isnan() | w.isnan()
        if not torch.equal(g.isnan(), w.isnan()):
            self.mismatches.append(f"output {index}: NaN positions differ from the reference")
        diff = torch.where(g == w, 0.0, (g - w).abs()).masked_fill(nan, 0.0)  # equal infinities agree
        if diff.numel():
            self.max_abs = max(self.max_abs, float(diff.max()))
            self.worst = max(self.worst, float((diff / (atol + rtol * w.abs().masked_fill(nan, 0.0))).max()))

    def leaf(self, index: int, got: Any, want: Any) -> None:
        if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
            self.tensor(index, got, want)
        elif got != want:
            self.mismatches.append(f"output {index}: {got!r} differs from the reference {want!r}")


def _outputs(fn: Callable[[tuple[Any, ...], dict[str, Any]], Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> list[Any]:
    args, kwargs = _clone(args), {k: _clone(v) for k, v in kwargs.items()}
    out = fn(args, kwargs)
    # An in-place op (store_kv_cache) answers through its tensor arguments.
    return _flatten(out) if out is not None else [a for a in _flatten([args, kwargs]) if isinstance(a, torch.Tensor)]


def validate(kernel_id: str, *args: Any, **kwargs: Any) -> ValidationResult:
    """Check kernel_id's constraints for this canonical call, run it and its op's reference, compare within the tolerances above."""
    registry = get_registry()
    spec = registry.get(kernel_id)
    if spec is None:
        return ValidationResult(kernel_id, False, [Reason(NOT_INSTALLED, f"no kernel {kernel_id!r} is registered")])
    policy = get_policy()
    ctx = SelectionContext.from_tensors(spec.op, *args, **kwargs)
    reasons, adaptation = constraints.check(spec, ctx, strict=policy.strict_mode, deterministic=policy.deterministic)
    available = registry.availability(spec)
    reasons += [available] if available is not None else []
    reference = registry.reference(spec.op)
    result = ValidationResult(kernel_id, False, reasons, None if reference is None else reference.kernel_id)
    if reference is None:
        result.reasons.append(Reason(OP_UNSUPPORTED, f"op {spec.op} has no reference kernel to validate against"))
    if result.reasons:
        return result
    try:
        got = _outputs(lambda a, k: Choice(spec, adaptation).run(a, k), args, kwargs)
    except Exception as exc:  # the kernel failing is the answer, not an error of validate
        result.reasons.append(Reason(CONSTRAINT_FAILED, f"{kernel_id} raised {type(exc).__name__}: {exc}"))
        return result
    want = _outputs(lambda a, k: reference.impl(*a, **k), args, kwargs)
    comparison = _Comparison()
    if len(got) != len(want):
        comparison.mismatches.append(f"{len(got)} outputs vs {len(want)} from the reference")
    for i, (g, w) in enumerate(zip(got, want)):
        comparison.leaf(i, g, w)
    if comparison.worst > 1.0:
        comparison.mismatches.append(
            f"max abs error {comparison.max_abs:.3g} exceeds the tolerance "
            f"(worst error/allowed = {comparison.worst:.3g})"
        )
    result.reasons += [Reason(CONSTRAINT_FAILED, m) for m in comparison.mismatches]
    result.valid = not result.reasons
    result.max_abs_error = comparison.max_abs
    result.worst_ratio = comparison.worst if math.isfinite(comparison.worst) else None
    result.tolerances = comparison.tolerances
    return result
