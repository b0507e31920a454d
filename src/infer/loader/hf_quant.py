"""HF checkpoints stored with 8-bit weights: read `quantization_config`, pair each weight with its scales.

Two formats (docs/quantization.md):
- FP8 blocks (`quant_method: fp8`, `fmt: e4m3`, `weight_block_size: [bn, bk]`): `weight` float8_e4m3fn and
  `weight_scale_inv` float32 [ceil(N/bn), ceil(K/bk)], multiplied despite its name (the Qwen3-8B-FP8 format);
- compressed-tensors (`quant_method: compressed-tensors`, `format: int-quantized` or `float-quantized`, for the
  checkpoint or per config group, 8-bit symmetric weights with `strategy: channel`, `tensor` or `block` with its
  `block_structure`): `weight` int8 / float8_e4m3fn and `weight_scale` [N, 1], one value or per block (the
  Qwen3-8B.w8a8, FP8-dynamic and FP8-block formats). Activations stay unquantized: an
  `input_scale` for static activation quantization is read past (weight-only), and zero points must be zero.
A tensor stored in 16 or 32 bits (norms, embeddings, a head the quantizer ignored) loads as any other.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from layerzero import W8_DTYPES, dequantize_w8

# Per-weight tensors the weight-only kernels do not read: static activation scales.
ACTIVATION_SUFFIXES = (".input_scale", ".input_zero_point")


class W8Tensor(NamedTuple):
    """One checkpoint weight [N, K] kept 8-bit with its float32 scales [ceil(N/bn), ceil(K/bk)]."""

    weight: torch.Tensor
    scale: torch.Tensor
    block_size: tuple[int, int]

    @property
    def shape(self) -> torch.Size:
        """The float weight's shape."""
        return self.weight.shape

    def dequantize(self, dtype: torch.dtype) -> torch.Tensor:
        return dequantize_w8(self.weight, self.scale, self.block_size).to(dtype)


@dataclass(frozen=True)
class CheckpointQuant:
    """How a checkpoint stores its quantized weights: the scale tensor's suffix and the scales' granularity."""

    method: str
    scale_suffix: str  # "weight_scale_inv" or "weight_scale", beside "<module>.weight"
    strategy: str  # "block", "channel" or "tensor"
    block: tuple[int, int] | None = None  # for "block"

    def block_size(self, shape: torch.Size) -> tuple[int, int]:
        n, k = shape
        return {"block": self.block, "channel": (1, k), "tensor": (n, k)}[self.strategy]


def _need(cond: bool, path: str, field: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{path}: config.json quantization_config.{field} {message} (docs/quantization.md)")


def parse_quant_config(qc: dict[str, Any], path: str) -> CheckpointQuant:
    """The checkpoint's scheme, or a ValueError naming the quantization_config field we cannot load."""
    method = qc.get("quant_method")
    if method == "fp8":
        _need(qc.get("fmt", "e4m3") == "e4m3", path, "fmt", f"is {qc.get('fmt')!r}; only 'e4m3' is supported")
        block = qc.get("weight_block_size")
        _need(isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block),
              path, "weight_block_size", f"is {block!r}; FP8 checkpoints need two positive block sizes [rows, cols]")
        return CheckpointQuant("fp8", "weight_scale_inv", "block", (block[0], block[1]))
    if method == "compressed-tensors":
        groups = qc.get("config_groups") or {}
        _need(isinstance(groups, dict) and len(groups) >= 1, path, "config_groups", "is missing or empty")
        schemes = set()
        for name, group in groups.items():
            group = group or {}
            fmt = group.get("format", qc.get("format"))  # a group's own format wins over the checkpoint's
            where = f"config_groups.{name}.format" if "format" in group else "format"
            _need(fmt in ("int-quantized", "float-quantized"), path, where,
                  f"is {fmt!r}; supported: 'int-quantized', 'float-quantized' (8-bit weights)")
            weights = group.get("weights") or {}
            field = f"config_groups.{name}.weights"
            kind = "int" if fmt == "int-quantized" else "float"
            _need(weights.get("num_bits") == 8 and weights.get("type", kind) == kind, path, field,
                  f"is {weights.get('num_bits')}-bit {weights.get('type')!r}; only 8-bit {kind} weights are supported")
            _need(weights.get("symmetric", True), path, f"{field}.symmetric", "is false; only symmetric weights")
            strategy = weights.get("strategy")
            _need(strategy in ("channel", "tensor", "block"), path, f"{field}.strategy",
                  f"is {strategy!r}; supported: 'channel', 'tensor', 'block'")
            block = None
            if strategy == "block":
                block = weights.get("block_structure")
                _need(isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block),
                      path, f"{field}.block_structure", f"is {block!r}; block scales need [rows, cols]")
                block = (block[0], block[1])
            schemes.add((strategy, block))
        _need(len(schemes) == 1, path, "config_groups", f"mix weight scale layouts {sorted(map(str, schemes))}")
        strategy, block = schemes.pop()
        return CheckpointQuant("compressed-tensors", "weight_scale", strategy, block)
    raise ValueError(f"{path}: config.json quantization_config.quant_method {method!r} is not supported; "
                     "supported: 'fp8' (block-wise e4m3), 'compressed-tensors' (8-bit int or float weights), or a GGUF "
                     "file (docs/quantization.md)")


def pair_scales(name: str, weight: torch.Tensor, quant: CheckpointQuant,
                get: Callable[[str], torch.Tensor | None]) -> W8Tensor:
    """An 8-bit weight with its scales (read through `get`); a missing or misshapen scale, or a nonzero zero
    point, fails naming the tensor."""
    module = name.removesuffix(".weight")
    scale_name = f"{module}.{quant.scale_suffix}"
    if not name.endswith(".weight") or weight.dim() != 2:
        raise ValueError(f"tensor {name!r} is stored as {weight.dtype} but is not a 2-D linear weight")
    scale = get(scale_name)
    if scale is None:
        raise ValueError(f"tensor {name!r} is stored as {weight.dtype} but its scales {scale_name!r} are missing")
    bn, bk = quant.block_size(weight.shape)
    expected = (-(-weight.shape[0] // bn), -(-weight.shape[1] // bk))
    # per-channel scales come as [N, 1] or [N], a per-tensor scale as [], [1] or [1, 1]
    fits = tuple(scale.shape) == expected or (scale.dim() < 2 and scale.numel() == expected[0] * expected[1])
    if not fits:
        raise ValueError(f"scale tensor {scale_name!r} has shape {tuple(scale.shape)}, expected {list(expected)} "
                         f"for weight {name!r} {tuple(weight.shape)} ({quant.strategy} scales)")
    zero = get(f"{module}.weight_zero_point")
    if zero is not None and bool(zero.ne(0).any()):
        raise ValueError(f"tensor {module}.weight_zero_point is nonzero: only symmetric weights are supported")
    return W8Tensor(weight.contiguous(), scale.float().reshape(expected).contiguous(), (bn, bk))


def is_auxiliary(name: str, quant: CheckpointQuant) -> bool:
    """A scale or zero point (read with its weight) or an activation scale (not used): not loaded on its own."""
    return name.endswith((f".{quant.scale_suffix}", ".weight_zero_point", *ACTIVATION_SUFFIXES))


def check_scales_used(names: Iterable[str], paired: set[str], quant: CheckpointQuant) -> None:
    """Fail naming any scale tensor whose weight was not stored 8-bit (a checkpoint we would misread)."""
    stray = sorted(n for n in names if n.endswith(f".{quant.scale_suffix}")
                   and f"{n.removesuffix('.' + quant.scale_suffix)}.weight" not in paired)
    if stray:
        raise ValueError(f"scale tensors whose weights are not 8-bit: {', '.join(stray[:10])}")
