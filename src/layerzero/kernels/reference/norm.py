"""RMSNorm and LayerNorm references, computed in float32 and cast back to the input dtype."""

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float) -> torch.Tensor:
    w = weight.float() if weight_offset == 0.0 else weight.float() + weight_offset
    return F.rms_norm(x.float(), (x.shape[-1],), w, eps).to(x.dtype)


def fused_add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, weight_offset: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """(norm(x + residual) in x's dtype, x + residual in the wider of the two): bf16 rows added to a float32 residual
    stream come back normed in bf16, for the next bf16 matmul (a CPU bf16 model's prefill), the stream in float32."""
    summed = x + residual
    return rms_norm(summed, weight, eps, weight_offset).to(x.dtype), summed


def layer_norm(
    x: torch.Tensor,
    normalized_shape: tuple[int, ...],
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> torch.Tensor:
    return F.layer_norm(x.float(), normalized_shape, weight, bias, eps).to(x.dtype)
