"""Where policy settings come from: layerzero.yaml files and LAYERZERO_* environment variables, as layers.

Each source is read into a `Layer` of validated values and locks; `layerzero.policy.state` merges the layers
(lowest first) and records, per setting, the label of the source that set it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from layerzero.policy.rules import PolicyError
from layerzero.policy.settings import parse_settings

ENV_PREFIX = "LAYERZERO_"
ENV_CONFIG = "LAYERZERO_CONFIG"
ENV_LOCK_PREFIX = "LAYERZERO_LOCK_"
_ENV_BOOL = {
    "LAYERZERO_DISABLED": ("enabled", True),  # (setting, inverted)
    "LAYERZERO_VERBOSE": ("log_selections", False),
    "LAYERZERO_DETERMINISTIC": ("deterministic", False),
    "LAYERZERO_STRICT": ("strict_mode", False),
    "LAYERZERO_GRAPH_STRICT": ("graph_strict_mode", False),
    "LAYERZERO_FALLBACK": ("fallback_enabled", False),
    "LAYERZERO_DEBUG": ("debug_sync", False),
    "LAYERZERO_PERFDB": ("perfdb_enabled", False),
}
_ENV_LIST = {"LAYERZERO_PREFER": "prefer_sources", "LAYERZERO_AVOID": "avoid_sources"}
_ENV_PATH = {"LAYERZERO_PERFDB_PATH": "perfdb_path"}
_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


@dataclass
class Layer:
    """The settings one source sets explicitly (validated), its label and its locks (None = unlocked)."""

    label: str
    values: dict[str, Any] = field(default_factory=dict)
    locks: dict[str, str | None] = field(default_factory=dict)


def _parse_bool(name: str, raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise PolicyError(f"environment variable {name}={raw!r} is not a boolean (use 1/0, true/false, yes/no, on/off)")


def read_env(environ: Mapping[str, str]) -> tuple[Layer, tuple[str, ...]]:
    """The LAYERZERO_* variables as a layer, and the names of those this policy does not know."""
    layer = Layer("env")
    unknown = []
    for name, raw in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX) or name == ENV_CONFIG:
            continue
        if name in _ENV_BOOL:
            setting, inverted = _ENV_BOOL[name]
            layer.values[setting] = _parse_bool(name, raw) != inverted
        elif name in _ENV_LIST:
            layer.values[_ENV_LIST[name]] = tuple(part.strip() for part in raw.split(",") if part.strip())
        elif name in _ENV_PATH:
            if raw.strip():
                layer.values[_ENV_PATH[name]] = raw.strip()
        elif name.startswith(ENV_LOCK_PREFIX) and len(name) > len(ENV_LOCK_PREFIX):
            if not raw.strip():
                raise PolicyError(f"environment variable {name} is empty: give a kernel id")
            layer.locks[name[len(ENV_LOCK_PREFIX):].lower()] = raw.strip()
        else:
            unknown.append(name)
    return layer, tuple(unknown)


def read_file(path: Path) -> Layer:
    """A layerzero.yaml as a layer; PolicyError names the file and the field."""
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except OSError as exc:
        raise PolicyError(f"{path}: cannot read policy file: {exc}") from exc
    except yaml.YAMLError as exc:
        raise PolicyError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, Mapping):
        raise PolicyError(f"{path}: the top level must be a mapping, got {type(data).__name__}")
    try:
        values, locks = parse_settings(data, where="file")
    except PolicyError as exc:
        raise PolicyError(f"{path}: {exc}") from exc
    return Layer(f"file:{path}", values, locks)


def env_label(setting: str) -> str:
    """The source label of a setting taken from the environment: the variable that sets it."""
    for name, (target, _) in _ENV_BOOL.items():
        if target == setting:
            return f"env:{name}"
    for name, target in (*_ENV_LIST.items(), *_ENV_PATH.items()):
        if target == setting:
            return f"env:{name}"
    return "env"
