"""Backend loader: collects the KernelSpecs of every backend into a registry; a failing backend is a reason."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

from layerzero.kernel_spec import KernelSpec
from layerzero.reasons import BACKEND_IMPORT_FAILED, Reason
from layerzero.registry import Registry

# backend name -> (module, function returning its specs); loaded in this order
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("reference", "layerzero.backends.reference", "kernel_specs"),
    ("torch", "layerzero.backends.torch_backend", "kernel_specs"),
    ("onednn", "layerzero.backends.onednn", "kernel_specs"),
    ("int4_cpu", "layerzero.backends.int4_cpu", "kernel_specs"),
    ("optional", "layerzero.backends.optional", "kernel_specs"),
    ("triton", "layerzero.backends.triton.specs", "kernel_specs"),
    ("plugins", "layerzero.plugins", "load_entry_points"),
)


def _load(module: str, function: str) -> Callable[[], Iterable[KernelSpec] | None]:
    return getattr(importlib.import_module(module), function)


def register_all(registry: Registry) -> None:
    """Register every source's specs; an import or load failure is recorded as BACKEND_IMPORT_FAILED."""
    for name, module, function in SOURCES:
        try:
            specs = _load(module, function)() or ()
            for spec in specs:
                registry.register(spec, replace=True)
        except Exception as exc:  # one broken backend must not take the others down
            registry.record_load_error(name, Reason(BACKEND_IMPORT_FAILED, f"{module}.{function}: {exc!r}"))
