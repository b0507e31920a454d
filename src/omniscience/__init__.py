"""omniscience: linear probes on the residual stream, computed inside the forward pass (CUDA-graph safe).

The package imports nothing from `infer`: a runtime hands it the residual tensors (through the taps it
installs at `blocks.{layer}.resid_post`) and maps score rows to its requests itself. `python -m omniscience
train` is the one exception: a command-line application that drives infer to collect activations.
"""

from omniscience.bank import ProbeBank, ProbeLayout, ProbeTap
from omniscience.config import ProbeConfig, ProbeError, ProbeSetConfig, read_config
from omniscience.weights import Probe, ProbeSet, load_probe_set

__all__ = [
    "Probe", "ProbeBank", "ProbeConfig", "ProbeError", "ProbeLayout", "ProbeSet", "ProbeSetConfig", "ProbeTap",
    "load_probe_set", "read_config",
]
