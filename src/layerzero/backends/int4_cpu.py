"""4-bit weight-only linear on the CPU through torch's packed int4 kernel (`_weight_int4pack_mm_for_cpu`).

The kernel reads each weight in its own blocked layout, so a weight is converted once, on first use, and the
converted copy is kept while the weight lives (keyed by identity, version and storage, as oneDNN's packed
weights are). It multiplies in bfloat16: a float32 x is cast down and the result cast back, which is where the
speed comes from on the CPU (float32 activations make it 10-30x slower). Groups of 32 or more columns.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

import torch

from layerzero.context import SelectionContext
from layerzero.kernel_spec import KernelSpec
from layerzero.reasons import CONSTRAINT_FAILED, NOT_INSTALLED, Reason
from layerzero.reference.quantize import unpack_int4

PRIORITY = 60  # above the reference (dequantize, then a float32 matmul)


@dataclass(frozen=True)
class _Converted:
    weight: weakref.ref[torch.Tensor]
    data_ptr: int
    version: int
    packed: torch.Tensor
    scales_zeros: torch.Tensor  # bfloat16, as the kernel takes them


class _Cache:
    """Converted copies of 4-bit weights by identity; an entry goes when its weight is collected."""

    def __init__(self) -> None:
        self._entries: dict[int, _Converted] = {}
        self._lock = threading.Lock()

    def get(self, qweight: torch.Tensor, scales_zeros: torch.Tensor) -> _Converted:
        version = -1 if torch.is_inference(qweight) else qweight._version
        entry = self._entries.get(id(qweight))
        if entry is not None and entry.weight() is qweight and entry.data_ptr == qweight.data_ptr() \
                and entry.version == version:
            return entry
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unpack_int4(qweight).to(torch.int32), 1)
        key = id(qweight)
        ref = weakref.ref(qweight, lambda _: self._entries.pop(key, None))
        entry = _Converted(ref, qweight.data_ptr(), version, packed, scales_zeros.to(torch.bfloat16).contiguous())
        with self._lock:
            self._entries[key] = entry
        return entry


CONVERTED = _Cache()


def linear_int4(x: torch.Tensor, qweight: torch.Tensor, scales_zeros: torch.Tensor, bias: torch.Tensor | None,
                *, group_size: int) -> torch.Tensor:
    entry = CONVERTED.get(qweight, scales_zeros)
    rows = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
    out = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, entry.packed, group_size, entry.scales_zeros).to(x.dtype)
    if bias is not None:
        out = out + bias.to(x.dtype)
    return out.view(*x.shape[:-1], qweight.shape[0])


def _available() -> Reason | None:
    ops = torch.ops.aten
    if not (hasattr(ops, "_weight_int4pack_mm_for_cpu") and hasattr(ops, "_convert_weight_to_int4pack_for_cpu")):
        return Reason(NOT_INSTALLED, f"torch {torch.__version__} has no CPU int4 packed matmul")
    return None


def _shapes(ctx: SelectionContext) -> list[Reason]:
    group = ctx.param("group_size")
    if group is not None and (group < 32 or group & (group - 1)):
        return [Reason(CONSTRAINT_FAILED, f"group_size {group}: the packed kernel takes powers of two >= 32")]
    return []


def kernel_specs() -> list[KernelSpec]:
    return [
        KernelSpec("torch.linear_int4_cpu", "linear_int4", "torch", linear_int4, torch.__version__,
                   platforms=frozenset({"cpu"}), dtypes=frozenset({torch.float32, torch.bfloat16}), priority=PRIORITY,
                   check=_shapes, available=_available),
    ]
