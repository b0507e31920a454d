"""Probe sets the tests write themselves: random probes (single and banks) as safetensors plus their YAML."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from omniscience.kernel import ACTIVATION_CODES


@dataclass(frozen=True)
class Spec:
    """One YAML entry: `count` > 1 writes a bank named <name>.p0, <name>.p1, ..."""

    name: str
    layer: int
    activation: str = "linear"
    count: int = 1


def write_probe_set(folder: Path, hidden: int, specs: list[Spec], seed: int = 0, scale: float = 0.1,
                    file_name: str = "probes.yaml") -> Path:
    """Random float32 probes for a model of width `hidden`; returns the YAML path."""
    folder.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    lines = ["probes:"]
    for spec in specs:
        weights = f"{spec.name}-{seed}.safetensors"
        if spec.count == 1:
            tensors = {"weight": torch.randn(hidden, generator=g) * scale, "bias": torch.randn((), generator=g) * scale}
            save_file(tensors, folder / weights)
        else:
            tensors = {"weight": torch.randn(spec.count, hidden, generator=g) * scale,
                       "bias": torch.randn(spec.count, generator=g) * scale}
            save_file(tensors, folder / weights, metadata={"names": json.dumps([f"p{i}" for i in range(spec.count)])})
        lines += [f"  - name: {spec.name}", f"    layer: {spec.layer}", f"    weight_path: {weights}",
                  f"    activation: {spec.activation}"]
    path = folder / file_name
    path.write_text("\n".join(lines) + "\n")
    return path


def float64_scores(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The read-out in float64: act_j(h . weight[:, j] + bias[j]) for h [T, hidden], weight [hidden, P], codes [P]."""
    z = h.double() @ weight.double() + bias.double()
    return torch.where(codes == 1, torch.sigmoid(z), torch.where(codes == 2, torch.tanh(z), z))


def expected_scores(probe, residual: torch.Tensor) -> np.ndarray:
    """activation(w . h + b) in float64 for residual rows [T, hidden]: the reference served scores must match."""
    codes = torch.tensor([ACTIVATION_CODES[probe.activation]])
    return float64_scores(residual, probe.weight[:, None], torch.tensor([probe.bias]), codes)[:, 0].numpy()
