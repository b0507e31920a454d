"""Exception hierarchy: every error layerzero raises is a LayerZeroError."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from layerzero.select.reasons import Reason


class LayerZeroError(Exception):
    """Base class of every layerzero error."""


class LayoutError(LayerZeroError, ValueError):
    """Attention layout invalid for the shapes, or ambiguous and not given."""


class NoKernelFoundError(LayerZeroError):
    """No candidate kernel can run this call; the message lists every candidate with its reasons."""

    def __init__(self, op: str, failures: Mapping[str, Sequence[Reason]], detail: str = "") -> None:
        self.op = op
        self.failures = {kid: list(reasons) for kid, reasons in failures.items()}
        self.detail = detail
        super().__init__(self._format())

    def _format(self) -> str:
        lines = [f"No kernel available for '{self.op}'" + (f" ({self.detail})" if self.detail else "")]
        if not self.failures:
            lines.append("no kernel is registered for this op")
        else:
            lines.append("Candidate failures:")
            for kernel_id, reasons in self.failures.items():
                lines.append(f"  {kernel_id}:")
                lines.extend(f"    - [{r.code}] {r.message}" for r in reasons)
        return "\n".join(lines)


class CudaGraphUnsafeError(NoKernelFoundError):
    """No graph-safe kernel for a call made while a CUDA graph is being captured."""


class KernelLockError(LayerZeroError):
    """A policy lock names a kernel that is unknown or cannot run this call."""

    def __init__(self, op: str, kernel_id: str, reasons: Sequence[Reason]) -> None:
        self.op = op
        self.kernel_id = kernel_id
        self.reasons = list(reasons)
        detail = "; ".join(str(r) for r in self.reasons)
        super().__init__(f"lock {op} -> {kernel_id} cannot be honoured: {detail}")


class KernelExecutionError(LayerZeroError):
    """Every candidate kernel raised at run time (the last error is chained)."""

