"""The filter step: every hard constraint of a KernelSpec checked against a SelectionContext, as Reasons.

Also decides implicit adaptation: a dense-attention layout the kernel lacks (a transposed view) or a
low-precision float dtype the kernel lacks when it takes float32 (a lossless upcast). Both are allowed
outside strict mode and cost a score penalty; in strict mode they are rejections.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from layerzero.select import reasons as R
from layerzero.select.context import SelectionContext
from layerzero.select.graphs import graph_safety_reason
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import Reason

MAX_THREADS_PER_BLOCK = 1024
MAX_GRID = (2**31 - 1, 65535, 65535)
TRANSPOSE_PENALTY = 5.0
CAST_PENALTY = 10.0
# ops whose float inputs can be upcast to float32 and whose outputs cast back (functional ops only)
CASTABLE_OPS = frozenset({
    "attention", "varlen_attention", "rms_norm", "fused_add_rms_norm", "layer_norm", "rope", "silu_and_mul",
    "gelu_and_mul", "linear",
})
_LOW_PRECISION = frozenset({torch.float16, torch.bfloat16})


@dataclass(frozen=True, slots=True)
class Adaptation:
    """How dispatch must adapt a call for a kernel: transpose dense attention to `layout`, upcast to `cast`."""

    layout: str | None = None
    cast: torch.dtype | None = None

    @property
    def penalty(self) -> float:
        return (TRANSPOSE_PENALTY if self.layout else 0.0) + (CAST_PENALTY if self.cast else 0.0)

    def describe(self) -> list[str]:
        out = [f"transpose to {self.layout}"] if self.layout else []
        return out + ([f"cast to {str(self.cast).removeprefix('torch.')}"] if self.cast else [])


NO_ADAPTATION = Adaptation()


def _hardware(spec: KernelSpec, ctx: SelectionContext, out: list[Reason]) -> None:
    if ctx.platform not in spec.platforms:
        out.append(Reason(R.PLATFORM_MISMATCH, f"runs on {sorted(spec.platforms)}, call is on {ctx.platform}"))
        return
    if ctx.platform != "cuda":
        return
    sm = ctx.sm or 0
    if spec.min_sm is not None and sm < spec.min_sm:
        out.append(Reason(R.SM_TOO_OLD, f"requires SM{spec.min_sm}+, device is SM{sm}"))
    if spec.max_sm is not None and sm > spec.max_sm:
        out.append(Reason(R.SM_TOO_NEW, f"requires SM{spec.max_sm} or older, device is SM{sm}"))
    if spec.min_cuda_version is not None and (ctx.cuda_version is None or ctx.cuda_version < spec.min_cuda_version):
        need = ".".join(map(str, spec.min_cuda_version))
        out.append(Reason(R.DRIVER_VERSION_UNSUPPORTED, f"needs CUDA {need}+, have {ctx.cuda_version}"))


def _dtype_and_layout(spec: KernelSpec, ctx: SelectionContext, strict: bool, out: list[Reason]) -> Adaptation:
    cast = layout = None
    if spec.dtypes is not None and ctx.dtype is not None and ctx.dtype not in spec.dtypes:
        upcast = ctx.op in CASTABLE_OPS and ctx.dtype in _LOW_PRECISION and torch.float32 in spec.dtypes
        if upcast and not strict:
            cast = torch.float32
        else:
            why = " (strict_mode forbids the float32 upcast)" if upcast else ""
            names = sorted(str(d).removeprefix("torch.") for d in spec.dtypes)
            out.append(Reason(R.DTYPE_UNSUPPORTED, f"supports {names}, call is {str(ctx.dtype).removeprefix('torch.')}{why}"))
    if spec.layouts is not None and ctx.layout is not None and ctx.layout not in spec.layouts:
        targets = sorted(spec.layouts & {"BSHD", "BHSD"})
        if ctx.op == "attention" and targets and not strict:
            layout = targets[0]
        else:
            why = " (strict_mode forbids the transpose)" if ctx.op == "attention" and targets else ""
            out.append(Reason(R.LAYOUT_UNSUPPORTED, f"takes {sorted(spec.layouts)}, call is {ctx.layout}{why}"))
    return Adaptation(layout, cast) if (layout or cast) else NO_ADAPTATION


def _shapes(spec: KernelSpec, ctx: SelectionContext, out: list[Reason]) -> None:
    d = ctx.head_dim
    if d:
        if (spec.min_head_dim is not None and d < spec.min_head_dim) or (spec.max_head_dim is not None and d > spec.max_head_dim):
            out.append(Reason(R.HEAD_DIM_INVALID, f"head_dim {d} outside [{spec.min_head_dim}, {spec.max_head_dim}]"))
        if spec.head_dim_multiple and d % spec.head_dim_multiple:
            out.append(Reason(R.HEAD_DIM_ALIGNMENT, f"head_dim {d} is not a multiple of {spec.head_dim_multiple}"))
    if spec.max_seq_len is not None and max(ctx.seq_q, ctx.seq_k) > spec.max_seq_len:
        out.append(Reason(R.SEQ_TOO_LONG, f"max sequence {spec.max_seq_len}, call has {max(ctx.seq_q, ctx.seq_k)}"))
    if ctx.gqa and not spec.supports_gqa:
        out.append(Reason(R.GQA_UNSUPPORTED, f"no GQA ({ctx.num_heads} query heads over {ctx.num_kv_heads} KV heads)"))
    if ctx.sliding_window and not spec.supports_sliding_window:
        out.append(Reason(R.SLIDING_WINDOW_UNSUPPORTED, "no sliding-window attention"))
    if ctx.attn_mask_type not in spec.attn_mask_types:
        out.append(Reason(R.ATTN_MASK_UNSUPPORTED, f"masks {sorted(spec.attn_mask_types)}, call has {ctx.attn_mask_type}"))
    if spec.requires_last_dim_contiguous and not ctx.last_dim_contiguous:
        out.append(Reason(R.STRIDE_LAST_DIM, "needs stride 1 in the last dim"))


def _quant_and_kv(spec: KernelSpec, ctx: SelectionContext, out: list[Reason]) -> None:
    if ctx.quant_format is not None and spec.quant_formats is not None and ctx.quant_format not in spec.quant_formats:
        out.append(Reason(R.QUANT_FORMAT_UNSUPPORTED, f"formats {sorted(spec.quant_formats)}, asked {ctx.quant_format}"))
    if spec.kv_cache_layouts is not None and ctx.kv_cache_layout is not None and ctx.kv_cache_layout not in spec.kv_cache_layouts:
        out.append(Reason(R.KV_CACHE_LAYOUT_MISMATCH, f"KV cache layouts {sorted(spec.kv_cache_layouts)}, got {ctx.kv_cache_layout}"))
    if spec.kv_cache_dtypes is not None and ctx.kv_cache_dtype is not None and ctx.kv_cache_dtype not in spec.kv_cache_dtypes:
        out.append(Reason(R.KV_CACHE_DTYPE_MISMATCH, f"KV cache dtype {ctx.kv_cache_dtype} unsupported"))
    if spec.kv_strategies is not None and ctx.kv_strategy is not None and ctx.kv_strategy not in spec.kv_strategies:
        out.append(Reason(R.KV_STRATEGY_UNSUPPORTED, f"KV strategies {sorted(spec.kv_strategies)}, got {ctx.kv_strategy}"))
    if spec.requires_packed_weights and ctx.packed_weights_id is None:
        out.append(Reason(R.PACKED_WEIGHTS_REQUIRED, "needs prepacked weights"))


def _launch(spec: KernelSpec, ctx: SelectionContext, out: list[Reason]) -> None:
    if spec.launch is None or ctx.platform != "cuda":
        return
    cfg = spec.launch(ctx)
    if cfg.threads_per_block > MAX_THREADS_PER_BLOCK:
        out.append(Reason(R.CUDA_BLOCK_LIMIT_EXCEEDED, f"{cfg.threads_per_block} threads per block > {MAX_THREADS_PER_BLOCK}"))
    if any(g > lim for g, lim in zip(cfg.grid, MAX_GRID)):
        out.append(Reason(R.CUDA_GRID_DIM_EXCEEDED, f"grid {cfg.grid} exceeds {MAX_GRID}"))


def check(spec: KernelSpec, ctx: SelectionContext, *, strict: bool, deterministic: bool,
          graph_strict: bool = False) -> tuple[list[Reason], Adaptation]:
    """Every declarative constraint and the custom check; empty reasons means the kernel can run ctx.

    `strict` forbids adaptation, `deterministic` requires deterministic kernels, `graph_strict` requires a
    dummy-capture verification (layerzero.select.graphs.verify) of graph-safe kernels while capturing.
    """
    out: list[Reason] = []
    _hardware(spec, ctx, out)
    adaptation = _dtype_and_layout(spec, ctx, strict, out)
    _shapes(spec, ctx, out)
    _quant_and_kv(spec, ctx, out)
    try:
        _launch(spec, ctx, out)
    except Exception as exc:  # a broken launch callable rejects its kernel, never the call
        out.append(Reason(R.CONSTRAINT_FAILED, f"launch raised {exc!r}"))
    if ctx.capturing:
        unsafe = graph_safety_reason(spec, ctx, strict=graph_strict)
        if unsafe is not None:
            out.append(unsafe)
    if (deterministic or ctx.deterministic) and not spec.deterministic:
        out.append(Reason(R.NON_DETERMINISTIC, "non-deterministic, determinism required"))
    if spec.check is not None:
        try:
            out.extend(spec.check(ctx))
        except Exception as exc:  # a broken check rejects its kernel, never the call
            out.append(Reason(R.CONSTRAINT_FAILED, f"check raised {exc!r}"))
    return out, adaptation
