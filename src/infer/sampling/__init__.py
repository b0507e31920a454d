"""Token sampling: per-request parameters, the batched sampler, its counter-based noise, stop strings."""

from infer.sampling.params import SamplingParams
from infer.sampling.random import uniform
from infer.sampling.sampler import (
    SamplingTensors,
    apply_repetition_penalty,
    argmax_rows,
    filter_top_k_top_p,
    sample,
)
from infer.sampling.stop import StopChecker

__all__ = [
    "SamplingParams",
    "SamplingTensors",
    "StopChecker",
    "apply_repetition_penalty",
    "argmax_rows",
    "filter_top_k_top_p",
    "sample",
    "uniform",
]
