"""User kernels and third-party backends: the `register_kernel` decorator and the
`layerzero.backends` entry-point group (docs/layerzero.md, "Policy, inspection and plugins").

An entry point names a callable (or a module whose import registers kernels with `register_kernel`);
the callable may register kernels itself and/or return KernelSpecs. A plugin that raises at import,
when called, returns something other than KernelSpecs, or reuses a registered kernel id is rolled back
and recorded as BACKEND_IMPORT_FAILED (in `plugin_statuses()` and the registry's load errors), never raised.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from importlib.metadata import EntryPoint, entry_points
from typing import Any, TypeVar

from layerzero.kernels import get_registry
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import BACKEND_IMPORT_FAILED, Reason
from layerzero.select.registry import Registry

GROUP = "layerzero.backends"
F = TypeVar("F", bound=Callable[..., Any])

# The seed spec's names for KernelSpec fields, accepted as aliases.
ALIASES = {
    "operation": "op",
    "source": "backend",
    "supported_dtypes": "dtypes",
    "requires_layouts": "layouts",
    "is_cuda_graph_safe": "graph_safe",
    "requires_last_dim_stride1": "requires_last_dim_contiguous",
}
_SPEC_FIELDS = {f.name: f for f in fields(KernelSpec)}
_SET_FIELDS = frozenset(name for name, f in _SPEC_FIELDS.items() if "frozenset" in str(f.type))
_NOT_SETTABLE = frozenset({"kernel_id", "op", "backend", "impl"})


def kernel_spec_from(
    fn: Callable[..., Any], op: str, kernel_id: str, backend: str | None, **options: Any
) -> KernelSpec:
    """Build a KernelSpec for `fn` from register_kernel's keywords (aliases and list values accepted)."""
    resolved: dict[str, Any] = {}
    for name, value in options.items():
        target = ALIASES.get(name, name)
        if target == "platform":
            target, value = "platforms", [value] if isinstance(value, str) else value
        if target not in _SPEC_FIELDS or target in _NOT_SETTABLE:
            raise TypeError(f"register_kernel({kernel_id!r}): unknown option {name!r}")
        if target in _SET_FIELDS and value is not None:
            value = frozenset(value)
        resolved[target] = value
    return KernelSpec(kernel_id=kernel_id, op=op, backend=backend or kernel_id.split(".")[0], impl=fn, **resolved)


def register_kernel(
    op: str | None = None,
    kernel_id: str | None = None,
    *,
    operation: str | None = None,
    backend: str | None = None,
    replace: bool = False,
    **options: Any,
) -> Callable[[F], F]:
    """Decorator: register the function as a kernel of `op` (it must take the op's canonical signature).

    Options are KernelSpec fields (platforms, min_sm, dtypes, max_head_dim, priority, graph_safe, ...)
    or the spec's names for them (platform="cuda", supported_dtypes=[...]); the backend defaults to the
    kernel id's first dotted part. The function is returned unchanged.
    """
    op = op or operation
    if not op or not kernel_id:
        raise TypeError("register_kernel needs op= (or operation=) and kernel_id=")

    def decorate(fn: F) -> F:
        get_registry().register(kernel_spec_from(fn, op, kernel_id, backend, **options), replace=replace)
        return fn

    return decorate


@dataclass(frozen=True)
class PluginStatus:
    """One entry point's load result: the kernels it registered, or why it was rejected."""

    name: str
    value: str
    distribution: str | None
    kernel_ids: tuple[str, ...] = ()
    reason: Reason | None = None

    @property
    def ok(self) -> bool:
        return self.reason is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "value": self.value, "distribution": self.distribution, "ok": self.ok,
            "kernel_ids": list(self.kernel_ids), "reason": None if self.reason is None else self.reason.to_dict(),
        }


_lock = threading.RLock()
_statuses: dict[tuple[str, str], PluginStatus] = {}


def _returned_specs(result: Any) -> list[KernelSpec]:
    if result is None:
        return []
    if not isinstance(result, Iterable):
        raise TypeError(f"expected None or an iterable of KernelSpec, got {type(result).__name__}")
    specs = list(result)
    bad = [type(s).__name__ for s in specs if not isinstance(s, KernelSpec)]
    if bad:
        raise TypeError(f"expected KernelSpec items, got {', '.join(sorted(set(bad)))}")
    return specs


def _load_one(ep: EntryPoint, registry: Registry) -> tuple[PluginStatus, list[KernelSpec]]:
    distribution = ep.dist.name if ep.dist is not None else None
    before = {s.kernel_id for s in registry.all()}
    try:
        target = ep.load()
        specs = _returned_specs(target() if callable(target) else None)
        for spec in specs:
            if spec.kernel_id in before:
                raise ValueError(f"kernel id {spec.kernel_id!r} is already registered by another backend")
            registry.register(spec)
    except Exception as exc:  # a broken plugin is a reason, never a crash
        for kernel_id in {s.kernel_id for s in registry.all()} - before:
            registry.unregister(kernel_id)
        reason = Reason(BACKEND_IMPORT_FAILED, f"plugin {ep.name} ({ep.value}): {type(exc).__name__}: {exc}")
        registry.record_load_error(f"plugin:{ep.name}", reason)
        return PluginStatus(ep.name, ep.value, distribution, reason=reason), []
    added = tuple(sorted({s.kernel_id for s in registry.all()} - before))
    return PluginStatus(ep.name, ep.value, distribution, added), specs


def load_entry_points() -> list[KernelSpec]:
    """Load every not-yet-loaded `layerzero.backends` entry point; returns the specs plugins returned."""
    registry = get_registry()
    loaded: list[KernelSpec] = []
    with _lock:
        for ep in entry_points(group=GROUP):
            key = (ep.name, ep.value)
            if key in _statuses:
                continue
            status, specs = _load_one(ep, registry)
            _statuses[key] = status
            loaded.extend(specs)
    return loaded


def plugin_statuses() -> list[PluginStatus]:
    """Every entry point seen so far, with the kernels it added or its BACKEND_IMPORT_FAILED reason."""
    with _lock:
        return sorted(_statuses.values(), key=lambda s: (s.name, s.value))
