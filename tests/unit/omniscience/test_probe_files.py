"""Probe-set validation: the YAML schema and the safetensors checks, each failure naming what is wrong."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from omniscience import ProbeError, load_probe_set, read_config
from probe_sets import Spec, write_probe_set

HIDDEN, LAYERS = 8, 4


def _yaml(folder: Path, body: str) -> Path:
    path = folder / "probes.yaml"
    path.write_text(body)
    return path


def _entry(name: str = "p", layer: int = 1, weights: str = "w.safetensors", activation: str = "linear") -> str:
    return f"probes:\n  - name: {name}\n    layer: {layer}\n    weight_path: {weights}\n    activation: {activation}\n"


def test_a_written_set_loads_with_banks_expanded(tmp_path):
    path = write_probe_set(tmp_path, HIDDEN, [Spec("one", 1, "sigmoid"), Spec("bank", 3, "tanh", count=3)])
    loaded = load_probe_set(path, HIDDEN, LAYERS)
    assert loaded.names == ("one", "bank.p0", "bank.p1", "bank.p2")
    assert loaded.layers == (1, 3)
    assert [p.activation for p in loaded.probes] == ["sigmoid", "tanh", "tanh", "tanh"]
    assert all(p.weight.dtype == torch.float32 and p.weight.shape == (HIDDEN,) for p in loaded.probes)
    assert len({p.sha256 for p in loaded.probes}) == 2


@pytest.mark.parametrize("body, message", [
    ("probes: []\n", "at least 1"),
    (_entry() + "  - name: p\n    layer: 2\n    weight_path: w.safetensors\n", "unique; repeated: p"),
    (_entry(activation="relu"), "activation"),
    (_entry(layer=-1), "layer"),
    (_entry(weights="missing.safetensors"), "file not found"),
    (_entry(weights="w.bin"), "must be a .safetensors file"),
    ("probes:\n  - name: p\n    layer: 1\n    weight_path: w.safetensors\n    color: red\n", "color"),
    ("probes: [\n", "not valid YAML"),
])
def test_bad_yaml_is_refused_naming_the_problem(tmp_path, body, message):
    save_file({"weight": torch.zeros(HIDDEN)}, tmp_path / "w.safetensors")
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(ProbeError, match=message):
        read_config(_yaml(tmp_path, body))


def _one_file(tmp_path: Path, tensors: dict, metadata: dict | None = None, layer: int = 1) -> Path:
    save_file(tensors, tmp_path / "w.safetensors", metadata=metadata)
    return _yaml(tmp_path, _entry(layer=layer))


@pytest.mark.parametrize("tensors, metadata, message", [
    ({"weight": torch.zeros(HIDDEN + 1)}, None, r"'weight' has shape \[9\]; expected \[8\]"),
    ({"weight": torch.zeros(HIDDEN, dtype=torch.int32)}, None, "dtype I32"),
    ({"bias": torch.zeros(())}, None, "missing tensor 'weight'"),
    ({"weight": torch.zeros(HIDDEN), "bias": torch.zeros(2)}, None, r"'bias' has shape \[2\]"),
    ({"weight": torch.full((HIDDEN,), float("nan"))}, None, "NaN or Inf"),
    ({"weight": torch.zeros(HIDDEN), "bias": torch.tensor(float("inf"))}, None, "'bias' holds NaN or Inf"),
    ({"weight": torch.zeros(2, HIDDEN)}, {"names": json.dumps(["a", "b", "c"])}, r"expected \[3, 8\]"),
    ({"weight": torch.zeros(2, HIDDEN)}, {"names": "not json"}, "not a JSON list"),
    ({"weight": torch.zeros(HIDDEN), "scale": torch.zeros(1)}, None, "unexpected tensor"),
])
def test_bad_weight_files_are_refused_naming_file_tensor_and_shapes(tmp_path, tensors, metadata, message):
    path = _one_file(tmp_path, tensors, metadata)
    with pytest.raises(ProbeError, match=message) as caught:
        load_probe_set(path, HIDDEN, LAYERS)
    if "shape" in message:
        assert "w.safetensors" in str(caught.value)


def test_a_layer_beyond_the_model_is_refused(tmp_path):
    path = _one_file(tmp_path, {"weight": torch.zeros(HIDDEN)}, layer=LAYERS)
    with pytest.raises(ProbeError, match="layer 4 is out of range; the model has 4 layers"):
        load_probe_set(path, HIDDEN, LAYERS)


def test_a_file_that_is_not_safetensors_is_refused(tmp_path):
    (tmp_path / "w.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(ProbeError, match="not a safetensors file"):
        load_probe_set(_yaml(tmp_path, _entry()), HIDDEN, LAYERS)


def test_a_truncated_file_is_refused_naming_it(tmp_path):
    path = _one_file(tmp_path, {"weight": torch.zeros(HIDDEN), "bias": torch.zeros(())})
    weights = tmp_path / "w.safetensors"
    weights.write_bytes(weights.read_bytes()[:-6])  # the header is whole, the data is cut short
    with pytest.raises(ProbeError, match="w.safetensors: cannot read its tensors.*truncated"):
        load_probe_set(path, HIDDEN, LAYERS)


def test_the_library_imports_nothing_from_infer():
    import subprocess
    import sys

    code = ("import sys, omniscience, omniscience.bank, omniscience.kernel, omniscience.weights, omniscience.shading; "
            "print([m for m in sys.modules if m == 'infer' or m.startswith('infer.')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
