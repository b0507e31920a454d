"""Every kernel: the reference, torch, oneDNN, 4- and 8-bit CPU, our native C, optional-library and Triton backends,
and plugins.

`get_registry()` is the process registry, filled on first use from `SOURCES`; a failing backend is recorded
as a reason instead of taking the others down."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterable

from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import BACKEND_IMPORT_FAILED, Reason
from layerzero.select.registry import Registry

# backend name -> (module, function returning its specs); loaded in this order
SOURCES: tuple[tuple[str, str, str], ...] = (
    ("reference", "layerzero.kernels.reference.specs", "kernel_specs"),
    ("torch", "layerzero.kernels.torch_backend", "kernel_specs"),
    ("onednn", "layerzero.kernels.onednn", "kernel_specs"),
    ("quant_cpu", "layerzero.kernels.quant_cpu", "kernel_specs"),
    ("native", "layerzero.kernels.native.specs", "kernel_specs"),
    ("optional", "layerzero.kernels.optional", "kernel_specs"),
    ("triton", "layerzero.kernels.triton.specs", "kernel_specs"),
    ("plugins", "layerzero.extend.plugins", "load_entry_points"),
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


_REGISTRY = Registry()
_READY = False
_FILLING = False
_INIT_LOCK = threading.RLock()


def get_registry() -> Registry:
    """The process registry, filled with every built-in, optional, Triton and plugin backend on first use.

    The fill may re-enter from its own thread (a plugin registering through `get_registry()`); other
    threads wait until it is complete.
    """
    global _READY, _FILLING
    if not _READY:
        with _INIT_LOCK:
            if not _READY and not _FILLING:
                _FILLING = True
                register_all(_REGISTRY)
                _READY = True
    return _REGISTRY
