"""The native mixture of experts on the CPU, over experts kept quantized (a GGUF's 4-bit or Q8_0 experts) or dense
(float32 or bfloat16 stacks): routing, both grouped projections, the gated activation and the weighted sum in one C
call (`moe_quant` in quant_linear.c).

The call reads the routed ids from memory, so no host value leaves it and a CPU decode graph replays it; the pairs
are grouped by expert inside, so each routed expert's weights stream once per call, as stored (4 or 8 bits, bfloat16
or float32).
A token's result does not depend on what else shares its call (docs/quantization.md, "CPU kernels")."""

from __future__ import annotations

import ctypes

import torch

from layerzero.kernels.native.build import kernel

_P, _I64, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
ARGS = (_P, _I64, _I64, _I64, _I64, _P, _P, _I64, _INT, _P, _P, _P, _I64, _INT, _P, _P, _P, _I64, _INT, _P, _INT)
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}
INT4, INT8, BF16, F32 = 0, 1, 2, 3  # the C kernel's stack forms
DENSE_STEP = 16  # the dense tiles' column step: both projections' inputs are whole steps


def _moe(x: torch.Tensor, experts: int, inner: int, weights: torch.Tensor, ids: torch.Tensor,
         w13: tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor | None, int],
         w2: tuple[int, torch.Tensor, torch.Tensor | None, torch.Tensor | None, int], activation: str) -> torch.Tensor:
    rows = x if x.dtype == torch.float32 and x.is_contiguous() else x.float().contiguous()
    tokens, hidden = rows.shape
    ids64, wts = ids.to(torch.int64).contiguous(), weights.float().contiguous()
    out = torch.empty(tokens, hidden, dtype=torch.float32)
    # every tensor whose pointer C reads is held in a local until the call returns
    held = [(form, q.contiguous(), None if s is None else s.contiguous(), None if z is None else z.contiguous(), group)
            for form, q, s, z, group in (w13, w2)]
    ptrs = [(form, q.data_ptr(), None if s is None else s.data_ptr(), None if z is None else z.data_ptr(), group)
            for form, q, s, z, group in held]
    status = kernel("quant_linear", "moe_quant", ARGS, ctypes.c_int)(
        rows.data_ptr(), tokens, hidden, inner, experts, ids64.data_ptr(), wts.data_ptr(), ids64.shape[1],
        *ptrs[0], *ptrs[1], ACTIVATIONS[activation], out.data_ptr(), torch.get_num_threads())
    if status == -2:
        raise ValueError(f"fused_moe: an expert id outside [0, {experts})")
    if status:
        raise MemoryError(f"native fused_moe: no scratch memory for {tokens} tokens x {ids64.shape[1]} experts")
    return out if x.dtype == torch.float32 else out.to(x.dtype)


def fused_moe_int4(x: torch.Tensor, w13: torch.Tensor, w13_scales: torch.Tensor, w2: torch.Tensor,
                   w2_scales: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *, group_size: int,
                   activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_int4 on the CPU: [T, H] in x's dtype."""
    return _moe(x, w13.shape[0], w2.shape[2] * 2, weights, ids,
                (INT4, w13, w13_scales[0], w13_scales[1], group_size),
                (INT4, w2, w2_scales[0], w2_scales[1], group_size), activation)


def fused_moe_w8_int8(x: torch.Tensor, w13: torch.Tensor, w13_scale: torch.Tensor, w2: torch.Tensor,
                      w2_scale: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *, block_size: tuple[int, int],
                      activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe_w8 on the CPU for int8 experts with one scale per row and block of columns (GGUF Q8_0)."""
    return _moe(x, w13.shape[0], w2.shape[2], weights, ids, (INT8, w13, w13_scale.float(), None, block_size[1]),
                (INT8, w2, w2_scale.float(), None, block_size[1]), activation)


def fused_moe(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, *,
              activation: str = "silu") -> torch.Tensor:
    """lz.fused_moe on the CPU for dense float32 or bfloat16 experts (w13 [E, 2I, H], w2 [E, H, I] of one dtype):
    each routed expert's weights read once a call, in their own dtype, instead of a torch call per expert."""
    form = BF16 if w13.dtype == torch.bfloat16 else F32
    hidden, inner = w13.shape[2], w2.shape[2]
    return _moe(x, w13.shape[0], inner, weights, ids, (form, w13, None, None, hidden), (form, w2, None, None, inner),
                activation)
