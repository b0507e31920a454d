"""Wrappers for optional kernel libraries (flash-attn, FlashInfer, Liger, xFormers), found by availability.

Each spec's `available` probe reports NOT_INSTALLED when the package is absent and BACKEND_IMPORT_FAILED
when importing it raises (ABI mismatch, missing CUDA libraries): the kernel is then rejected with that
reason, never a crash. Wrappers adapt the canonical call to the library's API and back.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import BACKEND_IMPORT_FAILED, CONSTRAINT_FAILED, NOT_INSTALLED, Reason

HALF = frozenset({torch.float16, torch.bfloat16})
CUDA = frozenset({"cuda"})
FA_PAGE_MULTIPLE = 256  # flash-attn 2 paged KV needs block sizes that are multiples of 256


@functools.cache
def _module(name: str) -> ModuleType:
    return importlib.import_module(name)


def probe(package: str, module: str) -> Callable[[], Reason | None]:
    """Availability probe for `module` of distribution `package`."""

    def available() -> Reason | None:
        try:
            found = importlib.util.find_spec(module.split(".")[0])
        except (ImportError, ValueError) as exc:
            return Reason(BACKEND_IMPORT_FAILED, f"{package}: {exc!r}")
        if found is None:
            return Reason(NOT_INSTALLED, f"{package} is not installed")
        try:
            _module(module)
        except Exception as exc:  # a broken install is a reason, never a crash
            return Reason(BACKEND_IMPORT_FAILED, f"import {module} failed: {exc!r}")
        return None

    return available


def _fa_window(causal: bool, window: int | None) -> tuple[int, int]:
    # ours: a query at i sees keys j with i - window < j (<= i when causal); flash-attn: [i - left, i + right]
    if window is None:
        return (-1, 0 if causal else -1)
    return (window - 1, 0 if causal else -1)


def fa_attention(q, k, v, *, causal: bool, scale: float, sliding_window: int | None, layout: str) -> torch.Tensor:
    return _module("flash_attn").flash_attn_func(q, k, v, softmax_scale=scale, causal=causal,
                                                  window_size=_fa_window(causal, sliding_window))


def fa_varlen(q, k, v, *, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int, max_seqlen_k: int, causal: bool,
              scale: float, sliding_window: int | None, cu_seqlens_host: Any) -> torch.Tensor:
    return _module("flash_attn").flash_attn_varlen_func(
        q, k, v, cu_seqlens_q.to(torch.int32), cu_seqlens_k.to(torch.int32), max_seqlen_q, max_seqlen_k,
        softmax_scale=scale, causal=causal, window_size=_fa_window(causal, sliding_window))


def fa_paged(q, key_cache, value_cache, *, block_tables, context_lens, scale: float, sliding_window: int | None,
             max_context_len: int) -> torch.Tensor:
    out = _module("flash_attn").flash_attn_with_kvcache(
        q.unsqueeze(1), key_cache, value_cache, cache_seqlens=context_lens.to(torch.int32),
        block_table=block_tables.to(torch.int32), softmax_scale=scale, causal=True,
        window_size=_fa_window(True, sliding_window))
    return out.squeeze(1)


def _fa_paged_check(ctx: SelectionContext) -> list[Reason]:
    block = ctx.param("block_size", 0)
    if block % FA_PAGE_MULTIPLE:
        return [Reason(CONSTRAINT_FAILED, f"paged KV block size {block} is not a multiple of {FA_PAGE_MULTIPLE}")]
    return []


def _offset_weight(weight: torch.Tensor, offset: float, dtype: torch.dtype) -> torch.Tensor:
    return (weight if offset == 0.0 else weight.float() + offset).to(dtype)


def fi_rms_norm(x, weight, *, eps: float, weight_offset: float) -> torch.Tensor:
    norm = _module("flashinfer.norm")
    shape = x.shape
    x2 = x.reshape(-1, shape[-1]).contiguous()
    if weight_offset == 1.0:
        return norm.gemma_rmsnorm(x2, weight.to(x.dtype), eps).view(shape)
    return norm.rmsnorm(x2, _offset_weight(weight, weight_offset, x.dtype), eps).view(shape)


def fi_fused_add_rms_norm(x, residual, weight, *, eps: float, weight_offset: float) -> tuple[torch.Tensor, torch.Tensor]:
    norm = _module("flashinfer.norm")
    shape = x.shape
    out = x.reshape(-1, shape[-1]).clone()  # flashinfer updates in place; the op is functional
    summed = residual.reshape(-1, shape[-1]).clone()
    if weight_offset == 1.0:
        norm.gemma_fused_add_rmsnorm(out, summed, weight.to(x.dtype), eps)
    else:
        norm.fused_add_rmsnorm(out, summed, _offset_weight(weight, weight_offset, x.dtype), eps)
    return out.view(shape), summed.view(shape)


def fi_silu_and_mul(x) -> torch.Tensor:
    return _module("flashinfer.activation").silu_and_mul(x.contiguous())


def fi_gelu_and_mul(x, *, approximate: str) -> torch.Tensor:
    act = _module("flashinfer.activation")
    fn = act.gelu_tanh_and_mul if approximate == "tanh" else act.gelu_and_mul
    return fn(x.contiguous())


def liger_rms_norm(x, weight, *, eps: float, weight_offset: float) -> torch.Tensor:
    # casting_mode "gemma" computes everything in float32, as the reference does
    fn = _module("liger_kernel.ops.rms_norm").LigerRMSNormFunction
    return fn.apply(x, weight, eps, weight_offset, "gemma")


def liger_silu_and_mul(x) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return _module("liger_kernel.ops.swiglu").LigerSiLUMulFunction.apply(gate.contiguous(), up.contiguous())


def liger_gelu_and_mul(x, *, approximate: str) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return _module("liger_kernel.ops.geglu").LigerGELUMulFunction.apply(gate.contiguous(), up.contiguous())


def _tanh_only(ctx: SelectionContext) -> list[Reason]:
    if ctx.param("approximate") != "tanh":
        return [Reason(CONSTRAINT_FAILED, "implements the tanh approximation only")]
    return []


def xformers_attention(q, k, v, *, causal: bool, scale: float, sliding_window: int | None, layout: str) -> torch.Tensor:
    ops = _module("xformers.ops")
    bias = _module("xformers.ops.fmha.attn_bias").LowerTriangularFromBottomRightMask() if causal else None
    return ops.memory_efficient_attention(q, k, v, attn_bias=bias, scale=scale)


def kernel_specs() -> list[KernelSpec]:
    fa, fi = probe("flash-attn", "flash_attn"), probe("flashinfer", "flashinfer.norm")
    fi_act, liger = probe("flashinfer", "flashinfer.activation"), probe("liger-kernel", "liger_kernel.ops.rms_norm")
    liger_swiglu, liger_geglu = probe("liger-kernel", "liger_kernel.ops.swiglu"), probe("liger-kernel", "liger_kernel.ops.geglu")
    xf = probe("xformers", "xformers.ops")
    attn = dict(platforms=CUDA, min_sm=80, dtypes=HALF, max_head_dim=256, head_dim_multiple=8,
                requires_last_dim_contiguous=True, graph_safe=True)
    rows = dict(platforms=CUDA, min_sm=80, dtypes=HALF, graph_safe=True)
    return [
        KernelSpec("flash_attn.attention", "attention", "flash_attn", fa_attention, layouts=frozenset({"BSHD"}),
                   priority=90, available=fa, **attn),
        KernelSpec("flash_attn.varlen", "varlen_attention", "flash_attn", fa_varlen, priority=90, available=fa, **attn),
        KernelSpec("flash_attn.paged", "paged_attention", "flash_attn", fa_paged, priority=90, available=fa,
                   check=_fa_paged_check, **attn),
        KernelSpec("flashinfer.rms_norm", "rms_norm", "flashinfer", fi_rms_norm, priority=80, available=fi, **rows),
        KernelSpec("flashinfer.fused_add_rms_norm", "fused_add_rms_norm", "flashinfer", fi_fused_add_rms_norm,
                   priority=80, available=fi, **rows),
        KernelSpec("flashinfer.silu_and_mul", "silu_and_mul", "flashinfer", fi_silu_and_mul, priority=80,
                   available=fi_act, **rows),
        KernelSpec("flashinfer.gelu_and_mul", "gelu_and_mul", "flashinfer", fi_gelu_and_mul, priority=80,
                   available=fi_act, **rows),
        KernelSpec("liger.rms_norm", "rms_norm", "liger", liger_rms_norm, priority=85, available=liger, **rows),
        KernelSpec("liger.silu_and_mul", "silu_and_mul", "liger", liger_silu_and_mul, priority=85,
                   available=liger_swiglu, **rows),
        KernelSpec("liger.gelu_and_mul", "gelu_and_mul", "liger", liger_gelu_and_mul, priority=85,
                   available=liger_geglu, check=_tanh_only, **rows),
        KernelSpec("xformers.attention", "attention", "xformers", xformers_attention, platforms=CUDA, min_sm=70,
                   dtypes=frozenset({torch.float16, torch.bfloat16, torch.float32}), layouts=frozenset({"BSHD"}),
                   supports_gqa=False, supports_sliding_window=False, requires_last_dim_contiguous=True,
                   graph_safe=True, priority=75, available=xf),
    ]
