"""Quantize / dequantize references (int8 per-channel symmetric, fp8 e4m3 per-tensor) and the references of the
quantized-weight linears (4-bit groups, 8-bit weights with block scales).

Signatures (the canonical kernel signatures of the `quantize` / `dequantize` ops):

    quantize(x, *, dtype: str, scale: Tensor | None, axis: int) -> (q, scale)
    dequantize(q, scale, *, axis: int, out_dtype: torch.dtype) -> Tensor

dtype "int8": one float32 scale per slice along `axis` (scale shape [x.shape[axis]]),
    scale = amax(|x|) / 127 over the other dims (1.0 for an all-zero slice),
    q = clamp(round_half_even(x / scale), -127, 127) as int8 (symmetric: -128 is never produced).
dtype "fp8_e4m3": one float32 scalar scale for the whole tensor (shape []), scale = amax(|x|) / 448
    (1.0 for an all-zero tensor), q = clamp(x / scale, -448, 448) rounded to nearest float8_e4m3fn;
    `axis` is ignored. Needs a torch build with float8_e4m3fn.
A given `scale` is used as is (same shape rules); dequantize computes q * scale in float32 and casts to
`out_dtype`. All arithmetic is float32, whatever x's dtype.
"""

from __future__ import annotations

import torch

QUANT_DTYPES = ("int8", "fp8_e4m3")
_INT8_MAX = 127.0


def _fp8_dtype() -> torch.dtype:
    dtype = getattr(torch, "float8_e4m3fn", None)
    if dtype is None:
        raise ValueError(f"fp8_e4m3 needs torch.float8_e4m3fn, which torch {torch.__version__} does not have")
    return dtype


def _channel_shape(x: torch.Tensor, axis: int) -> list[int]:
    shape = [1] * x.dim()
    shape[axis] = x.shape[axis]
    return shape


def _nonzero(scale: torch.Tensor) -> torch.Tensor:
    return torch.where(scale > 0, scale, torch.ones_like(scale))


def quantize(
    x: torch.Tensor, *, dtype: str = "int8", scale: torch.Tensor | None = None, axis: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize x to `dtype`; returns (q, scale) with x ~= q * scale."""
    xf = x.float()
    if dtype == "int8":
        axis = axis % x.dim()
        if scale is None:
            reduce_dims = [d for d in range(x.dim()) if d != axis]
            amax = xf.abs().amax(dim=reduce_dims) if reduce_dims else xf.abs()
            scale = _nonzero(amax / _INT8_MAX)
        elif scale.shape != (x.shape[axis],):
            raise ValueError(f"int8 scale must have shape ({x.shape[axis]},), got {tuple(scale.shape)}")
        scaled = xf / scale.float().reshape(_channel_shape(x, axis))
        return scaled.round().clamp(-_INT8_MAX, _INT8_MAX).to(torch.int8), scale.float()
    if dtype == "fp8_e4m3":
        fp8 = _fp8_dtype()
        fmax = torch.finfo(fp8).max
        if scale is None:
            scale = _nonzero(xf.abs().amax() / fmax)
        elif scale.dim() != 0:
            raise ValueError(f"fp8_e4m3 scale must be a scalar tensor, got shape {tuple(scale.shape)}")
        return (xf / scale.float()).clamp(-fmax, fmax).to(fp8), scale.float()
    raise ValueError(f"quantize dtype must be one of {QUANT_DTYPES}, got {dtype!r}")


def dequantize(
    q: torch.Tensor, scale: torch.Tensor, *, axis: int = 0, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Inverse of quantize: q * scale (per channel along `axis` for int8, per tensor for fp8)."""
    if q.dtype == torch.int8:
        axis = axis % q.dim()
        return (q.float() * scale.float().reshape(_channel_shape(q, axis))).to(out_dtype)
    if q.dtype == getattr(torch, "float8_e4m3fn", None):
        return (q.float() * scale.float()).to(out_dtype)
    raise ValueError(f"dequantize expects an int8 or float8_e4m3fn tensor, got {q.dtype}")


def unpack_int4(qweight: torch.Tensor) -> torch.Tensor:
    """[N, K/2] uint8 (even column in the low nibble) -> [N, K] int64 values in [0, 15]."""
    q = qweight.to(torch.int64)
    return torch.stack([q & 0xF, q >> 4], dim=-1).reshape(qweight.shape[0], -1)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """[N, K] integers in [0, 15] (K even) -> [N, K/2] uint8, the even column in the low nibble."""
    q = q.to(torch.int64)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)


def dequantize_int4(qweight: torch.Tensor, scales_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """The float32 weight [N, K] of a 4-bit group-quantized one: (q - 8) * scale + zero per group of columns."""
    sz = scales_zeros.float().transpose(0, 1)  # [N, K/group, 2]
    scale = sz[..., 0].repeat_interleave(group_size, dim=1)
    zero = sz[..., 1].repeat_interleave(group_size, dim=1)
    return (unpack_int4(qweight).float() - 8) * scale + zero


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                *, group_size: int) -> torch.Tensor:
    """The reference: the weight dequantized to float32, x in float32, the result in x's dtype."""
    w = dequantize_int4(qweight, scales_zeros, group_size)
    out = torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float())
    return out.to(x.dtype)


def expand_block_scales(scale: torch.Tensor, block_size: tuple[int, int], shape: tuple[int, int]) -> torch.Tensor:
    """Block scales [ceil(N/bn), ceil(K/bk)] as one float32 scale per element of an [N, K] weight."""
    bn, bk = block_size
    n, k = shape
    return scale.float().repeat_interleave(bn, dim=0)[:n].repeat_interleave(bk, dim=1)[:, :k]


def dequantize_w8(weight: torch.Tensor, scale: torch.Tensor, block_size: tuple[int, int]) -> torch.Tensor:
    """The float32 weight [N, K] of an 8-bit one: weight[n, k] * scale[n // bn, k // bk] for block_size (bn, bk)."""
    return weight.float() * expand_block_scales(scale, block_size, weight.shape)


def linear_w8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
              *, block_size: tuple[int, int]) -> torch.Tensor:
    """The reference: the weight dequantized to float32, x in float32, the result in x's dtype."""
    w = dequantize_w8(weight, scale, block_size)
    out = torch.nn.functional.linear(x.float(), w, None if bias is None else bias.float())
    return out.to(x.dtype)
