"""Probe weights from safetensors: shapes checked from the header before any tensor is read, then values.

A file holds `weight` [hidden] (or [1, hidden]) and optionally `bias` [] or [1]: one probe named after its
YAML entry. A bank holds `weight` [k, hidden], optionally `bias` [k], and `names` (a JSON list of k strings)
in its metadata: k probes named `<entry>.<names[i]>` sharing the entry's layer and activation.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from omniscience.config import Activation, ProbeConfig, ProbeError, read_config

FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
MAX_HEADER_BYTES = 100 * 2**20


@dataclass(frozen=True)
class Probe:
    """One loaded probe: score = activation(weight . resid_post[layer] + bias), in float32."""

    name: str
    layer: int
    activation: Activation
    weight: torch.Tensor  # [hidden] float32, on the host
    bias: float
    source: Path
    sha256: str  # of the source file


@dataclass(frozen=True)
class ProbeSet:
    """Every probe a YAML file defines, in file order (bank members in their file's order)."""

    path: Path
    probes: tuple[Probe, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.probes)

    @property
    def layers(self) -> tuple[int, ...]:
        """The distinct layers probed, ascending."""
        return tuple(sorted({p.layer for p in self.probes}))


def read_header(path: Path) -> tuple[dict[str, dict], dict[str, str]]:
    """(tensor name -> {dtype, shape, data_offsets}, metadata) from a safetensors header, reading nothing else."""
    with path.open("rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ProbeError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        (size,) = struct.unpack("<Q", head)
        if size > MAX_HEADER_BYTES:
            raise ProbeError(f"{path}: not a safetensors file (header claims {size} bytes)")
        try:
            header = json.loads(f.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ProbeError(f"{path}: not a safetensors file (unreadable header: {exc})") from exc
    if not isinstance(header, dict):
        raise ProbeError(f"{path}: not a safetensors file (header is not an object)")
    metadata = header.pop("__metadata__", None) or {}
    return header, metadata


def _shape(header: dict[str, dict], path: Path, name: str) -> list[int]:
    entry = header[name]
    if entry.get("dtype") not in FLOAT_DTYPES:
        raise ProbeError(f"{path}: tensor {name!r} has dtype {entry.get('dtype')}; expected one of {', '.join(FLOAT_DTYPES)}")
    return list(entry.get("shape", []))


def _bank_names(metadata: dict[str, str], path: Path) -> list[str] | None:
    if "names" not in metadata:
        return None
    try:
        names = json.loads(metadata["names"])
    except json.JSONDecodeError as exc:
        raise ProbeError(f"{path}: metadata 'names' is not a JSON list: {exc}") from exc
    if not isinstance(names, list) or not names or not all(isinstance(n, str) and n for n in names):
        raise ProbeError(f"{path}: metadata 'names' must be a non-empty JSON list of non-empty strings")
    if len(set(names)) != len(names):
        raise ProbeError(f"{path}: metadata 'names' repeats a name")
    return names


def check_header(path: Path, hidden_size: int) -> list[str] | None:
    """Validate tensor names, dtypes and shapes from the header; returns the bank's names (None: one probe)."""
    header, metadata = read_header(path)
    unknown = sorted(set(header) - {"weight", "bias"})
    if unknown:
        raise ProbeError(f"{path}: unexpected tensor(s) {', '.join(unknown)}; a probe file holds 'weight' and optionally 'bias'")
    if "weight" not in header:
        raise ProbeError(f"{path}: missing tensor 'weight' (shape [{hidden_size}], or [k, {hidden_size}] with 'names' metadata)")
    names = _bank_names(metadata, path)
    weight = _shape(header, path, "weight")
    bias = _shape(header, path, "bias") if "bias" in header else None
    if names is None:
        if weight not in ([hidden_size], [1, hidden_size]):
            raise ProbeError(f"{path}: tensor 'weight' has shape {weight}; expected [{hidden_size}] (the model's hidden size)")
        if bias is not None and bias not in ([], [1]):
            raise ProbeError(f"{path}: tensor 'bias' has shape {bias}; expected [] or [1]")
        return None
    if weight != [len(names), hidden_size]:
        raise ProbeError(f"{path}: tensor 'weight' has shape {weight}; expected [{len(names)}, {hidden_size}] "
                         f"({len(names)} names in the metadata, hidden size {hidden_size})")
    if bias is not None and bias != [len(names)]:
        raise ProbeError(f"{path}: tensor 'bias' has shape {bias}; expected [{len(names)}]")
    return names


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def load_entry(entry: ProbeConfig, hidden_size: int, num_layers: int) -> list[Probe]:
    """The probes of one YAML entry, validated against the model's hidden size and layer count."""
    path = entry.weight_path
    if entry.layer >= num_layers:
        raise ProbeError(f"probe {entry.name!r}: layer {entry.layer} is out of range; the model has {num_layers} layers (0-{num_layers - 1})")
    names = check_header(path, hidden_size)
    try:
        tensors = load_file(str(path))
    except Exception as exc:  # safetensors' SafetensorError: a truncated or corrupt data section
        raise ProbeError(f"{path}: cannot read its tensors (a truncated or corrupt .safetensors file?): {exc}") from exc
    weight = tensors["weight"].to(torch.float32).reshape(len(names or [None]), hidden_size)
    bias = tensors["bias"].to(torch.float32).reshape(-1) if "bias" in tensors else torch.zeros(weight.shape[0])
    for tensor_name, value in (("weight", weight), ("bias", bias)):
        if not torch.isfinite(value).all():
            raise ProbeError(f"{path}: tensor {tensor_name!r} holds NaN or Inf values")
    sha = file_sha256(path)
    labels = [entry.name] if names is None else [f"{entry.name}.{n}" for n in names]
    return [
        Probe(label, entry.layer, entry.activation, weight[i].clone(), float(bias[i]), path, sha)
        for i, label in enumerate(labels)
    ]


def load_probe_set(path: str | Path, hidden_size: int, num_layers: int) -> ProbeSet:
    """Read and validate a probe-set YAML file and every weight file it names (all on the host)."""
    config = read_config(path)
    probes = [p for entry in config.probes for p in load_entry(entry, hidden_size, num_layers)]
    names = [p.name for p in probes]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ProbeError(f"{path}: probe names must be unique; a bank's names repeat: {', '.join(repeated)}")
    return ProbeSet(Path(path).expanduser().resolve(), tuple(probes))
