"""Linear weights kept 4-bit: `Int4Weight` holds what `lz.linear_int4` reads, a `LinearSite` routes one projection's
matmul to its bound dense or 4-bit op, and `quantize_linears` turns a loaded model's float linear weights 4-bit (docs/quantization.md)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import layerzero as lz
from layerzero.kernels.reference.quantize import dequantize_int4, pack_int4


class Int4Weight(nn.Module):
    """A linear weight [N, K] as 4-bit values and per-group scales and zeros: w = (q - 8) * scale + zero."""

    def __init__(self, qweight: torch.Tensor, scales_zeros: torch.Tensor, group_size: int) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)  # [N, K/2] uint8, the even column in the low nibble
        self.register_buffer("scales_zeros", scales_zeros)  # [K/group_size, N, 2] float32
        self.group_size = group_size

    @property
    def shape(self) -> tuple[int, int]:
        return self.qweight.shape[0], 2 * self.qweight.shape[1]

    @classmethod
    def from_groups(cls, q: np.ndarray, scale: np.ndarray, zero: np.ndarray, group_size: int,
                    device: torch.device) -> Int4Weight:
        """From values [N, K] in 0..15 and scales / zeros [N, K / group_size]."""
        sz = torch.from_numpy(np.stack([scale, zero], axis=-1).astype(np.float32)).transpose(0, 1).contiguous()
        return cls(pack_int4(torch.from_numpy(q)).to(device), sz.to(device), group_size)

    @classmethod
    def quantize(cls, w: torch.Tensor, group_size: int = 32) -> Int4Weight:
        """Asymmetric round-to-nearest per group of columns: scale = (max - min) / 15, q = round((w - min) / scale)."""
        n, k = w.shape
        if k % group_size:
            raise ValueError(f"a weight of {k} columns does not split into groups of {group_size}")
        g = w.detach().float().reshape(n, k // group_size, group_size)
        low, high = g.amin(dim=-1), g.amax(dim=-1)
        scale = ((high - low) / 15).clamp(min=1e-12)
        q = ((g - low[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8).reshape(n, k)
        sz = torch.stack([scale, low + 8 * scale], dim=-1).transpose(0, 1).contiguous()
        return cls(pack_int4(q), sz, group_size)

    def dequantize(self) -> torch.Tensor:
        return dequantize_int4(self.qweight, self.scales_zeros, self.group_size)


class LinearSite:
    """One projection's matmul: x @ weight.T (+ bias) through a bound `linear_int4` for a 4-bit weight, `linear` otherwise."""

    __slots__ = ("dense", "int4")

    def __init__(self) -> None:
        self.dense = lz.bind("linear")
        self.int4 = lz.bind("linear_int4")

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, Int4Weight):
            return self.int4(x, weight.qweight, weight.scales_zeros, bias, group_size=weight.group_size)
        return self.dense(x, weight, bias)


def replace_weight(model: nn.Module, name: str, weight: Int4Weight) -> None:
    """Put `weight` where the float parameter `name` (e.g. "blocks.0.attn.qkv_proj") was."""
    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner)
    del module._parameters[attr]
    module.add_module(attr, weight)


def quantize_linears(model: nn.Module, names: list[str], group_size: int = 32) -> None:
    """Weight-only 4-bit quantization of the named float linear weights, in place."""
    params = dict(model.named_parameters())
    for name in names:
        replace_weight(model, name, Int4Weight.quantize(params[name], group_size))
