"""Production readiness check: policy, backends, fallbacks, capabilities descriptors,
plugins, selection cache, PerfDB, circuit breakers, dispatch table and memory headroom, each pass/warn/fail."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from layerzero.extend import capabilities

from layerzero.extend import plugins
from layerzero.kernels import get_registry
from layerzero.perf.measure import device_signature
from layerzero.perf.perfdb import get_perfdb
from layerzero.policy.state import get_policy
from layerzero.select.engine import get_engine

PASS, WARN, FAIL = "pass", "warn", "fail"


@dataclass(frozen=True)
class Check:
    """One readiness item: its status and what was found."""

    name: str
    status: str
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass(frozen=True)
class ReadinessReport:
    """Every check; `ok` when none failed (warnings are things to look at, not blockers)."""

    checks: tuple[Check, ...]

    @property
    def ok(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks]}

    def __str__(self) -> str:
        lines = [f"readiness: {'OK' if self.ok else 'NOT READY'}"]
        lines += [f"  [{c.status}] {c.name}: {c.detail}" for c in self.checks]
        return "\n".join(lines)


def _policy() -> Check:
    policy = get_policy()
    registry = get_registry()
    problems = []
    for op, kernel_id in sorted(policy.settings.locks.items()):
        spec = registry.get(kernel_id)
        if spec is None:
            problems.append(f"lock {op} -> {kernel_id}: no such kernel")
        elif spec.op != op:
            problems.append(f"lock {op} -> {kernel_id}: that kernel implements {spec.op}")
    if problems:
        return Check("policy", FAIL, "; ".join(problems))
    if policy.unknown_env:
        return Check("policy", WARN, f"unrecognised variables: {', '.join(policy.unknown_env)}")
    return Check("policy", PASS, f"key {policy.key}, {len(policy.settings.locks)} lock(s), "
                                 f"{len(policy.settings.rules)} rule(s)")


def _backends() -> Check:
    registry = get_registry()
    errors = {k: v for k, v in registry.load_errors.items() if not k.startswith("plugin:")}
    backends = sorted({s.backend for s in registry.all()})
    if errors:
        return Check("backends", WARN, "; ".join(f"{name}: {reason}" for name, reason in sorted(errors.items())))
    return Check("backends", PASS, f"{len(registry.all())} kernels from {len(backends)} backends")


def _fallbacks() -> Check:
    registry = get_registry()
    missing = []
    for op in registry.ops():
        reference = registry.reference(op)
        reason = None if reference is None else registry.availability(reference)
        if reference is None or reason is not None:
            missing.append(op if reference is None else f"{op} ({reason})")
    if missing:
        return Check("fallbacks", FAIL, f"no runnable reference kernel for: {', '.join(missing)}")
    return Check("fallbacks", PASS, f"every op of {len(registry.ops())} has its reference kernel")


def _capabilities() -> Check:
    statuses = capabilities.statuses()
    bad = [f"{s.backend}: {s.error}" for s in statuses if not s.ok]
    if bad:
        return Check("capabilities", FAIL, "; ".join(bad))
    unlisted = [f"{s.backend}: {', '.join(s.unlisted_kernels)}" for s in statuses if s.unlisted_kernels]
    if unlisted:
        return Check("capabilities", WARN, f"kernels disabled as undeclared by their descriptor: {'; '.join(unlisted)}")
    if not statuses:
        return Check("capabilities", PASS, "no descriptors applied (constraints are declared in code)")
    return Check("capabilities", PASS, f"schema v1 valid for {', '.join(s.backend for s in statuses)}; "
                                       f"hash {capabilities.capabilities_hash()[:12]}")


def _plugins() -> Check:
    statuses = plugins.plugin_statuses()
    failed = [f"{s.name}: {s.reason}" for s in statuses if not s.ok]
    if failed:
        return Check("plugins", FAIL, "; ".join(failed))
    return Check("plugins", PASS, f"{len(statuses)} plugin(s) loaded" if statuses else "no plugins installed")


def _cache() -> Check:
    stats = get_engine().cache.stats()
    if stats["size"] > stats["maxsize"]:
        return Check("selection_cache", FAIL, f"size {stats['size']} above its bound {stats['maxsize']}")
    lookups = stats["hits"] + stats["misses"]
    rate = f", hit rate {stats['hits'] / lookups:.0%}" if lookups else ""
    return Check("selection_cache", PASS, f"{stats['size']}/{stats['maxsize']} entries{rate}")


def _perfdb() -> Check:
    db = get_perfdb()
    if db is None:
        return Check("perfdb", WARN, "disabled or cannot be opened: selection uses static priorities only")
    return Check("perfdb", PASS, f"{db.path} (WAL), {db.count()} rows")


def _breakers() -> Check:
    open_ = [f"{name}: {state['last_error']}" for name, state in get_engine().breaker.snapshot().items()
             if state["open"]]
    if open_:
        return Check("circuit_breakers", WARN, f"open: {'; '.join(open_)}")
    return Check("circuit_breakers", PASS, "all closed")


def _dispatch_table() -> Check:
    table = get_engine().table
    if table is None:
        return Check("dispatch_table", WARN,
                     "none installed (lz.solve + dispatch_table.use): every call selects at run time")
    registry = get_registry()
    problems = []
    for (op, _, bucket), kernel_id in sorted(table.plans.items()):
        spec = registry.get(kernel_id)
        reason = None if spec is None else registry.availability(spec)
        if spec is None or reason is not None:
            problems.append(f"{op} [{bucket}] -> {kernel_id}: {'not registered' if spec is None else reason}")
    devices = ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    signatures = {device_signature(torch.device(d)) for d in devices}
    if table.hardware_signature not in signatures:
        here = ", ".join(sorted(signatures))
        problems.append(f"solved on {table.hardware_signature!r}, not on this machine ({here})")
    if problems:
        return Check("dispatch_table", FAIL, "; ".join(problems))
    return Check("dispatch_table", PASS, f"{len(table.plans)} plan(s) for {table.hardware_signature}")


def _memory() -> Check:
    headroom = get_policy().settings.memory_headroom_mb
    if not torch.cuda.is_available():
        return Check("memory_headroom", PASS, f"{headroom} MB configured; no CUDA device")
    short = []
    for index in range(torch.cuda.device_count()):
        free, _ = torch.cuda.mem_get_info(index)
        if free < headroom * 2**20:
            short.append(f"cuda:{index} has {free // 2**20} MB free")
    if short:
        return Check("memory_headroom", WARN, f"below the {headroom} MB headroom: {'; '.join(short)}")
    return Check("memory_headroom", PASS, f"{headroom} MB free on every CUDA device")


CHECKS: tuple[tuple[str, Callable[[], Check]], ...] = (
    ("policy", _policy), ("backends", _backends), ("fallbacks", _fallbacks), ("capabilities", _capabilities),
    ("plugins", _plugins), ("selection_cache", _cache), ("perfdb", _perfdb), ("circuit_breakers", _breakers),
    ("dispatch_table", _dispatch_table), ("memory_headroom", _memory),
)


def readiness_check() -> ReadinessReport:
    """Run every check; a check that raises is itself a failure (with the error), never an exception."""
    results = []
    for name, check in CHECKS:
        try:
            results.append(check())
        except Exception as exc:  # e.g. an invalid layerzero.yaml: report it, do not crash the check
            results.append(Check(name, FAIL, f"{type(exc).__name__}: {exc}"))
    return ReadinessReport(tuple(results))
