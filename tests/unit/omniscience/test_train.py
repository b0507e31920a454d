"""Probe fitting without a model: the logistic fit and its folding, AUC, the split, the probe file, data checks."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from omniscience import ProbeConfig, load_probe_set
from omniscience.cli import TrainError, build_parser, read_examples
from omniscience.train import accuracy, fit_logistic, roc_auc, save_probe, split, write_probe_yaml
from omniscience.weights import load_entry


def _separable(n: int = 400, hidden: int = 16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rows with wildly different feature scales and offsets, labelled by the sign of a hidden direction."""
    g = torch.Generator().manual_seed(seed)
    direction = torch.randn(hidden, generator=g)
    z = torch.randn(n, hidden, generator=g)
    y = (z @ direction > 0).long()
    scales = torch.logspace(-2, 2, hidden)  # residual streams have a few huge dimensions
    x = z * scales + torch.randn(hidden, generator=g) * 5
    return x, y, direction / scales  # the true direction in raw space


def test_fit_recovers_a_separable_direction():
    x, y, true = _separable(n=800)
    probe = fit_logistic(x[:400], y[:400], l2=1e-4)
    cosine = torch.nn.functional.cosine_similarity(probe.weight.double(), true.double(), dim=0)
    assert cosine > 0.98
    assert accuracy(probe.predict_proba(x[:400]), y[:400]) > 0.98
    assert roc_auc(probe.predict_proba(x[400:]), y[400:]) > 0.99


def test_folded_weights_give_the_standardized_models_probabilities():
    x, y, _ = _separable(hidden=32, seed=2)
    y = torch.where(torch.rand(len(y), generator=torch.Generator().manual_seed(1)) < 0.15, 1 - y, y)  # not separable
    probe = fit_logistic(x, y, l2=1e-2)
    torch.testing.assert_close(probe.logits(x), probe.logits_standardized(x), atol=1e-4, rtol=1e-5)


def test_constant_features_get_zero_weight_and_one_class_is_refused():
    x, y, _ = _separable(hidden=8)
    x[:, 3] = 7.0
    probe = fit_logistic(x, y)
    assert probe.weight[3] == 0 and torch.isfinite(probe.weight).all()
    with pytest.raises(ValueError, match="one class"):
        fit_logistic(x, torch.ones(len(y), dtype=torch.long))


def _pairwise_auc(scores: list[float], labels: list[int]) -> float:
    pos = [s for s, l in zip(scores, labels) if l == 1]
    neg = [s for s, l in zip(scores, labels) if l == 0]
    wins = sum(1.0 if p > q else 0.5 if p == q else 0.0 for p, q in itertools.product(pos, neg))
    return wins / (len(pos) * len(neg))


@pytest.mark.parametrize("seed", range(5))
def test_auc_matches_the_pairwise_count_with_ties(seed):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 6, (60,), generator=g).double() / 5  # few distinct values: many ties
    labels = torch.randint(0, 2, (60,), generator=g)
    assert roc_auc(scores, labels) == pytest.approx(_pairwise_auc(scores.tolist(), labels.tolist()), abs=1e-12)


def test_auc_edge_cases():
    assert roc_auc(torch.tensor([0.1, 0.9]), torch.tensor([0, 1])) == 1.0
    assert roc_auc(torch.tensor([0.9, 0.1]), torch.tensor([0, 1])) == 0.0
    assert roc_auc(torch.full((4,), 0.3), torch.tensor([0, 1, 0, 1])) == 0.5
    with pytest.raises(ValueError, match="both classes"):
        roc_auc(torch.tensor([0.1, 0.2]), torch.tensor([1, 1]))


def test_split_is_deterministic_disjoint_and_stratified():
    labels = torch.tensor([1] * 30 + [0] * 70)
    train, held = split(100, 0.2, seed=3, labels=labels)
    again = split(100, 0.2, seed=3, labels=labels)
    assert torch.equal(train, again[0]) and torch.equal(held, again[1])
    assert sorted(train.tolist() + held.tolist()) == list(range(100))
    assert int(labels[held].sum()) == 6 and len(held) == 20
    assert not torch.equal(held, split(100, 0.2, seed=4, labels=labels)[1])
    small = split(4, 0.01, labels=torch.tensor([0, 1, 0, 1]))[1]  # at least one of each class held out
    assert sorted(torch.tensor([0, 1, 0, 1])[small].tolist()) == [0, 1]
    with pytest.raises(ValueError, match="at least 2"):
        split(3, 0.5, labels=torch.tensor([0, 1, 1]))


def test_saved_probe_loads_and_scores_as_fitted(tmp_path: Path):
    x, y, _ = _separable(hidden=24, seed=5)
    probe = fit_logistic(x, y, l2=1e-2)
    path = save_probe(tmp_path / "p.safetensors", probe.weight, probe.bias, {"layer": "3", "heldout_auc": "0.9"})
    with safe_open(str(path), "pt") as f:
        assert f.get_tensor("weight").shape == (24,) and f.get_tensor("weight").dtype == torch.float32
        assert f.get_tensor("bias").shape == () and f.metadata()["layer"] == "3"
    (loaded,) = load_entry(ProbeConfig(name="p", layer=3, weight_path=path, activation="sigmoid"), 24, 4)
    served = torch.sigmoid(x.double() @ loaded.weight.double() + loaded.bias)
    torch.testing.assert_close(served, torch.sigmoid(probe.logits_standardized(x)), atol=1e-5, rtol=0)
    yaml_path = write_probe_yaml(tmp_path / "sets" / "probes.yaml", "mood", 3, path)
    (entry,) = load_probe_set(yaml_path, 24, 4).probes
    assert (entry.name, entry.layer, entry.activation) == ("mood", 3, "sigmoid")
    assert "../p.safetensors" in yaml_path.read_text()
    with pytest.raises(ValueError, match="reserved"):
        save_probe(tmp_path / "q.safetensors", probe.weight, 0.0, {"names": "[]"})


def _jsonl(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "data.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = ['{"text": "good", "label": 1}', '{"text": "bad", "label": 0}'] * 2


@pytest.mark.parametrize("lines, message", [
    ([], "no examples"),
    (["", "  "], "no examples"),
    ([*GOOD, '{"label": 1}'], ":5: missing field 'text'"),
    ([*GOOD, '{"text": "x"}'], ":5: missing field 'label'"),
    ([GOOD[0], '{"text": "x", "label": 2}'], ":2: 'label' must be 0 or 1; got 2"),
    ([GOOD[0], '{"text": "x", "label": true}'], ":2: 'label' must be 0 or 1; got true"),
    ([GOOD[0], '{"text": "x", "label": "1"}'], ":2: 'label' must be 0 or 1"),
    ([GOOD[0], "", '{"text": "", "label": 1}'], ":3: 'text' must be a non-empty string"),
    ([GOOD[0], "{not json"], ":2: not valid JSON"),
    ([GOOD[0], "[1, 2]"], ":2: expected an object"),
    ([GOOD[0], GOOD[0], GOOD[0]], "only one class: all 3 rows read have label 1"),
    ([*GOOD[:3]], "1 row(s) with label 0"),
])
def test_bad_data_is_an_error_naming_the_line(tmp_path, lines, message):
    with pytest.raises(TrainError) as error:
        read_examples(_jsonl(tmp_path, *lines))
    assert message in str(error.value)


def test_limit_reads_only_the_first_rows(tmp_path):
    path = _jsonl(tmp_path, *GOOD, "", '{"broken')
    examples = read_examples(path, limit=4)
    assert examples.texts == ["good", "bad", "good", "bad"] and examples.lines == [1, 2, 3, 4]
    assert examples.labels.tolist() == [1, 0, 1, 0]


def test_help_explains_every_flag_and_layer_choice_is_exclusive():
    sub = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help"
    assert sub.parse_args(["--data", "d", "--out", "o.safetensors", "--layers", "all"]).layers == "all"
    assert sub.parse_args(["--data", "d", "--out", "o.safetensors", "--layers", "8,4,8"]).layers == [4, 8]
    with pytest.raises(SystemExit):
        sub.parse_args(["--data", "d", "--out", "o.safetensors", "--layer", "1", "--layers", "2"])


def test_importing_the_trainer_does_not_import_infer():
    code = ("import sys, omniscience, omniscience.train, omniscience.cli, omniscience.__main__; "
            "print([m for m in sys.modules if m == 'infer' or m.startswith('infer.')])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert result.stdout.strip() == "[]"


def test_written_metadata_round_trips(tmp_path):
    path = save_probe(tmp_path / "p.safetensors", torch.ones(4), 0.5, {"model": "m", "n_train": "10"})
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == {"model": "m", "n_train": "10"}
