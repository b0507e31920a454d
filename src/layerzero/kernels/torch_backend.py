"""PyTorch-native kernels: SDPA (GQA via enable_gqa, windows via a mask), FlexAttention for windowed
attention on CUDA, torch's fused rms_norm / layer_norm, and mixture-of-experts layers of few tokens as two batched
matmuls over the gathered experts' weights, and on the CPU LoRA adapters as one matmul per adapter present.

The two ops that fuse an MoE layer's routing into its neighbours (`fused_add_rms_norm_router`, `fused_moe_routed`)
also run here as what they fuse, each part through layerzero's own choice (`composed_*`): wherever no fused kernel
takes a call (a prefill on CUDA, every call on the CPU), the layer costs what its separate ops cost."""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from typing import Any

import torch
import torch.nn.functional as F

from layerzero.kernels.reference.attention import _mask
from layerzero.kernels.reference.lora import lora_expand_grouped, lora_shrink_grouped
from layerzero.kernels.reference.moe import fused_moe_gathered
from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CONSTRAINT_FAILED, Reason
from layerzero.select.signatures import MOE_GATHER_PAIRS

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32})
FLEX_MIN_SEQ = 128  # FlexAttention asserts on shorter sequences in some torch releases
_BLOCK_MASKS_MAX = 64


def _bhsd(t: torch.Tensor, layout: str) -> torch.Tensor:
    return t.transpose(1, 2) if layout == "BSHD" else t


def sdpa(q, k, v, *, causal: bool, scale: float, sliding_window: int | None, layout: str) -> torch.Tensor:
    """F.scaled_dot_product_attention; no mask when none is needed (full, square causal, one-query causal)."""
    q, k, v = (_bhsd(t, layout) for t in (q, k, v))
    sq, sk = q.shape[-2], k.shape[-2]
    gqa = q.shape[1] != k.shape[1]
    if sliding_window is None and (not causal or sq == 1):
        out = F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=gqa)
    elif sliding_window is None and sq == sk:
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=gqa)
    else:
        mask = _mask(sq, sk, causal, sliding_window, q.device)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=gqa)
    return _bhsd(out, layout)


@functools.cache
def _compiled_flex() -> Any:
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


class _BlockMasks:
    """Small LRU of FlexAttention block masks by (sq, sk, causal, window, device)."""

    def __init__(self) -> None:
        self._masks: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, sq: int, sk: int, causal: bool, window: int, device: torch.device) -> Any:
        key = (sq, sk, causal, window, str(device))
        with self._lock:
            mask = self._masks.get(key)
            if mask is not None:
                self._masks.move_to_end(key)
                return mask
        from torch.nn.attention.flex_attention import create_block_mask

        offset = sk - sq

        def visible(b, h, q_idx, kv_idx):
            pos = q_idx + offset
            keep = pos - kv_idx < window
            return keep & (kv_idx <= pos) if causal else keep

        mask = create_block_mask(visible, None, None, sq, sk, device=device)
        with self._lock:
            self._masks[key] = mask
            while len(self._masks) > _BLOCK_MASKS_MAX:
                self._masks.popitem(last=False)
        return mask


_BLOCK_MASKS = _BlockMasks()


def flex(q, k, v, *, causal: bool, scale: float, sliding_window: int | None, layout: str) -> torch.Tensor:
    """FlexAttention with a block-sparse sliding-window mask (skips the blocks outside the window)."""
    q, k, v = (_bhsd(t, layout) for t in (q, k, v))
    mask = _BLOCK_MASKS.get(q.shape[-2], k.shape[-2], causal, int(sliding_window), q.device)
    out = _compiled_flex()(q, k, v, block_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return _bhsd(out, layout)


def _flex_check(ctx: SelectionContext) -> list[Reason]:
    out = []
    if not ctx.sliding_window:
        out.append(Reason(CONSTRAINT_FAILED, "used for sliding-window attention only (SDPA covers the rest)"))
    if min(ctx.seq_q, ctx.seq_k) < FLEX_MIN_SEQ:
        out.append(Reason(CONSTRAINT_FAILED, f"needs at least {FLEX_MIN_SEQ} query and key positions"))
    if ctx.head_dim & (ctx.head_dim - 1):
        out.append(Reason(CONSTRAINT_FAILED, f"head_dim {ctx.head_dim} is not a power of two"))
    return out


def rms_norm(x, weight, *, eps: float, weight_offset: float) -> torch.Tensor:
    """torch.rms_norm on the input dtype (the fused kernel needs matching weight dtype); offset added in float32."""
    w = weight if weight_offset == 0.0 else weight.float() + weight_offset
    return F.rms_norm(x, (x.shape[-1],), w if w.dtype == x.dtype else w.to(x.dtype), eps)


def layer_norm(x, normalized_shape, weight, bias, *, eps: float) -> torch.Tensor:
    """torch.layer_norm in the input dtype (float32 accumulation inside the kernel)."""
    weight = None if weight is None else weight.to(x.dtype)
    bias = None if bias is None else bias.to(x.dtype)
    return F.layer_norm(x, tuple(normalized_shape), weight, bias, eps)


def _gathered_moe_check(ctx: SelectionContext) -> list[Reason]:
    if not ctx.param("few_pairs"):
        return [Reason(CONSTRAINT_FAILED, f"more than {MOE_GATHER_PAIRS} (token, expert) pairs: gathering each pair's "
                                          "weights would copy more than the experts hold")]
    return []


def router_logits(x: torch.Tensor, router: torch.Tensor) -> torch.Tensor:
    """Float32 logits x [T, H] @ router [E, H]^T: a float32-output matmul of bf16 or fp16 rows on CUDA (float32 sums of
    the products, no casts), float32 operands elsewhere. The one matmul triton.moe_gate and the composed router share,
    so a token's experts do not depend on which of them ran."""
    if x.is_cuda and x.dtype in (torch.float16, torch.bfloat16) and router.dtype == x.dtype:
        return torch.mm(x, router.t(), out_dtype=torch.float32)
    return torch.matmul(x.float(), router.float().t())


def composed_add_rms_norm_router(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                 router: torch.Tensor, proj: torch.Tensor | None = None, *, eps: float,
                                 weight_offset: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """lz.linear of x by `proj` (if given), lz.fused_add_rms_norm, then the router's float32 logits as lz.moe_gate
    computes them (`router_logits`)."""
    import layerzero.api as lz  # late: the api's dispatch loads this backend

    if proj is not None:
        x = lz.linear(x, proj)
    normed, summed = lz.fused_add_rms_norm(x, residual, weight, eps=eps, weight_offset=weight_offset)
    return normed, summed, router_logits(normed, router)


def composed_moe_routed(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, logits: torch.Tensor, top_k: int, *,
                        renormalize: bool, scoring: str = "softmax", activation: str = "silu") -> torch.Tensor:
    """lz.moe_route of the logits, then lz.fused_moe."""
    import layerzero.api as lz

    weights, ids = lz.moe_route(logits, top_k, renormalize=renormalize, scoring=scoring)
    return lz.fused_moe(x, w13, w2, weights, ids, activation=activation)


def kernel_specs() -> list[KernelSpec]:
    version = torch.__version__
    return [
        KernelSpec("torch.sdpa", "attention", "torch", sdpa, version, dtypes=FLOATS, graph_safe=True, priority=50),
        KernelSpec("torch.flex_attention", "attention", "torch", flex, version, platforms=frozenset({"cuda"}),
                   min_sm=80, dtypes=FLOATS, min_head_dim=16, requires_last_dim_contiguous=True, priority=60,
                   check=_flex_check),
        KernelSpec("torch.rms_norm", "rms_norm", "torch", rms_norm, version, dtypes=FLOATS, graph_safe=True, priority=40),
        KernelSpec("torch.layer_norm", "layer_norm", "torch", layer_norm, version, dtypes=FLOATS, graph_safe=True,
                   priority=40),
        # graph-safe decode on CUDA until a grouped kernel exists; on the CPU the gathered copies cost more than the
        # reference's loop over the routed experts saves (benchmarks/reports/moe_cpu.md)
        KernelSpec("torch.fused_moe_gathered", "fused_moe", "torch", fused_moe_gathered, version,
                   platforms=frozenset({"cuda"}), dtypes=FLOATS, graph_safe=True, priority=40,
                   check=_gathered_moe_check),
        # graph safe as their parts: each part is chosen under the same capture
        KernelSpec("torch.composed_add_rms_norm_router", "fused_add_rms_norm_router", "torch",
                   composed_add_rms_norm_router, version, dtypes=FLOATS, graph_safe=True, priority=40),
        KernelSpec("torch.composed_moe_routed", "fused_moe_routed", "torch", composed_moe_routed, version,
                   dtypes=FLOATS, graph_safe=True, priority=40),
        # the CPU's LoRA: one matmul per adapter present over its rows (reads the slot ids on the host)
        KernelSpec("torch.lora_shrink_grouped", "lora_shrink", "torch", lora_shrink_grouped, version,
                   platforms=frozenset({"cpu"}), dtypes=FLOATS, priority=40),
        KernelSpec("torch.lora_expand_grouped", "lora_expand", "torch", lora_expand_grouped, version,
                   platforms=frozenset({"cpu"}), dtypes=FLOATS, priority=40),
    ]
