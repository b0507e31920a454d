"""Conditional policy rules: `match` conditions on a SelectionContext, then prefer / avoid patterns.

A rule such as `{match: {sm: ">=90", op: "attention*", dtype: [float16, bfloat16], seq_len: ">16384"},
prefer: "triton.*", avoid_sources: [xformers]}` applies when every condition holds. Numeric conditions are
an int (equality) or comparisons joined by commas (">=80,<90"); `op` takes glob patterns; `dtype`,
`platform`, `layout`, `generation` take names; `causal` a boolean. A context field that is unset (None)
never matches a condition on it.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from layerzero.select.context import SelectionContext

NUMERIC_FIELDS = frozenset(
    {"sm", "batch", "seq_q", "seq_k", "tokens", "num_heads", "num_kv_heads", "head_dim", "hidden"}
)
NAME_FIELDS = frozenset({"dtype", "platform", "layout", "generation"})
ALIASES = {"operation": "op", "seq_len": "seq_k", "batch_size": "batch"}
MATCH_KEYS = frozenset({"op", "causal"} | NUMERIC_FIELDS | NAME_FIELDS | set(ALIASES))
ACTION_KEYS = {"prefer": "prefer", "prefer_sources": "prefer", "avoid": "avoid", "avoid_sources": "avoid"}
_COMPARISON = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?\d+)\s*$")
_OPS: dict[str, Callable[[int, int], bool]] = {
    ">=": operator.ge, "<=": operator.le, "==": operator.eq, "!=": operator.ne, ">": operator.gt, "<": operator.lt,
}


class PolicyError(ValueError):
    """Invalid policy configuration; the message names the field (and the file or variable it came from)."""


@dataclass(frozen=True)
class Condition:
    """One `match` entry: the context field it reads, a predicate on that field's value, and its source text."""

    field: str
    text: str
    test: Callable[[Any], bool]

    def holds(self, ctx: SelectionContext) -> bool:
        value = getattr(ctx, self.field)
        return value is not None and self.test(value)


@dataclass(frozen=True)
class Rule:
    """A conditional preference: when every condition holds, `prefer` patterns gain and `avoid` patterns lose score."""

    conditions: tuple[Condition, ...]
    prefer: tuple[str, ...]
    avoid: tuple[str, ...]

    def matches(self, ctx: SelectionContext) -> bool:
        return all(c.holds(ctx) for c in self.conditions)

    def to_dict(self) -> dict[str, Any]:
        return {
            "match": {c.field: c.text for c in self.conditions},
            "prefer": list(self.prefer),
            "avoid": list(self.avoid),
        }


def _numeric(where: str, raw: Any) -> Callable[[Any], bool]:
    if isinstance(raw, bool):
        raise PolicyError(f"{where}: expected an integer or comparisons like '>=90', got {raw!r}")
    if isinstance(raw, int):
        return lambda value: value == raw
    if not isinstance(raw, str) or not raw.strip():
        raise PolicyError(f"{where}: expected an integer or comparisons like '>=90', got {raw!r}")
    checks = []
    for part in raw.split(","):
        found = _COMPARISON.match(part)
        if found is None:
            raise PolicyError(f"{where}: {part.strip()!r} is not a comparison like '>=90' or '<16384'")
        checks.append((_OPS[found.group(1)], int(found.group(2))))
    return lambda value: all(compare(value, bound) for compare, bound in checks)


def _names(where: str, raw: Any) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) else raw
    if not isinstance(items, Sequence) or not items or not all(isinstance(i, str) and i for i in items):
        raise PolicyError(f"{where}: expected a non-empty string or list of strings, got {raw!r}")
    return tuple(items)


def _name_test(field: str, names: tuple[str, ...]) -> Callable[[Any], bool]:
    if field == "dtype":
        wanted = frozenset(n.removeprefix("torch.") for n in names)
        return lambda value: str(value).removeprefix("torch.") in wanted
    return lambda value: value in names


def _condition(where: str, key: Any, raw: Any) -> Condition:
    if key not in MATCH_KEYS:
        raise PolicyError(f"{where}: unknown match field {key!r} (known: {', '.join(sorted(MATCH_KEYS))})")
    field = ALIASES.get(key, key)
    here = f"{where}.{key}"
    if field in NUMERIC_FIELDS:
        return Condition(field, str(raw), _numeric(here, raw))
    if field == "causal":
        if not isinstance(raw, bool):
            raise PolicyError(f"{here}: expected true or false, got {raw!r}")
        return Condition(field, str(raw).lower(), lambda value: value is raw)
    names = _names(here, raw)
    if field == "op":
        return Condition(field, ",".join(names), lambda value: any(fnmatchcase(value, p) for p in names))
    return Condition(field, ",".join(names), _name_test(field, names))


def _rule(where: str, raw: Any) -> Rule:
    if not isinstance(raw, Mapping):
        raise PolicyError(f"{where}: a rule must be a mapping with 'match' and 'prefer'/'avoid', got {raw!r}")
    unknown = set(raw) - {"match"} - set(ACTION_KEYS)
    if unknown:
        known = ", ".join(["match", *sorted(ACTION_KEYS)])
        raise PolicyError(f"{where}: unknown field {sorted(unknown)[0]!r} (known: {known})")
    match = raw.get("match")
    if not isinstance(match, Mapping) or not match:
        raise PolicyError(f"{where}.match: expected a non-empty mapping of conditions, got {match!r}")
    conditions = tuple(_condition(f"{where}.match", key, value) for key, value in match.items())
    actions: dict[str, tuple[str, ...]] = {"prefer": (), "avoid": ()}
    for key, target in ACTION_KEYS.items():
        if key in raw:
            actions[target] += _names(f"{where}.{key}", raw[key])
    if not actions["prefer"] and not actions["avoid"]:
        raise PolicyError(f"{where}: a rule needs 'prefer' or 'avoid' (or prefer_sources / avoid_sources)")
    return Rule(conditions, actions["prefer"], actions["avoid"])


def parse_rules(raw: Any, where: str = "rules") -> tuple[Rule, ...]:
    """Validate a `rules:` list; PolicyError names the offending rule and field."""
    if not isinstance(raw, Sequence) or isinstance(raw, str):
        raise PolicyError(f"{where}: expected a list of rules, got {raw!r}")
    return tuple(_rule(f"{where}[{i}]", item) for i, item in enumerate(raw))
