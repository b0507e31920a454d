"""The logit transforms of a sampling step, in the order every sampler applies them (the torch sampler,
sampling/sampler.py, and the MLX one, runners/mlx/sampler.py, each supply one function per name; `run` applies them).

Before the greedy argmax, every row: the repetition penalty (transformers' rule over the tokens a row has seen), then
the adjustments (logit_bias, presence and frequency penalties, end-of-sequence ids held back while min_tokens holds).
Then, for the rows that sample: the temperature, min-p (relative to the row's largest probability), top-k and top-p.
A function leaves the logits as they are when no row of the step uses it. Torch-free."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, TypeVar

Logits = TypeVar("Logits")

BEFORE_GREEDY = ("repetition_penalty", "adjustments")
SAMPLED_ONLY = ("temperature", "min_p", "top_k_top_p")
Transform = Callable[[Any, Any, Any], Any]  # (logits, the step's sampling rows, seen-token mask or None) -> logits


def run(names: tuple[str, ...], transforms: Mapping[str, Transform], logits: Logits, rows: object,
        seen: object = None) -> Logits:
    """Apply the named transforms of a backend's table to `logits`, in the order named."""
    for name in names:
        logits = transforms[name](logits, rows, seen)
    return logits


def check_table(transforms: Mapping[str, Transform]) -> Mapping[str, Transform]:
    """A backend's table, checked to name every transform (and nothing else) at import."""
    if set(transforms) != set(BEFORE_GREEDY + SAMPLED_ONLY):
        raise ValueError(f"a sampler's transforms must be exactly {BEFORE_GREEDY + SAMPLED_ONLY}, got {tuple(transforms)}")
    return transforms
