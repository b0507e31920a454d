"""oneDNN linear on the CPU, float32 and bfloat16: each weight is reordered once into oneDNN's blocked layout.

torch's dense CPU linear (MKL sgemm on the row-major weight) is 2-4x slower than oneDNN with a
prepacked weight on the shapes of small LLMs, at 1 to 40 rows, the 49k-row LM head most of all
(numbers in docs/engine.md). In bfloat16 the gap is wider: torch's bf16 linear does not reach the CPU's bf16 dot
products (AVX512-BF16, AMX), oneDNN's does, so bf16 runs here wherever oneDNN supports it on this CPU. On a CPU
without them (AVX2: AMD Zen 2/3, older Xeons) torch's bf16 GEMM is ~10x slower than float32, so there a bf16 weight
is packed as float32 (each value widened exactly) and multiplied in float32. The packed copy is made on a weight's
first use and kept while the weight lives; an in-place change of the weight (its version counter) or a new storage
repacks it.
The price is one extra copy of every linear weight in host memory; lock `linear` to
`reference.linear` (LAYERZERO_LOCK_LINEAR or `lz.lock`) to go without it.
"""

from __future__ import annotations

import functools

import torch

from layerzero.kernels.weight_cache import WeightCache
from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CONSTRAINT_FAILED, NOT_INSTALLED, Reason

PRIORITY = 60  # above the reference (F.linear), the only other CPU linear


PACKED: WeightCache[torch.Tensor] = WeightCache()  # oneDNN-packed copies of float32 and bfloat16 weights


@functools.cache
def bf16_gemm() -> bool:
    """Whether oneDNN multiplies bfloat16 on this CPU (AVX512-BF16 or AMX); where not, bf16 weights run in float32."""
    return torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()


def _pack(weight: torch.Tensor) -> torch.Tensor:
    w = weight.detach()
    return torch.ops.mkldnn._reorder_linear_weight(w if w.dtype != torch.bfloat16 or bf16_gemm() else w.float(), None)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., in] @ weight[out, in].T + bias through oneDNN with the weight's packed copy. float32 x with a bf16
    weight (a CPU model's `HalfWeight`) multiplies in bf16, x rounded to it, and returns float32; without bf16 on
    this CPU the packed copy is float32 and rows of either dtype multiply in float32."""
    rows = x.reshape(-1, x.shape[-1]).contiguous()
    packed = PACKED.get(weight, lambda: _pack(weight))
    if rows.dtype != packed.dtype:
        out = torch.ops.mkldnn._linear_pointwise(rows.to(packed.dtype), packed, None, "none", [], "").to(x.dtype)
        out = out if bias is None else out + bias
    else:
        out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.view(*x.shape[:-1], weight.shape[0])


def _available() -> Reason | None:
    if not torch.backends.mkldnn.is_available() or not hasattr(torch.ops.mkldnn, "_linear_pointwise"):
        return Reason(NOT_INSTALLED, "this torch build has no oneDNN (mkldnn) linear")
    return None


def _same_dtype(ctx: SelectionContext) -> list[Reason]:
    """float32, or a bfloat16 weight with bf16 or float32 x: in bf16 where this CPU has oneDNN's bf16 kernels (float32
    x rounded to bf16), else in float32 from a float32 packed copy. The copy is made once per weight (a cast in the
    caller would be a new tensor, repacked on every call)."""
    x = str(ctx.dtype).removeprefix("torch.")
    weight = ctx.param("weight_dtype") or x
    if x == weight == "float32" or (weight == "bfloat16" and x in ("float32", "bfloat16")):
        return []
    if weight != x:
        return [Reason(CONSTRAINT_FAILED, f"{weight} weights with {ctx.dtype} inputs: oneDNN multiplies one dtype")]
    return [Reason(CONSTRAINT_FAILED, "packs float32 and bfloat16 weights only (an upcast weight would be repacked "
                                      "every call)")]


def kernel_specs() -> list[KernelSpec]:
    return [
        KernelSpec("onednn.linear", "linear", "onednn", linear, torch.__version__, platforms=frozenset({"cpu"}),
                   dtypes=frozenset({torch.float32, torch.bfloat16}), priority=PRIORITY, check=_same_dtype,
                   available=_available),
    ]
