"""Fitting a linear probe: L2-regularized logistic regression on residuals, scored and saved as a probe file.

Pure torch, no `infer`: `python -m omniscience train` (omniscience/cli.py) collects the activations and
calls these. The fit standardizes each feature (the residual stream has a few huge-magnitude dimensions that
would otherwise dominate the penalty and the conditioning), then folds the standardization back, so the saved
probe is `sigmoid(weight . h + bias)` on the raw `blocks.{layer}.resid_post`, exactly what the runtime computes.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
import yaml
from safetensors.torch import save_file

RESERVED_METADATA = ("names",)  # a `names` entry would make omniscience.weights read the file as a bank


@dataclass(frozen=True)
class LogisticProbe:
    """A fitted probe: `coef`/`intercept` act on standardized features, `weight`/`bias` on raw residuals."""

    mean: torch.Tensor  # [H] float64: per-feature mean of the training rows
    scale: torch.Tensor  # [H] float64: per-feature std (1 where a feature is constant)
    coef: torch.Tensor  # [H] float64: weights on (x - mean) / scale
    intercept: float
    weight: torch.Tensor  # [H] float32: coef / scale, the probe file's `weight`
    bias: float  # intercept - weight . mean, the probe file's `bias`
    loss: float  # the final penalized training loss (mean log loss + l2 / 2 * |coef|^2)

    def logits_standardized(self, x: torch.Tensor) -> torch.Tensor:
        """Logits of the model as fitted (float64), for checking the folding."""
        return ((x.double() - self.mean) / self.scale) @ self.coef + self.intercept

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits with the folded raw-space weights (float64): what a served probe computes before its sigmoid."""
        return x.double() @ self.weight.double() + self.bias

    def predict_proba(self, x: torch.Tensor) -> torch.Tensor:
        """P(label = 1) for rows of raw residuals [N, H]."""
        return torch.sigmoid(self.logits(x))


def fit_logistic(x: torch.Tensor, y: torch.Tensor, l2: float = 1e-2, max_iter: int = 500,
                 tolerance: float = 1e-9) -> LogisticProbe:
    """Fit `P(y=1|x) = sigmoid(w . x + b)` by L-BFGS on standardized features (float64), with an L2 penalty
    `l2 / 2 * |coef|^2` on the standardized weights (not the intercept), and fold the scaling back into w, b."""
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"fit_logistic needs x [N, H] and y [N]; got {tuple(x.shape)} and {tuple(y.shape)}")
    if l2 < 0:
        raise ValueError(f"l2 must be >= 0; got {l2}")
    target = y.double()
    if not bool(((target == 0) | (target == 1)).all()):
        raise ValueError("labels must be 0 or 1")
    if target.min() == target.max():
        raise ValueError("labels hold only one class; a probe needs examples of both")
    features = x.double()
    mean = features.mean(0)
    scale = features.std(0, unbiased=False)
    scale = torch.where(scale > 1e-12 * scale.max().clamp_min(1e-300), scale, torch.ones_like(scale))
    z = (features - mean) / scale
    prior = target.mean().item()
    coef = torch.zeros(x.shape[1], dtype=torch.float64, requires_grad=True)
    intercept = torch.tensor(math.log(prior / (1 - prior)), dtype=torch.float64, requires_grad=True)
    optimizer = torch.optim.LBFGS([coef, intercept], lr=1, max_iter=max_iter, tolerance_grad=tolerance,
                                  tolerance_change=tolerance * 1e-3, history_size=20, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(z @ coef + intercept, target) + 0.5 * l2 * coef.pow(2).sum()

    def closure() -> torch.Tensor:
        optimizer.zero_grad()
        loss = objective()
        loss.backward()
        return loss

    with torch.enable_grad():  # callers may hold no_grad; inference_mode tensors are copied by the casts above
        optimizer.step(closure)
    with torch.no_grad():
        final = float(objective())
        coef_, intercept_ = coef.detach().clone(), float(intercept)
        weight = (coef_ / scale).float()  # rounded first, so the bias absorbs the rounding at the mean
        bias = intercept_ - float(weight.double() @ mean)
    return LogisticProbe(mean, scale, coef_, intercept_, weight, bias, final)


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Area under the ROC curve, by ranks (Mann-Whitney U): P(positive scores above negative), ties count 1/2."""
    scores, labels = scores.reshape(-1).double(), labels.reshape(-1)
    if scores.shape != labels.shape:
        raise ValueError(f"{scores.numel()} scores for {labels.numel()} labels")
    positive = labels == 1
    n_pos, n_neg = int(positive.sum()), int((~positive).sum())
    if n_pos == 0 or n_neg == 0:
        raise ValueError("AUC needs both classes among the labels")
    _, inverse, counts = torch.unique(scores, sorted=True, return_inverse=True, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts  # 0-based rank of each distinct value's first element
    mean_rank = starts.double() + (counts.double() + 1) / 2  # 1-based average rank of the tied group
    rank_sum = mean_rank[inverse][positive].sum().item()
    return (rank_sum - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg)


def accuracy(probabilities: torch.Tensor, labels: torch.Tensor, threshold: float = 0.5) -> float:
    """Fraction of rows whose `probability > threshold` matches the 0/1 label."""
    return float(((probabilities > threshold).long() == labels.long()).double().mean())


def split(n: int, holdout_fraction: float, seed: int = 0,
          labels: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(train, held-out) row indices, ascending, the same for the same arguments; with `labels`, stratified:
    each class contributes round(fraction * its count) held-out rows (at least one, and never all of them)."""
    if not 0 < holdout_fraction < 1:
        raise ValueError(f"holdout fraction must be between 0 and 1 (exclusive); got {holdout_fraction}")
    generator = torch.Generator().manual_seed(seed)
    groups = [torch.arange(n)] if labels is None else [torch.nonzero(labels == c).reshape(-1) for c in labels.unique()]
    train, heldout = [], []
    for rows in groups:
        if len(rows) < 2:
            raise ValueError(f"cannot hold out part of a class of {len(rows)} row(s); every class needs at least 2")
        take = min(max(round(holdout_fraction * len(rows)), 1), len(rows) - 1)
        shuffled = rows[torch.randperm(len(rows), generator=generator)]
        heldout.append(shuffled[:take])
        train.append(shuffled[take:])
    return torch.cat(train).sort().values, torch.cat(heldout).sort().values


def save_probe(path: str | Path, weight: torch.Tensor, bias: float, metadata: dict[str, str] | None = None) -> Path:
    """Write a one-probe safetensors file (`weight` float32 [H], `bias` float32 []) that omniscience loads."""
    weight = weight.detach().reshape(-1).to(torch.float32).contiguous().cpu()
    bias_tensor = torch.tensor(float(bias), dtype=torch.float32)
    if not (torch.isfinite(weight).all() and torch.isfinite(bias_tensor)):
        raise ValueError("probe weight or bias holds NaN or Inf")
    metadata = dict(metadata or {})
    for key, value in metadata.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise TypeError(f"metadata must map str to str; got {key!r}: {value!r}")
    reserved = sorted(set(metadata) & set(RESERVED_METADATA))
    if reserved:
        raise ValueError(f"metadata key(s) {', '.join(reserved)} are reserved (they mark a bank of probes)")
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({"weight": weight, "bias": bias_tensor}, str(path), metadata=metadata)
    return path


def write_probe_yaml(path: str | Path, name: str, layer: int, weight_path: str | Path,
                     activation: str = "sigmoid") -> Path:
    """A one-entry probe-set YAML pointing at `weight_path` (relative to the YAML's folder when it can be)."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    target = Path(weight_path).expanduser().resolve()
    try:
        shown = Path(os.path.relpath(target, path.parent.resolve()))
    except ValueError:  # another drive (Windows)
        shown = target
    entry = {"name": name, "layer": int(layer), "weight_path": shown.as_posix(), "activation": activation}
    path.write_text(yaml.safe_dump({"probes": [entry]}, sort_keys=False))
    return path
