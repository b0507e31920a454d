"""Weight-only linears on the CPU through torch's packed kernels: 4-bit groups (`_weight_int4pack_mm_for_cpu`) and
int8 with per-channel scales (`_weight_int8pack_mm`).

The kernel reads each weight in its own blocked layout, so a weight is converted once, on first use, and the
converted copy is kept while the weight lives (kernels/weight_cache.py, as oneDNN's packed weights are).
It multiplies in bfloat16, which is where the speed comes from on the CPU (float32 activations make it 10-30x
slower), and takes its scales and zeros in bfloat16. Two corrections keep a GGUF model's answers those of its
dequantized float32 self (top-1 agreement 98.3% -> 99.4% on SmolLM2, docs/quantization.md):
- a float32 x runs as two bfloat16 passes, x_hi = bf16(x) and x_lo = bf16(x - x_hi): 16 bits of mantissa (the
  two stacked as rows of one call, so the weight is read once);
- a zero (a group's offset, often far larger than its step) rounded to bfloat16 would shift every weight of its
  group, so the kernel gets zeros of 0 and the offsets are added in float32: the sum over groups of
  zero[g] * (x summed over group g), a matmul of K / group_size columns.
Groups of 32 or more columns. Every step is row by row (the kernel, and the offsets as a batched product of one
row each rather than a matmul whose blocking depends on the row count), so a row's result does not depend on what
shares its call: a request decodes the same tokens alone or in any batch.
The int8 kernel reads the weight as it is stored and takes the same two bfloat16 passes; its scales are applied
in float32 after the kernel (the kernel gets scales of 1), so a scale is never rounded to bfloat16.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from layerzero.kernels.reference.quantize import unpack_int4
from layerzero.kernels.weight_cache import WeightCache
from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CONSTRAINT_FAILED, NOT_INSTALLED, Reason

PRIORITY = 60  # above the reference (dequantize, then a float32 matmul)


class _Converted(NamedTuple):
    packed: torch.Tensor  # the kernel's blocked layout of the 4-bit values
    scales: torch.Tensor  # [K/group, N, 2] bfloat16 as the kernel takes them, zeros 0
    zeros: torch.Tensor  # [K/group, N] float32


def _convert(qweight: torch.Tensor, scales_zeros: torch.Tensor) -> _Converted:
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_int4(qweight).to(torch.int32), 1)
    scales = torch.stack([scales_zeros[..., 0], torch.zeros_like(scales_zeros[..., 0])], dim=-1)
    return _Converted(packed, scales.to(torch.bfloat16).contiguous(), scales_zeros[..., 1].float().contiguous())


CONVERTED: WeightCache[_Converted] = WeightCache()  # by the identity of qweight


def _bf16_passes(rows: torch.Tensor) -> torch.Tensor:
    """x as bfloat16 rows; a float32 x as two passes stacked, x_hi = bf16(x) then x_lo = bf16(x - x_hi)."""
    high = rows.to(torch.bfloat16)
    if rows.dtype == torch.float32:  # both passes in one call: the weight is read once
        high = torch.cat([high, (rows - high).to(torch.bfloat16)])
    return high


def _sum_passes(both: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    n = rows.shape[0]
    out = both[:n].float()
    if rows.dtype == torch.float32:
        out += both[n:]
    return out


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                *, group_size: int) -> torch.Tensor:
    entry = CONVERTED.get(qweight, lambda: _convert(qweight, scales_zeros))
    rows = x.reshape(-1, x.shape[-1])
    n = rows.shape[0]
    both = torch.ops.aten._weight_int4pack_mm_for_cpu(_bf16_passes(rows), entry.packed, group_size, entry.scales)
    out = _sum_passes(both, rows)
    sums = rows.float().view(n, -1, group_size).sum(dim=-1)  # [rows, K/group]
    out += torch.bmm(sums[:, None, :], entry.zeros.expand(n, *entry.zeros.shape)).squeeze(1)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], qweight.shape[0])


UNIT_SCALES: WeightCache[torch.Tensor] = WeightCache()  # bfloat16 ones [N], by the identity of the weight


def linear_w8_int8(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None,
                   *, block_size: tuple[int, int]) -> torch.Tensor:
    """int8 weight [N, K] with per-channel float32 scales [N, 1]."""
    ones = UNIT_SCALES.get(weight, lambda: torch.ones(weight.shape[0], dtype=torch.bfloat16))
    rows = x.reshape(-1, x.shape[-1])
    out = _sum_passes(torch.ops.aten._weight_int8pack_mm(_bf16_passes(rows), weight, ones), rows) * scale.view(1, -1)
    if bias is not None:
        out = out + bias.float()
    return out.to(x.dtype).view(*x.shape[:-1], weight.shape[0])


def _available() -> Reason | None:
    ops = torch.ops.aten
    if not (hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")):
        return Reason(NOT_INSTALLED, f"torch {torch.__version__} has no CPU int4 packed matmul")
    return None


def _shapes(ctx: SelectionContext) -> list[Reason]:
    reasons = []
    group, rows = ctx.param("group_size"), ctx.param("out_features")
    if group is not None and (group < 32 or group & (group - 1)):
        reasons.append(Reason(CONSTRAINT_FAILED, f"group_size {group}: the packed kernel takes powers of two >= 32"))
    if rows is not None and rows % 16:
        reasons.append(Reason(CONSTRAINT_FAILED, f"{rows} output features: the packed kernel needs a multiple of 16"))
    return reasons


def _int8_available() -> Reason | None:
    if not hasattr(torch.ops.aten, "_weight_int8pack_mm"):
        return Reason(NOT_INSTALLED, f"torch {torch.__version__} has no int8 packed matmul")
    return None


def _per_channel(ctx: SelectionContext) -> list[Reason]:
    block = ctx.param("block_size")
    if block is not None and (block[0] != 1 or block[1] < ctx.hidden):
        return [Reason(CONSTRAINT_FAILED, f"scale blocks {tuple(block)}: the int8 kernel takes one scale per output row")]
    return []


def kernel_specs() -> list[KernelSpec]:
    return [
        KernelSpec("torch.linear_int4_cpu", "linear_int4", "torch", linear_int4, torch.__version__,
                   platforms=frozenset({"cpu"}), dtypes=frozenset({torch.float32, torch.bfloat16}), priority=PRIORITY,
                   check=_shapes, available=_available),
        KernelSpec("torch.linear_w8_int8_cpu", "linear_w8", "torch", linear_w8_int8, torch.__version__,
                   platforms=frozenset({"cpu"}), dtypes=frozenset({torch.float32, torch.bfloat16}), priority=PRIORITY,
                   quant_formats=frozenset({"int8"}), check=_per_channel, available=_int8_available),
    ]
