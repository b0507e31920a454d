"""Kernels composed of other ops' call sites: where a fused op's fused kernel does not apply (a prefill's many
rows, a CPU, a small weight), its callers still make one call, and each part runs the kernel layerzero picks for
that part, exactly as if the caller had made the two calls.

`composed.gated_linear`: `linear`, then `silu_and_mul` or `gelu_and_mul`, through bound sites of this module (one
per part, shared by every caller: a site re-binds only when the call's shapes change)."""

from __future__ import annotations

import functools
from typing import Any

import torch

from layerzero.kernels.reference.activation import GATED_ACTIVATIONS
from layerzero.select.kernel_spec import KernelSpec

PRIORITY = 30  # above the reference (10), below any fused kernel


@functools.cache
def _sites() -> dict[str, Any]:
    from layerzero.dispatch.bound import bind  # late: dispatch reaches this module through the registry

    return {"linear": bind("linear"), "silu": bind("silu_and_mul"), "gelu": bind("gelu_and_mul")}


def gated_linear(x: torch.Tensor, weight: torch.Tensor, *, activation: str) -> torch.Tensor:
    """act(x @ weight[:I].T) * (x @ weight[I:].T) as `linear` and the gated activation op."""
    if activation not in GATED_ACTIVATIONS:
        raise ValueError(f"activation must be one of {GATED_ACTIVATIONS}, got {activation!r}")
    sites = _sites()
    gate_up = sites["linear"](x, weight, None)
    if activation == "silu":
        return sites["silu"](gate_up)
    return sites["gelu"](gate_up, approximate="tanh" if activation == "gelu_tanh" else "none")


def kernel_specs() -> list[KernelSpec]:
    return [KernelSpec("composed.gated_linear", "gated_linear", "composed", gated_linear, "1", graph_safe=True,
                       priority=PRIORITY)]
