"""Selection policy: locks, preferences, avoid lists, conditional rules, global switches.

Sources, lowest to highest precedence: defaults < layerzero.yaml (LAYERZERO_CONFIG or `load(path)`) <
LAYERZERO_* environment variables < `configure(...)` / `lock(...)` / `unlock(...)` < the context managers
`prefer(*backends)` and `disabled()`, which are contextvars and so hold per thread / asyncio task.
The file and the variables (layerzero.policy.sources) are read on first use and again by `reset()`.
Every global change bumps `version()`; `Policy.key` hashes the effective policy including the context
managers, so a selection cache keyed on it never mixes two policies.

Scoring (`Policy.adjust`): +20 for a kernel whose backend or kernel id matches `prefer_sources` or a
matching rule's `prefer` (fnmatch patterns), -50 for `avoid_sources` / a rule's `avoid`,
+1000 inside `with prefer(...)`, which therefore wins whenever the preferred kernel is valid.
`disabled()` / LAYERZERO_DISABLED / `enabled: false` block every non-reference kernel (POLICY_BLOCKED)
and suspend locks.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from layerzero.policy.rules import PolicyError, Rule
from layerzero.policy.settings import Settings, parse_settings
from layerzero.policy.sources import ENV_CONFIG, ENV_LOCK_PREFIX, Layer, env_label, read_env, read_file
from layerzero.select.reasons import POLICY_BLOCKED, Reason
from layerzero.select.signatures import canonical_op

if TYPE_CHECKING:
    from layerzero.select.context import SelectionContext
    from layerzero.select.kernel_spec import KernelSpec

PREFER_BONUS = 20.0  # docs/layerzero.md, "Scoring and adaptation"
AVOID_PENALTY = -50.0  # docs/layerzero.md, "Scoring and adaptation"
# `with prefer(...)` is a temporary override: it must beat any priority (0-100) and PerfDB adjustment.
CONTEXT_PREFER_BONUS = 1000.0


def _matches(patterns: tuple[str, ...], spec: KernelSpec) -> bool:
    return any(fnmatchcase(spec.backend, p) or fnmatchcase(spec.kernel_id, p) for p in patterns)


@dataclass(frozen=True)
class Policy:
    """The effective policy for the calling context: immutable, cheap to query on every selection."""

    settings: Settings
    sources: Mapping[str, str]  # setting (or "locks.<op>") -> where its value came from
    context_prefer: tuple[str, ...] = ()
    context_disabled: bool = False
    unknown_env: tuple[str, ...] = ()
    key: str = field(init=False)

    def __post_init__(self) -> None:
        payload = json.dumps(
            [self.settings.to_dict(), list(self.context_prefer), self.context_disabled], sort_keys=True
        )
        object.__setattr__(self, "key", hashlib.sha256(payload.encode()).hexdigest()[:16])

    @property
    def enabled(self) -> bool:
        """False under LAYERZERO_DISABLED, `enabled: false` or `with disabled()`: reference kernels only."""
        return self.settings.enabled and not self.context_disabled

    @property
    def strict_mode(self) -> bool:
        """No implicit layout/dtype adaptation: `strict_mode: true` or `allow_adaptation: false`."""
        return self.settings.strict_mode or not self.settings.allow_adaptation

    @property
    def deterministic(self) -> bool:
        return self.settings.deterministic

    @property
    def fallback_enabled(self) -> bool:
        return self.settings.fallback_enabled

    @property
    def log_selections(self) -> bool:
        return self.settings.log_selections

    def locked_kernel(self, ctx: SelectionContext) -> str | None:
        """The kernel id locked for ctx's op, if any; locks do not apply while the policy is disabled."""
        if not self.enabled:
            return None
        return self.settings.locks.get(ctx.op)

    def _rules(self, ctx: SelectionContext) -> Iterator[Rule]:
        return (rule for rule in self.settings.rules if rule.matches(ctx))

    def adjust(self, spec: KernelSpec, ctx: SelectionContext) -> float:
        """Score delta for spec in ctx: context preference, then prefer/avoid lists and matching rules."""
        delta = 0.0
        if self.context_prefer and _matches(self.context_prefer, spec):
            delta += CONTEXT_PREFER_BONUS
        rules = list(self._rules(ctx))
        prefer = self.settings.prefer_sources + tuple(p for r in rules for p in r.prefer)
        avoid = self.settings.avoid_sources + tuple(p for r in rules for p in r.avoid)
        if prefer and _matches(prefer, spec):
            delta += PREFER_BONUS
        if avoid and _matches(avoid, spec):
            delta += AVOID_PENALTY
        return delta

    def blocked(self, spec: KernelSpec, ctx: SelectionContext) -> Reason | None:
        """POLICY_BLOCKED for every non-reference kernel while the policy is disabled, else None."""
        if self.enabled or spec.is_reference:
            return None
        source = "lz.disabled()" if self.context_disabled else self.sources.get("enabled", "policy")
        return Reason(POLICY_BLOCKED, f"layerzero is disabled ({source}): reference kernels only")

    def to_dict(self) -> dict[str, Any]:
        """JSON-serializable view: settings, where each came from, context overrides and the key."""
        return {
            "key": self.key,
            "settings": self.settings.to_dict(),
            "sources": dict(self.sources),
            "context_prefer": list(self.context_prefer),
            "context_disabled": self.context_disabled,
            "unknown_env": list(self.unknown_env),
        }


_PREFER: ContextVar[tuple[str, ...]] = ContextVar("layerzero_prefer", default=())
_DISABLED: ContextVar[bool] = ContextVar("layerzero_disabled", default=False)

_lock = threading.RLock()
_file = Layer("default")
_env = Layer("env")
_unknown_env: tuple[str, ...] = ()
_programmatic = Layer("configure")
_version = 0
_base: Policy | None = None
_derived: dict[tuple[int, tuple[str, ...], bool], Policy] = {}
_DERIVED_MAX = 256


def _build() -> Policy:
    """Merge the global layers (lowest first) into the base Policy; caller holds _lock."""
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    locks: dict[str, str | None] = {}
    for layer in (_file, _env, _programmatic):
        for name, value in layer.values.items():
            values[name] = value
            sources[name] = env_label(name) if layer is _env else layer.label
        for op, kernel_id in layer.locks.items():
            locks[op] = kernel_id
            label = f"env:{ENV_LOCK_PREFIX}{op.upper()}" if layer is _env else layer.label
            sources[f"locks.{op}"] = label if kernel_id is not None else f"{label} (unlock)"
    values["locks"] = {op: kid for op, kid in locks.items() if kid is not None}
    if values["locks"]:
        sources["locks"] = "per op (locks.<op>)"
    settings = Settings(**values)
    for name in settings.to_dict():
        sources.setdefault(name, "default")
    return Policy(settings=settings, sources=sources, unknown_env=_unknown_env)


def _changed() -> None:
    """Rebuild after a global change; caller holds _lock."""
    global _version, _base
    _version += 1
    _derived.clear()
    _base = _build()


def _init_from_environment() -> None:
    global _file, _env, _unknown_env
    config = os.environ.get(ENV_CONFIG)
    file = read_file(Path(config).expanduser()) if config else Layer("default")
    env, unknown = read_env(os.environ)
    _file, _env, _unknown_env = file, env, unknown


def get_policy() -> Policy:
    """The policy in force for the calling thread / task (global layers plus its context managers)."""
    base = _base
    if base is None:
        with _lock:
            if _base is None:
                _init_from_environment()
                _changed()
            base = _base
            assert base is not None
    prefer, disabled = _PREFER.get(), _DISABLED.get()
    if not prefer and not disabled:
        return base
    cache_key = (id(base), prefer, disabled)
    policy = _derived.get(cache_key)
    if policy is None or policy.settings is not base.settings:
        sources = dict(base.sources)
        if disabled:
            sources["enabled"] = "context:lz.disabled()"
        policy = Policy(base.settings, sources, prefer, disabled, base.unknown_env)
        if len(_derived) >= _DERIVED_MAX:
            _derived.clear()
        _derived[cache_key] = policy
    return policy


def version() -> int:
    """Bumped by every global policy change (load, configure, lock, unlock, reset)."""
    if _base is None:
        get_policy()
    return _version


def load(path: str | os.PathLike[str] | None = None) -> Policy:
    """Load layerzero.yaml from `path` (default: $LAYERZERO_CONFIG); replaces any previously loaded file."""
    global _file
    if path is None:
        config = os.environ.get(ENV_CONFIG)
        if not config:
            raise PolicyError(f"load() without a path needs {ENV_CONFIG} to name a layerzero.yaml")
        path = config
    layer = read_file(Path(path).expanduser())
    get_policy()
    with _lock:
        _file = layer
        _changed()
        assert _base is not None
        return _base


def configure(**settings: Any) -> Policy:
    """Set policy fields programmatically (above file and environment); raises PolicyError naming a bad field."""
    values, locks = parse_settings(settings, where="configure")
    get_policy()
    with _lock:
        _programmatic.values.update(values)
        _programmatic.locks.update(locks)
        _changed()
        assert _base is not None
        return _base


def lock(op: str, kernel_id: str) -> None:
    """Always use kernel_id for op (selection is bypassed; dispatch raises if it cannot run the call)."""
    if not op or not isinstance(op, str) or not kernel_id or not isinstance(kernel_id, str):
        raise PolicyError(f"lock needs an op and a kernel id, got {op!r}, {kernel_id!r}")
    op = canonical_op(op)
    get_policy()
    with _lock:
        _programmatic.locks[op] = kernel_id
        _changed()


def unlock(op: str) -> None:
    """Remove op's lock, whichever source (file, environment, lock()) set it."""
    op = canonical_op(op)
    get_policy()
    with _lock:
        _programmatic.locks[op] = None
        _changed()


def reset() -> None:
    """Drop configure/lock/unlock/load state and re-read $LAYERZERO_CONFIG and the LAYERZERO_* variables."""
    global _programmatic
    with _lock:
        _init_from_environment()
        _programmatic = Layer("configure")
        _changed()


@contextmanager
def prefer(*backends: str) -> Iterator[None]:
    """Within the block (this thread / task only), kernels whose backend or id matches a pattern win when valid."""
    if not backends or not all(isinstance(b, str) and b for b in backends):
        raise PolicyError(f"prefer() needs backend names or kernel-id patterns, got {backends!r}")
    token = _PREFER.set(tuple(backends) + _PREFER.get())
    try:
        yield
    finally:
        _PREFER.reset(token)


@contextmanager
def disabled() -> Iterator[None]:
    """Within the block (this thread / task only), only reference kernels run."""
    token = _DISABLED.set(True)
    try:
        yield
    finally:
        _DISABLED.reset(token)


__all__ = [
    "Policy",
    "PolicyError",
    "Rule",
    "configure",
    "disabled",
    "get_policy",
    "load",
    "lock",
    "prefer",
    "reset",
    "unlock",
    "version",
]
