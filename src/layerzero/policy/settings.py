"""Policy settings: the typed fields, their defaults, and validation of a layerzero.yaml mapping.

`parse_settings` checks every key and value and raises PolicyError naming the field; the same checks
serve `layerzero.yaml`, `configure(...)` keywords and environment variables.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from layerzero.policy.rules import PolicyError, Rule, parse_rules
from layerzero.select.signatures import canonical_op

SUPPORTED_VERSION = 1


@dataclass(frozen=True)
class Settings:
    """Every policy setting with its default; `locks` maps op -> kernel id."""

    enabled: bool = True
    fallback_enabled: bool = True
    log_selections: bool = False
    deterministic: bool = False
    strict_mode: bool = False
    allow_adaptation: bool = True
    graph_strict_mode: bool = False
    debug_sync: bool = False
    memory_headroom_mb: int = 1024
    prefer_sources: tuple[str, ...] = ()
    avoid_sources: tuple[str, ...] = ()
    locks: Mapping[str, str] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    perfdb_enabled: bool = True
    perfdb_path: str | None = None
    perfdb_tune_samples: int = 20  # lz.tune's default sample count
    cache_max_size: int = 10000  # bound of each selection cache, read when the process engine is created

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "rules":
                value = [rule.to_dict() for rule in value]
            elif f.name == "locks":
                value = dict(sorted(value.items()))
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
        return out


_BOOLS = frozenset(
    {"enabled", "fallback_enabled", "log_selections", "deterministic", "strict_mode", "allow_adaptation",
     "graph_strict_mode", "debug_sync"}
)
_LISTS = frozenset({"prefer_sources", "avoid_sources"})
# Spec keys whose only value this implementation supports (it has no planner, runs backends in process,
# tunes only when asked (lz.tune, lz.warmup(tune=True)) and always caches selections).
_FIXED = {"plan_mode": False, "explain_enabled": True, "backend_isolation": "in_process"}
_FIXED_IN_SECTION = {("perfdb", "auto_tune"): False, ("cache", "enabled"): True}
# Nested sections: section -> {key: (setting, kind)}
_SECTIONS = {
    "perfdb": {"enabled": ("perfdb_enabled", "bool"), "path": ("perfdb_path", "path"),
               "auto_tune": ("", "fixed"), "tune_samples": ("perfdb_tune_samples", "positive")},
    "cache": {"enabled": ("", "fixed"), "max_size": ("cache_max_size", "positive")},
}
KNOWN_KEYS = frozenset(
    {"version", "memory_headroom_mb", "locks", "rules"} | _BOOLS | _LISTS | set(_FIXED) | set(_SECTIONS)
)


def _bool(where: str, raw: Any) -> bool:
    if not isinstance(raw, bool):
        raise PolicyError(f"{where}: expected true or false, got {raw!r}")
    return raw


def _int(where: str, raw: Any, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise PolicyError(f"{where}: expected an integer >= {minimum}, got {raw!r}")
    return raw


def _strings(where: str, raw: Any) -> tuple[str, ...]:
    if isinstance(raw, str) or not isinstance(raw, Sequence) or not all(isinstance(s, str) and s for s in raw):
        raise PolicyError(f"{where}: expected a list of non-empty strings, got {raw!r}")
    return tuple(raw)


def _fixed(where: str, raw: Any, supported: Any) -> None:
    if raw != supported or type(raw) is not type(supported):
        raise PolicyError(f"{where}: only {supported!r} is supported by this implementation, got {raw!r}")


def _locks(raw: Any) -> dict[str, str | None]:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"locks: expected a mapping of op -> kernel id, got {raw!r}")
    out: dict[str, str | None] = {}
    for op, kernel_id in raw.items():
        if not isinstance(op, str) or not op:
            raise PolicyError(f"locks: op names must be non-empty strings, got {op!r}")
        if kernel_id is not None and (not isinstance(kernel_id, str) or not kernel_id):
            raise PolicyError(f"locks.{op}: expected a kernel id (or null to unlock), got {kernel_id!r}")
        try:
            out[canonical_op(op)] = kernel_id
        except ValueError as exc:
            raise PolicyError(f"locks.{op}: {exc}") from None
    return out


def _section(name: str, raw: Any, values: dict[str, Any]) -> None:
    keys = _SECTIONS[name]
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{name}: expected a mapping with keys {', '.join(keys)}, got {raw!r}")
    for key, value in raw.items():
        if key not in keys:
            raise PolicyError(f"{name}.{key}: unknown field (known: {', '.join(keys)})")
        setting, kind = keys[key]
        where = f"{name}.{key}"
        if kind == "fixed":
            _fixed(where, value, _FIXED_IN_SECTION[(name, key)])
        elif kind == "bool":
            values[setting] = _bool(where, value)
        elif kind == "positive":
            values[setting] = _int(where, value, 1)
        elif value is not None and (not isinstance(value, str) or not value):
            raise PolicyError(f"{where}: expected a path string or null, got {value!r}")
        else:
            values[setting] = value


def parse_settings(data: Mapping[str, Any], where: str) -> tuple[dict[str, Any], dict[str, str | None]]:
    """Validate a settings mapping; returns (setting values, locks). `where` names the source in errors."""
    values: dict[str, Any] = {}
    locks: dict[str, str | None] = {}
    for key, raw in data.items():
        if key not in KNOWN_KEYS:
            raise PolicyError(f"unknown field {key!r} in {where} (known: {', '.join(sorted(KNOWN_KEYS))})")
        if key == "version":
            if raw != SUPPORTED_VERSION or isinstance(raw, bool):
                raise PolicyError(f"version: unsupported policy version {raw!r} (supported: {SUPPORTED_VERSION})")
        elif key in _BOOLS:
            values[key] = _bool(key, raw)
        elif key in _LISTS:
            values[key] = _strings(key, raw)
        elif key == "memory_headroom_mb":
            values[key] = _int(key, raw, 0)
        elif key == "locks":
            locks.update(_locks(raw))
        elif key == "rules":
            values[key] = parse_rules(raw)
        elif key in _SECTIONS:
            _section(key, raw, values)
        else:
            _fixed(key, raw, _FIXED[key])
    return values, locks
