"""SelectionEngine (docs/layerzero.md, "The call path"): policy lock -> dispatch table -> filter with reasons -> cache -> score -> cache.

Scores are priority + policy adjustment + PerfDB adjustment - adaptation penalty. The selection cache key
is the op, the context's exact validity fields, its bucketed sizes, the policy key and the set of kernels
that passed the filter (with their policy adjustments), so a cached choice is never reused for a call
some constraint (a size limit, a rule on sequence length, a custom check) would decide differently.
Registry, device-capability and circuit-breaker changes clear every cache; a policy change needs no
clearing, since every key holds the policy key.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from layerzero.kernels import get_registry
from layerzero.perf import perfdb
from layerzero.perf.measure import device_signature
from layerzero.perf.perfdb import PerfDB, capabilities_hash
from layerzero.policy import state as lzpolicy
from layerzero.select import constraints
from layerzero.select.breaker import CircuitBreaker
from layerzero.select.cache import LRUCache
from layerzero.select.constraints import NO_ADAPTATION, Adaptation
from layerzero.select.context import SelectionContext
from layerzero.select.errors import CudaGraphUnsafeError, KernelLockError, NoKernelFoundError
from layerzero.select.generation import GENERATION
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CUDA_GRAPH_UNSAFE, NOT_INSTALLED, OP_UNSUPPORTED, Reason
from layerzero.select.registry import Registry

log = logging.getLogger("layerzero")

PERF_MAX_PENALTY = 30.0  # timings adjust a score by at most this much
PERF_SLOPE = 10.0  # score points per 1x slowdown against the fastest measured candidate


def _cast(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    return value


class KernelTable(Protocol):
    """A table of baked choices the engine consults before selecting (`layerzero.perf.tables.DispatchTable`)."""

    def lookup(self, ctx: SelectionContext) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Choice:
    """A selected kernel, how dispatch must adapt the call to it, and its score."""

    spec: KernelSpec
    adaptation: Adaptation = NO_ADAPTATION
    score: float = 0.0
    source: str = "selected"  # "selected" | "locked" (policy lock) | "table" (installed dispatch table)

    @property
    def locked(self) -> bool:
        return self.source == "locked"

    def run(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Run the kernel on a canonical call, applying the adaptation (transposed views, float32 upcast) around it."""
        if self.adaptation is NO_ADAPTATION:
            return self.spec.impl(*args, **kwargs)
        out_dtype = next((a.dtype for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()), None)
        if self.adaptation.layout is not None:
            args = (*(t.transpose(1, 2) for t in args[:3]), *args[3:])
            kwargs = {**kwargs, "layout": self.adaptation.layout}
        if self.adaptation.cast is not None:
            args = tuple(_cast(a, self.adaptation.cast) for a in args)
            kwargs = {k: _cast(v, self.adaptation.cast) for k, v in kwargs.items()}
        out = self.spec.impl(*args, **kwargs)
        if self.adaptation.layout is not None:
            out = out.transpose(1, 2)
        if self.adaptation.cast is not None and out_dtype is not None:
            out = tuple(_cast(o, out_dtype) for o in out) if isinstance(out, tuple) else _cast(out, out_dtype)
        return out


@dataclass
class Candidate:
    """One kernel as explain() reports it."""

    kernel_id: str
    backend: str
    valid: bool
    reasons: list[Reason]
    score: float | None = None
    breakdown: dict[str, float] = field(default_factory=dict)
    adaptation: list[str] = field(default_factory=list)
    perf: dict[str, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "kernel_id": self.kernel_id, "backend": self.backend, "valid": self.valid, "score": self.score,
            "breakdown": self.breakdown, "adaptation": self.adaptation, "perf": self.perf,
            "reasons": [r.to_dict() for r in self.reasons],
        }


@dataclass
class SelectionReport:
    """Every candidate of one call with its score or reasons, and the outcome (`selected` or `error`)."""

    op: str
    context: dict[str, Any]
    candidates: list[Candidate]
    selected: str | None
    locked: str | None
    policy_key: str
    strict_mode: bool
    error: str | None = None
    load_errors: dict[str, Reason] = field(default_factory=dict)
    source: str | None = None  # how `selected` was reached: "selected", "locked" or "table"

    def to_dict(self) -> dict[str, Any]:
        return {
            "op": self.op, "selected": self.selected, "locked": self.locked, "error": self.error,
            "policy_key": self.policy_key, "strict_mode": self.strict_mode, "source": self.source, "context": self.context,
            "candidates": [c.to_dict() for c in self.candidates],
            "load_errors": {k: v.to_dict() for k, v in self.load_errors.items()},
        }

    def __str__(self) -> str:
        lines = [f"{self.op}: selected {self.selected}" + (f" (locked {self.locked})" if self.locked else "")]
        if self.error:
            lines.append(f"  error: {self.error.splitlines()[0]}")
        for c in self.candidates:
            if c.valid:
                extra = f" [{', '.join(c.adaptation)}]" if c.adaptation else ""
                lines.append(f"  + {c.kernel_id}: score {c.score:.1f}{extra}")
            else:
                lines.append(f"  - {c.kernel_id}: " + "; ".join(str(r) for r in c.reasons))
        return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class _Evaluated:
    spec: KernelSpec
    reasons: list[Reason]
    adaptation: Adaptation
    adjust: float


def _perfdb() -> PerfDB | None:
    return perfdb.get_perfdb()


class SelectionEngine:
    """Selects kernels for contexts; one per process in normal use (`get_engine()`)."""

    def __init__(self, registry: Registry | None = None, breaker: CircuitBreaker | None = None, *,
                 cache_size: int = 4096, perfdb: Callable[[], Any] = _perfdb) -> None:
        self._registry = registry
        self.breaker = breaker or CircuitBreaker()
        self.cache: LRUCache[Choice] = LRUCache(cache_size)  # bucketed selection cache
        self.call_cache: LRUCache[Any] = LRUCache(cache_size)  # exact call signatures (dispatch fast path)
        self._perfdb = perfdb
        self._generation: int | None = None
        self._lock = threading.Lock()
        self._cap_hash: dict[str, tuple[KernelSpec, str]] = {}
        self.table: KernelTable | None = None  # installed by layerzero.perf.tables.use

    @property
    def registry(self) -> Registry:
        if self._registry is None:
            self._registry = get_registry()
        return self._registry

    def sync(self) -> None:
        """Clear the caches if GENERATION moved (registry, device capabilities, breaker state, invalidate).

        A policy change needs no clearing: every key holds the policy key (a hash of the effective policy),
        so entries made under another policy are unreachable and age out of the LRU.
        """
        self.registry  # the first use fills it, which moves GENERATION
        self.breaker.tick()
        generation = GENERATION.value
        if generation != self._generation:
            with self._lock:
                self.cache.clear()
                self.call_cache.clear()
                self._generation = generation

    def invalidate(self) -> None:
        """Drop every cached selection."""
        with self._lock:
            self.cache.clear()
            self.call_cache.clear()
            self._generation = None
        GENERATION.bump()

    # -- filter -------------------------------------------------------------------------------------------
    def _evaluate(self, spec: KernelSpec, ctx: SelectionContext, policy: Any) -> _Evaluated:
        reasons, adaptation = constraints.check(
            spec, ctx, strict=policy.strict_mode, deterministic=policy.deterministic,
            graph_strict=policy.settings.graph_strict_mode)
        for extra in (self.registry.availability(spec), self.breaker.reason(spec.backend), policy.blocked(spec, ctx)):
            if extra is not None:
                reasons.append(extra)
        return _Evaluated(spec, reasons, adaptation, 0.0 if reasons else float(policy.adjust(spec, ctx)))

    def _locked(self, ctx: SelectionContext, policy: Any) -> Choice | None:
        kernel_id = policy.locked_kernel(ctx)
        if kernel_id is None:
            return None
        spec = self.registry.get(kernel_id)
        if spec is None:
            raise KernelLockError(ctx.op, kernel_id, [Reason(NOT_INSTALLED, "no kernel with this id is registered")])
        if spec.op != ctx.op:
            raise KernelLockError(ctx.op, kernel_id, [Reason(OP_UNSUPPORTED, f"{kernel_id} implements {spec.op}")])
        ev = self._evaluate(spec, ctx, policy)
        if ev.reasons:
            raise KernelLockError(ctx.op, kernel_id, ev.reasons)
        return Choice(spec, ev.adaptation, float(spec.priority), source="locked")

    def _from_table(self, ctx: SelectionContext, policy: Any) -> Choice | None:
        kernel_id = self.table.lookup(ctx) if self.table is not None else None
        spec = self.registry.get(kernel_id) if kernel_id is not None else None
        if spec is None or spec.op != ctx.op:
            return None
        ev = self._evaluate(spec, ctx, policy)
        return None if ev.reasons else Choice(spec, ev.adaptation, float(spec.priority), source="table")

    # -- score --------------------------------------------------------------------------------------------
    def _capabilities_hash(self, spec: KernelSpec) -> str:
        cached = self._cap_hash.get(spec.kernel_id)
        if cached is None or cached[0] is not spec:
            cached = (spec, capabilities_hash(spec))
            self._cap_hash[spec.kernel_id] = cached
        return cached[1]

    def _timings(self, valid: list[_Evaluated], ctx: SelectionContext) -> dict[str, Any]:
        db = self._perfdb()
        if db is None:
            return {}
        sig, bucket, out = device_signature(ctx.device), ctx.perf_bucket(), {}
        for ev in valid:
            try:
                stats = db.lookup(ctx.op, ev.spec.kernel_id, bucket, sig, kernel_version=ev.spec.version,
                                  capabilities_hash=self._capabilities_hash(ev.spec))
            except Exception as exc:  # timings only refine selection
                log.debug("PerfDB lookup failed for %s: %r", ev.spec.kernel_id, exc)
                stats = None
            if stats is not None and stats.median_us > 0:
                out[ev.spec.kernel_id] = stats
        return out

    def _scored(self, valid: list[_Evaluated], ctx: SelectionContext,
                timings: dict[str, Any] | None = None) -> list[tuple[float, dict[str, float], _Evaluated]]:
        timings = self._timings(valid, ctx) if timings is None else timings
        fastest = min(timings.values(), key=lambda s: s.median_us) if timings else None
        scored = []
        for ev in valid:
            perf = 0.0
            stats = timings.get(ev.spec.kernel_id)
            if stats is not None and fastest is not None:
                slowdown = stats.median_us / fastest.median_us - 1.0
                perf = -min(PERF_MAX_PENALTY, PERF_SLOPE * slowdown) * min(stats.confidence, fastest.confidence)
            parts = {"priority": float(ev.spec.priority), "policy": ev.adjust, "perf": perf,
                     "transform": -ev.adaptation.penalty}
            scored.append((sum(parts.values()), parts, ev))
        scored.sort(key=lambda t: (-t[0], -t[2].spec.priority, t[2].spec.kernel_id))
        return scored

    # -- pipeline -----------------------------------------------------------------------------------------
    def _no_kernel(self, ctx: SelectionContext, evaluated: list[_Evaluated]) -> NoKernelFoundError:
        failures = {ev.spec.kernel_id: ev.reasons for ev in evaluated}
        if ctx.capturing and any(any(r.code == CUDA_GRAPH_UNSAFE for r in ev.reasons) for ev in evaluated):
            return CudaGraphUnsafeError(ctx.op, failures, "a CUDA graph is being captured")
        return NoKernelFoundError(ctx.op, failures)

    def choose(self, ctx: SelectionContext) -> Choice:
        """The kernel for ctx with its adaptation; raises NoKernelFoundError / KernelLockError."""
        self.sync()
        policy = lzpolicy.get_policy()
        pinned = self._locked(ctx, policy) or self._from_table(ctx, policy)
        if pinned is not None:
            return pinned
        evaluated = [self._evaluate(spec, ctx, policy) for spec in self.registry.kernels(ctx.op)]
        valid = [ev for ev in evaluated if not ev.reasons]
        if not valid:
            raise self._no_kernel(ctx, evaluated)
        key = (ctx.op, ctx.validity_key(), ctx.perf_bucket(), policy.key,
               tuple((ev.spec.kernel_id, ev.adaptation, ev.adjust) for ev in valid))
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        score, _, best = self._scored(valid, ctx)[0]
        choice = Choice(best.spec, best.adaptation, score)
        self.cache.put(key, choice)
        if policy.log_selections:
            log.info("layerzero %s -> %s (score %.1f) for %s", ctx.op, best.spec.kernel_id, score, ctx.perf_bucket())
        return choice

    def select(self, ctx: SelectionContext) -> KernelSpec:
        """The kernel spec chosen for ctx."""
        return self.choose(ctx).spec

    def rank(self, ctx: SelectionContext) -> list[Choice]:
        """Every valid kernel for ctx, best first (the fallback order of dispatch); ignores locks."""
        self.sync()
        policy = lzpolicy.get_policy()
        evaluated = [self._evaluate(spec, ctx, policy) for spec in self.registry.kernels(ctx.op)]
        valid = [ev for ev in evaluated if not ev.reasons]
        return [Choice(ev.spec, ev.adaptation, score) for score, _, ev in self._scored(valid, ctx)]

    def explain(self, ctx: SelectionContext) -> SelectionReport:
        """A SelectionReport for ctx: every candidate with its score or its reasons, never raising."""
        self.sync()
        policy = lzpolicy.get_policy()
        evaluated = [self._evaluate(spec, ctx, policy) for spec in self.registry.kernels(ctx.op)]
        valid = [ev for ev in evaluated if not ev.reasons]
        timings = self._timings(valid, ctx)
        scored = {ev.spec.kernel_id: (score, parts) for score, parts, ev in self._scored(valid, ctx, timings)}
        candidates = []
        for ev in evaluated:
            score, parts = scored.get(ev.spec.kernel_id, (None, {}))
            stats = timings.get(ev.spec.kernel_id)
            perf = None if stats is None else {"median_us": stats.median_us, "p10_us": stats.p10_us,
                                                "p90_us": stats.p90_us, "n": stats.n, "confidence": stats.confidence}
            candidates.append(Candidate(ev.spec.kernel_id, ev.spec.backend, not ev.reasons, ev.reasons, score, parts,
                                        ev.adaptation.describe(), perf))
        candidates.sort(key=lambda c: (not c.valid, -(c.score or 0.0), c.kernel_id))
        selected = error = source = None
        try:
            choice = self.choose(ctx)
            selected, source = choice.spec.kernel_id, choice.source
        except (NoKernelFoundError, KernelLockError) as exc:
            error = str(exc)
        return SelectionReport(ctx.op, ctx.to_dict(), candidates, selected, policy.locked_kernel(ctx), policy.key,
                               policy.strict_mode, error, dict(self.registry.load_errors), source)


_ENGINE: SelectionEngine | None = None
_ENGINE_LOCK = threading.Lock()


def get_engine() -> SelectionEngine:
    """The process selection engine (registry from get_registry(), its own circuit breaker, caches bounded
    by the policy's `cache.max_size`)."""
    global _ENGINE
    if _ENGINE is None:
        with _ENGINE_LOCK:
            if _ENGINE is None:
                _ENGINE = SelectionEngine(cache_size=lzpolicy.get_policy().settings.cache_max_size)
    return _ENGINE
