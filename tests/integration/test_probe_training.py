"""`python -m omniscience train` as a user runs it: a layer sweep on the bundled SmolLM2 writes a probe set the
runtime loads, and bad data fails before the model loads, naming the line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from omniscience import load_probe_set

LIKED = ["I loved it", "It was wonderful", "What a great film", "Absolutely fantastic", "I enjoyed every minute",
         "Brilliant and moving", "A delightful experience", "Superb acting throughout", "This was excellent",
         "I really liked it"]
HATED = ["I hated it", "It was terrible", "What an awful film", "Absolutely dreadful", "I regretted every minute",
         "Boring and lifeless", "A miserable experience", "Wooden acting throughout", "This was horrible",
         "I really disliked it"]


def _train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "omniscience", "train", *args], capture_output=True, text=True,
                          timeout=300)


def _data(folder: Path) -> Path:
    """40 short reviews, liked and hated alternating, plus 10 more rows that --limit leaves unread."""
    rows = [{"text": f"{text}{end}", "label": label}
            for end in (".", "!") for pair in zip(LIKED, HATED) for label, text in zip((1, 0), pair)]
    rows += [{"text": "not read", "label": 7}] * 10  # would fail the run if --limit did not stop before them
    path = folder / "reviews.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.slow
def test_layer_sweep_writes_a_probe_the_runtime_loads(tmp_path):
    out, probes_yaml = tmp_path / "mood.safetensors", tmp_path / "probes.yaml"
    result = _train("--data", str(_data(tmp_path)), "--limit", "40", "--layers", "3,9,15", "--out", str(out),
                    "--yaml", str(probes_yaml), "--device", "cpu", "--max-tokens", "32")
    assert result.returncode == 0, result.stderr[-3000:]
    sweep = re.findall(r"^layer +(\d+): held-out AUC ([0-9.]+)", result.stdout, re.M)
    assert [int(layer) for layer, _ in sweep] == [3, 9, 15]
    auc = float(re.search(r"^held-out AUC: ([0-9.]+)$", result.stdout, re.M).group(1))
    assert re.search(r"^held-out accuracy: [0-9.]+ \(8 rows\)$", result.stdout, re.M)
    assert auc == max(float(a) for _, a in sweep) and auc >= 0.75  # trivially separable: ~1.0 on every layer
    best = int(re.search(r"^best layer: (\d+)$", result.stdout, re.M).group(1))
    assert "32 train, 8 held out" in result.stderr and "activations" in result.stderr

    (probe,) = load_probe_set(probes_yaml, 576, 30).probes
    assert (probe.name, probe.layer, probe.activation) == ("mood", best, "sigmoid")
    assert probe.weight.shape == (576,) and torch.isfinite(probe.weight).all()


def test_bad_data_fails_before_the_model_loads(tmp_path):
    data = tmp_path / "bad.jsonl"
    data.write_text('{"text": "fine", "label": 1}\n{"text": "fine", "label": 0}\n{"text": "oops", "label": "yes"}\n')
    result = _train("--data", str(data), "--layer", "3", "--out", str(tmp_path / "p.safetensors"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"{data}:3: 'label' must be 0 or 1" in result.stderr and "Loading" not in result.stderr
    assert not (tmp_path / "p.safetensors").exists()


@pytest.mark.slow
def test_out_of_range_layer_is_a_clear_error(tmp_path):
    result = _train("--data", str(_data(tmp_path)), "--limit", "4", "--layer", "30", "--out",
                    str(tmp_path / "p.safetensors"), "--device", "cpu")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "layer 30 is out of range: the model has 30 layers (0-29)" in result.stderr
