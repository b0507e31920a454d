"""Capabilities descriptors: JSON that declares a backend's kernels and their constraints.

`apply_descriptor(specs, source)` validates the descriptor against capabilities_schema.json (v1) and
rewrites each KernelSpec's constraints from it. It fails closed and never raises: an unreadable or invalid
descriptor (unknown schema_version, unknown field, wrong type, duplicate kernel_id, inverted range) makes
every kernel of the backend unavailable with CAPABILITIES_SCHEMA_MISMATCH, and so does a kernel the
descriptor does not list. Missing optional fields default to "unsupported" (no GQA, no sliding window,
no masks, not graph safe, not deterministic, last dim must be contiguous); numeric limits default to none.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch

from layerzero.extend.schema_check import validate
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CAPABILITIES_SCHEMA_MISMATCH, Reason

SCHEMA_PATH = Path(__file__).with_name("capabilities_schema.json")
SCHEMA: dict[str, Any] = json.loads(SCHEMA_PATH.read_text())
SUPPORTED_SCHEMA_VERSIONS = tuple(SCHEMA["properties"]["schema_version"]["enum"])
_ALL_MASKS = frozenset({"none", "bool", "float"})


class CapabilitiesError(ValueError):
    """A descriptor that fails validation; the message names the source and every offending field."""


@dataclass(frozen=True)
class Descriptor:
    """A validated v1 descriptor: kernel entries keyed by (op, kernel_id), and its content hash."""

    backend: str
    backend_version: str
    platforms: frozenset[str]
    entries: Mapping[tuple[str, str], Mapping[str, Any]]
    digest: str
    source: str


@dataclass(frozen=True)
class DescriptorStatus:
    """What applying one descriptor did: valid or the error, and the kernels it could not match."""

    backend: str
    source: str
    digest: str | None
    error: str | None = None
    unlisted_kernels: tuple[str, ...] = ()  # backend kernels the descriptor does not declare (disabled)
    unknown_kernels: tuple[str, ...] = ()  # declared kernels the backend does not have (ignored)

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {
            "backend": self.backend, "source": self.source, "digest": self.digest, "ok": self.ok, "error": self.error,
            "unlisted_kernels": list(self.unlisted_kernels), "unknown_kernels": list(self.unknown_kernels),
        }


def _read(source: Mapping[str, Any] | str | Path) -> tuple[Any, str]:
    if isinstance(source, Mapping):
        return source, "<dict>"
    path = Path(source)
    try:
        return json.loads(path.read_text()), str(path)
    except OSError as exc:
        raise CapabilitiesError(f"{path}: cannot read descriptor: {exc}") from exc
    except json.JSONDecodeError as exc:
        raise CapabilitiesError(f"{path}: invalid JSON: {exc}") from exc


def _semantic_errors(data: Mapping[str, Any]) -> list[str]:
    errors = []
    seen: dict[str, str] = {}
    for op, entries in data["ops"].items():
        for i, entry in enumerate(entries):
            where = f"ops.{op}[{i}]"
            kernel_id = entry["kernel_id"]
            if kernel_id in seen:
                errors.append(f"{where}.kernel_id: {kernel_id!r} is already declared at {seen[kernel_id]}")
            seen[kernel_id] = where
            for lo, hi in (("min_sm", "max_sm"), ("min_head_dim", "max_head_dim")):
                if entry.get(lo) is not None and entry.get(hi) is not None and entry[lo] > entry[hi]:
                    errors.append(f"{where}: {lo}={entry[lo]} is above {hi}={entry[hi]}")
    return errors


def load_descriptor(source: Mapping[str, Any] | str | Path) -> Descriptor:
    """Read and validate a descriptor (a mapping or a JSON file); raises CapabilitiesError naming the fields."""
    data, label = _read(source)
    version = data.get("schema_version") if isinstance(data, Mapping) else None
    if version is not None and version not in SUPPORTED_SCHEMA_VERSIONS:
        supported = ", ".join(SUPPORTED_SCHEMA_VERSIONS)
        raise CapabilitiesError(f"{label}: schema_version: unsupported {version!r} (supported: {supported})")
    errors = validate(data, SCHEMA)
    if not errors:
        errors = _semantic_errors(data)
    if errors:
        raise CapabilitiesError(f"{label}: " + "; ".join(errors))
    platform = data["platform"]
    entries = {(op, e["kernel_id"]): e for op, items in data["ops"].items() for e in items}
    canonical = json.dumps(data, sort_keys=True, separators=(",", ":"))
    return Descriptor(
        backend=data["backend"],
        backend_version=data["backend_version"],
        platforms=frozenset([platform] if isinstance(platform, str) else platform),
        entries=entries,
        digest=hashlib.sha256(canonical.encode()).hexdigest(),
        source=label,
    )


def _dtypes(names: list[str] | None) -> frozenset[torch.dtype] | None:
    if names is None:
        return None
    # A dtype this torch build lacks (float8 on old builds) cannot be passed in, so it is simply dropped.
    return frozenset(getattr(torch, n) for n in names if hasattr(torch, n))


def constrain(spec: KernelSpec, descriptor: Descriptor) -> KernelSpec:
    """Spec with its constraints taken from its descriptor entry (fail closed on missing fields)."""
    entry = descriptor.entries[(spec.op, spec.kernel_id)]
    layouts = entry["requires_layouts"]
    return replace(
        spec,
        version=descriptor.backend_version,
        platforms=descriptor.platforms,
        min_sm=entry.get("min_sm"),
        max_sm=entry.get("max_sm"),
        dtypes=_dtypes(entry["dtypes"]),
        min_head_dim=entry.get("min_head_dim"),
        max_head_dim=entry.get("max_head_dim"),
        head_dim_multiple=entry.get("head_dim_multiple"),
        max_seq_len=entry.get("max_seq_len"),
        layouts=None if layouts is None else frozenset(layouts),
        supports_gqa=entry.get("supports_gqa", False),
        supports_sliding_window=entry.get("supports_sliding_window", False),
        attn_mask_types=_ALL_MASKS if entry.get("supports_attn_mask", False) else frozenset({"none"}),
        requires_last_dim_contiguous=entry.get("requires_last_dim_stride1", True),
        graph_safe=entry.get("is_cuda_graph_safe", False),
        deterministic=entry.get("deterministic", False),
    )


def _unavailable(spec: KernelSpec, reason: Reason) -> KernelSpec:
    return replace(spec, available=lambda: reason)


_lock = threading.Lock()
_statuses: dict[str, DescriptorStatus] = {}


def apply_descriptor(specs: Iterable[KernelSpec], source: Mapping[str, Any] | str | Path) -> list[KernelSpec]:
    """The backend's specs constrained by its descriptor; never raises (invalid -> CAPABILITIES_SCHEMA_MISMATCH)."""
    specs = list(specs)
    backends = sorted({s.backend for s in specs})
    try:
        descriptor = load_descriptor(source)
    except CapabilitiesError as exc:
        reason = Reason(CAPABILITIES_SCHEMA_MISMATCH, f"capabilities descriptor rejected: {exc}")
        label = str(source) if not isinstance(source, Mapping) else "<dict>"
        for backend in backends:
            _record(DescriptorStatus(backend, label, None, error=str(exc)))
        return [_unavailable(s, reason) for s in specs]
    out, unlisted = [], []
    for spec in specs:
        if spec.backend != descriptor.backend:
            message = f"descriptor {descriptor.source} is for backend {descriptor.backend!r}, not {spec.backend!r}"
            out.append(_unavailable(spec, Reason(CAPABILITIES_SCHEMA_MISMATCH, message)))
        elif (spec.op, spec.kernel_id) not in descriptor.entries:
            unlisted.append(spec.kernel_id)
            message = f"{spec.kernel_id} ({spec.op}) is not declared by descriptor {descriptor.source}"
            out.append(_unavailable(spec, Reason(CAPABILITIES_SCHEMA_MISMATCH, message)))
        else:
            out.append(constrain(spec, descriptor))
    known = {(s.op, s.kernel_id) for s in specs}
    unknown = tuple(sorted(kid for op, kid in descriptor.entries if (op, kid) not in known))
    _record(DescriptorStatus(descriptor.backend, descriptor.source, descriptor.digest, None, tuple(unlisted), unknown))
    return out


def _record(status: DescriptorStatus) -> None:
    with _lock:
        _statuses[status.backend] = status


def statuses() -> list[DescriptorStatus]:
    """The last descriptor applied for each backend, valid or not (for readiness_check and doctor)."""
    with _lock:
        return [_statuses[b] for b in sorted(_statuses)]


def capabilities_hash() -> str:
    """SHA-256 over every applied descriptor (digest or error): changes whenever any backend's capabilities do."""
    parts = [[s.backend, s.digest, s.error] for s in statuses()]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()
