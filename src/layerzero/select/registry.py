"""Kernel registry: every KernelSpec by op, and cached availability probes; each change moves GENERATION.

The process registry, filled from every backend, is `layerzero.kernels.get_registry()`."""

from __future__ import annotations

import threading

from layerzero.select.generation import GENERATION
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import BACKEND_IMPORT_FAILED, Reason


class Registry:
    """Thread-safe store of kernel specs; GENERATION moves whenever the set of kernels changes."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._by_id: dict[str, KernelSpec] = {}
        self._by_op: dict[str, tuple[KernelSpec, ...]] = {}
        self._available: dict[str, Reason | None] = {}
        self.load_errors: dict[str, Reason] = {}  # backend name -> why its specs could not be loaded

    def register(self, spec: KernelSpec, replace: bool = False) -> None:
        """Add a kernel; an existing kernel_id raises ValueError unless `replace`."""
        with self._lock:
            old = self._by_id.get(spec.kernel_id)
            if old is not None and not replace:
                raise ValueError(f"kernel {spec.kernel_id!r} is already registered")
            if old is not None:
                self._drop(old)
            self._by_id[spec.kernel_id] = spec
            self._by_op[spec.op] = (*self._by_op.get(spec.op, ()), spec)
            GENERATION.bump()

    def unregister(self, kernel_id: str) -> None:
        """Remove a kernel; unknown ids raise KeyError."""
        with self._lock:
            self._drop(self._by_id.pop(kernel_id))
            GENERATION.bump()

    def _drop(self, spec: KernelSpec) -> None:
        rest = tuple(s for s in self._by_op[spec.op] if s is not spec)
        if rest:
            self._by_op[spec.op] = rest
        else:
            del self._by_op[spec.op]
        self._available.pop(spec.kernel_id, None)

    def kernels(self, op: str) -> tuple[KernelSpec, ...]:
        """Every kernel of `op`, in registration order."""
        return self._by_op.get(op, ())

    def get(self, kernel_id: str) -> KernelSpec | None:
        return self._by_id.get(kernel_id)

    def ops(self) -> list[str]:
        return sorted(self._by_op)

    def all(self) -> list[KernelSpec]:
        return list(self._by_id.values())

    def reference(self, op: str) -> KernelSpec | None:
        """The op's reference kernel (the last-resort fallback), if registered."""
        return next((s for s in self.kernels(op) if s.is_reference), None)

    def availability(self, spec: KernelSpec) -> Reason | None:
        """The spec's `available()` probe, run once; a probe that raises becomes BACKEND_IMPORT_FAILED."""
        if spec.available is None:
            return None
        if spec.kernel_id not in self._available:
            try:
                result = spec.available()
            except Exception as exc:  # a probe must never crash selection
                result = Reason(BACKEND_IMPORT_FAILED, f"{spec.backend} availability probe raised {exc!r}")
            with self._lock:
                self._available[spec.kernel_id] = result
        return self._available[spec.kernel_id]

    def record_load_error(self, backend: str, reason: Reason) -> None:
        """Note a backend whose specs could not be loaded at all (shown by explain and doctor)."""
        with self._lock:
            self.load_errors[backend] = reason
            GENERATION.bump()
