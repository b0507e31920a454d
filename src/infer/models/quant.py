"""Linear weights kept quantized: `Int4Weight` holds what `lz.linear_int4` reads, `W8Weight` what `lz.linear_w8` reads,
a `LinearSite` routes one projection's matmul to its bound dense, 4-bit or 8-bit op, and `quantize_linears` quantizes a
loaded model's float linear weights (docs/quantization.md)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

import layerzero as lz
from layerzero import dequantize_int4, dequantize_int4_rows, dequantize_w8, expand_block_scales, pack_int4


W8_FORMATS = {"int8": (torch.int8, 127.0), "fp8": (torch.float8_e4m3fn, 448.0)}
FP8_BLOCK = (128, 128)  # the block of FP8 checkpoints (and of "fp8" quantization at load)


class QuantWeight(nn.Module):
    """A linear weight kept quantized; `shape` is the float weight's [N, K], `dequantize()` gives it in float32."""

    @property
    def shape(self) -> tuple[int, int]:
        raise NotImplementedError

    def dequantize(self) -> torch.Tensor:
        raise NotImplementedError


class W8Weight(QuantWeight):
    """A linear weight [N, K] as int8 or float8_e4m3fn values with block scales: w = weight * scale[n // bn, k // bk]."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int]) -> None:
        super().__init__()
        self.register_buffer("weight", weight)  # [N, K] int8 / float8_e4m3fn
        self.register_buffer("scale", scale)  # [ceil(N/bn), ceil(K/bk)] float32
        self.block_size = block_size

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    @classmethod
    def quantize(cls, w: torch.Tensor, fmt: str) -> W8Weight:
        """Symmetric round-to-nearest: "int8" one scale per output row, "fp8" one per 128 x 128 block."""
        dtype, qmax = W8_FORMATS[fmt]
        n, k = w.shape
        bn, bk = (1, k) if fmt == "int8" else FP8_BLOCK
        wf = w.detach().float()
        padded = torch.zeros(-(-n // bn) * bn, -(-k // bk) * bk, device=w.device)
        padded[:n, :k] = wf
        amax = padded.view(padded.shape[0] // bn, bn, -1, bk).abs().amax(dim=(1, 3))
        scale = (amax / qmax).clamp(min=1e-12)
        q = (wf / expand_block_scales(scale, (bn, bk), (n, k))).clamp(-qmax, qmax)
        return cls((q.round() if fmt == "int8" else q).to(dtype), scale.contiguous(), (bn, bk))

    def dequantize(self) -> torch.Tensor:
        return dequantize_w8(self.weight, self.scale, self.block_size)


class Int4Weight(QuantWeight):
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


class HalfWeight(QuantWeight):
    """A linear weight kept in bfloat16 while the model computes in float32 (`--dtype bfloat16` on the CPU): a matmul
    streams half the bytes of a float32 weight's, and every other op keeps its float32 kernel. layerzero multiplies
    float32 x by it: a few rows (decode) through `native.linear_bf16_cpu`, exact float32 products of the bf16 values;
    more rows through a bf16 GEMM (AMX's, else oneDNN's), the rows rounded to bf16, which a block then hands over in
    bf16 and keeps in bf16 between its projections (`Block.half_rows`; docs/engine.md, "bfloat16 on the CPU")."""

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("weight", weight)

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)

    def dequantize(self) -> torch.Tensor:
        return self.weight.float()


class Int4Experts(nn.Module):
    """Stacked experts' weights [E, N, K] kept as 4-bit groups, the form `lz.fused_moe_int4` takes: qweight
    [E, N, K/2] (column 2j in the low nibble of byte j), scales [2, E, N, K/group] float32, w = q * scale + offset."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, group_size: int) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.group_size = group_size

    @property
    def shape(self) -> tuple[int, int, int]:
        e, n, half = self.qweight.shape
        return e, n, 2 * half

    @classmethod
    def from_groups(cls, experts: list[tuple[np.ndarray, np.ndarray, np.ndarray]], group_size: int,
                    device: torch.device) -> Int4Experts:
        """From each expert's (values [N, K] in 0..15, scale, zero [N, K / group_size]) with w = (q - 8) * scale +
        zero, the checkpoint's 4-bit groups."""
        q = torch.stack([pack_int4(torch.from_numpy(v)) for v, _, _ in experts])
        scale = torch.from_numpy(np.stack([s for _, s, _ in experts]).astype(np.float32))
        offset = torch.from_numpy(np.stack([z for _, _, z in experts]).astype(np.float32)) - 8 * scale
        return cls(q.to(device), torch.stack([scale, offset]).to(device), group_size)

    def dequantize(self) -> torch.Tensor:
        return torch.stack([dequantize_int4_rows(q, self.scales[:, e], self.group_size)
                            for e, q in enumerate(self.qweight)])


class W8Experts(nn.Module):
    """Stacked experts' weights [E, N, K] kept as int8 or float8_e4m3fn with block scales [E, ceil(N/bn),
    ceil(K/bk)], the form `lz.fused_moe_w8` takes."""

    def __init__(self, weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int]) -> None:
        super().__init__()
        self.register_buffer("weight", weight)
        self.register_buffer("scale", scale)
        self.block_size = block_size

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.weight.shape)

    @classmethod
    def quantize(cls, stack: torch.Tensor) -> W8Experts:
        """float8_e4m3fn in 128 x 128 blocks, each expert as `W8Weight.quantize(w, "fp8")` rounds a weight."""
        parts = [W8Weight.quantize(w, "fp8") for w in stack]
        return cls(torch.stack([p.weight for p in parts]), torch.stack([p.scale for p in parts]), FP8_BLOCK)

    def dequantize(self) -> torch.Tensor:
        return torch.stack([dequantize_w8(w, s, self.block_size) for w, s in zip(self.weight, self.scale)])

    def per_row(self) -> W8Experts:
        """The same weights with one scale per row and block of columns (each block's scale repeated over its rows):
        the form two stacks whose row blocks differ share (gate and up rows that do not fill a block)."""
        bn, bk = self.block_size
        rows = self.weight.shape[1]
        return W8Experts(self.weight, self.scale.repeat_interleave(bn, dim=1)[:, :rows].contiguous(), (1, bk))


ExpertStack = Int4Experts | W8Experts


class LinearSite:
    """One projection's matmul: x @ weight.T (+ bias) through a bound `linear_int4` for a 4-bit weight, `linear_w8`
    for an 8-bit one, `linear` otherwise (a `HalfWeight`'s bf16 weight with float32 x)."""

    __slots__ = ("dense", "int4", "w8")

    def __init__(self) -> None:
        self.dense = lz.bind("linear")
        self.int4 = lz.bind("linear_int4")
        self.w8 = lz.bind("linear_w8")

    def __call__(self, x: torch.Tensor, weight: torch.Tensor | QuantWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
        if isinstance(weight, W8Weight):
            return self.w8(x, weight.weight, weight.scale, bias, block_size=weight.block_size)
        if isinstance(weight, Int4Weight):
            return self.int4(x, weight.qweight, weight.scales_zeros, bias, group_size=weight.group_size)
        if isinstance(weight, HalfWeight):
            return self.dense(x, weight.weight, bias)  # float32 x, bf16 weight: layerzero's bf16-weight kernels
        return self.dense(x, weight, bias)


def replace_weight(model: nn.Module, name: str, weight: QuantWeight | ExpertStack) -> None:
    """Put `weight` where the float parameter `name` (e.g. "blocks.0.attn.qkv_proj") was."""
    owner, _, attr = name.rpartition(".")
    module = model.get_submodule(owner)
    del module._parameters[attr]
    module.add_module(attr, weight)


def hold_linears_in(model: nn.Module, names: list[str], dtype: torch.dtype) -> None:
    """Keep the named float linear weights as `HalfWeight`s in `dtype`, one at a time (each float32 copy is freed as
    its half replaces it); weights already kept quantized stay as they are."""
    params = dict(model.named_parameters(remove_duplicate=False))  # a tied head is the embedding's second name
    for name in names:
        w = params.pop(name, None)
        if w is not None and w.is_floating_point() and w.dtype != dtype:
            replace_weight(model, name, HalfWeight(w.detach().to(dtype)))


def quantize_linears(model: nn.Module, names: list[str], method: str) -> None:
    """Weight-only quantization of the named float linear weights, in place: "int4" (groups of 32), "int8" (per
    output row) or "fp8" (128 x 128 blocks)."""
    for name in names:  # one weight at a time: each float weight is freed once its quantized copy replaces it
        w = model.get_parameter(name)
        replace_weight(model, name, Int4Weight.quantize(w) if method == "int4" else W8Weight.quantize(w, method))
