"""Gated activations: act(x[..., :I]) * x[..., I:] for a fused gate/up projection output."""

import torch
import torch.nn.functional as F

GATED_ACTIVATIONS = ("silu", "gelu", "gelu_tanh")  # gated_linear's: SwiGLU, GeGLU (erf), GeGLU (tanh)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def gelu_and_mul(x: torch.Tensor, approximate: str) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.gelu(gate, approximate=approximate) * up


def gated_linear(x: torch.Tensor, weight: torch.Tensor, *, activation: str) -> torch.Tensor:
    """The gated MLP's first half: the gate+up projection (weight [2I, K]), then its gated activation."""
    gate_up = F.linear(x, weight)
    if activation == "silu":
        return silu_and_mul(gate_up)
    return gelu_and_mul(gate_up, "tanh" if activation == "gelu_tanh" else "none")
