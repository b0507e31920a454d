"""Rotary position embedding reference (neox half-split or GPT-J interleaved pairs)."""

import torch


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """x: [T, H, D]; cos/sin: [T, D/2] (float32). Rotation is done in float32."""
    xf = x.float()
    c, s = cos.float().unsqueeze(-2), sin.float().unsqueeze(-2)
    if interleaved:
        x1, x2 = xf[..., 0::2], xf[..., 1::2]
        out = torch.stack((torch.addcmul(x1 * c, x2, s, value=-1), torch.addcmul(x2 * c, x1, s)), dim=-1).flatten(-2)
    else:
        x1, x2 = xf.chunk(2, dim=-1)
        out = torch.cat((torch.addcmul(x1 * c, x2, s, value=-1), torch.addcmul(x2 * c, x1, s)), dim=-1)
    return out.to(x.dtype)
