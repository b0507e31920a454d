"""KernelSpecs of layerzero's Triton kernels, for the selection engine.

Importing this module imports neither triton nor the kernels: each impl loads its kernel module on
first call, and `available()` reports a missing triton or a missing device as a Reason. The kernels
run on CUDA; with TRITON_INTERPRET=1 (read when the specs are built) they also take CPU tensors,
through the interpreter, and are then not graph safe.
"""

from __future__ import annotations

import importlib
import os
from importlib import metadata
from collections.abc import Callable
from typing import Any

import torch

from layerzero.select import reasons as R
from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec, LaunchConfig
from layerzero.select.reasons import Reason
from layerzero.select.signatures import MOE_DECODE_PAIRS

FLOATS = frozenset({torch.float16, torch.bfloat16, torch.float32})
MAX_ATTENTION_HEAD_DIM = 256
PRIORITY = 80  # above torch (40-60) and the reference (10): fused, graph safe, sync free
MAX_ROUTED_EXPERTS = 1024  # the routing kernel keeps a token's scores in registers
MOE_GATE_ROWS = 16  # tokens the one-launch router takes (moe_route.ROWS: one tl.dot tile of rows)
NORM_ROUTER_ROWS = 16  # tokens the norm-and-router kernel takes: each program recomputes its token's norm
MAX_NORM_ROUTER_HIDDEN = 8192  # a row the norm-and-router kernel holds in registers
DECODE_PRIORITY = 85  # the MoE decode path, above the grouped GEMM wherever its pair limit lets it run
FOLD_PRIORITY = 90  # an op's kernel that sums its projection's split-K slices, above the same op projecting first
VARLEN_PRIORITY = 70  # prefill: a dedicated flash kernel may beat it; PerfDB timings decide


def interpret_requested() -> bool:
    """Whether TRITON_INTERPRET asks for the interpreter (triton's own truthy spellings)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes", "y")


def available() -> Reason | None:
    """None when the kernels can run here: triton imports and a CUDA device (or the interpreter) exists."""
    try:
        import triton  # noqa: F401
    except ImportError as exc:
        return Reason(R.NOT_INSTALLED, f"triton is not installed ({exc})")
    except Exception as exc:  # a broken install must be a reason, never a crash
        return Reason(R.BACKEND_IMPORT_FAILED, f"importing triton failed: {exc!r}")
    if interpret_requested() or torch.cuda.is_available():
        return None
    return Reason(R.PLATFORM_MISMATCH, "no CUDA device, and TRITON_INTERPRET=1 is not set")


def _lazy(module: str, name: str) -> Callable[..., Any]:
    """The kernel entry point `module.name`, imported on first call (triton loads only when a kernel runs)."""
    target: list[Callable[..., Any]] = []

    def impl(*args: Any, **kwargs: Any) -> Any:
        if not target:
            target.append(getattr(importlib.import_module(f"layerzero.kernels.triton.{module}"), name))
        return target[0](*args, **kwargs)

    impl.__name__ = impl.__qualname__ = f"triton_{name}"
    return impl


def _gelu_mode(ctx: SelectionContext) -> list[Reason]:
    mode = ctx.param("approximate", "tanh")
    if mode not in ("tanh", "none"):
        return [Reason(R.CONSTRAINT_FAILED, f"approximate={mode!r}: only 'tanh' and 'none' are implemented")]
    return []


def _w8_blocks(ctx: SelectionContext) -> list[Reason]:
    """A K tile must sit inside one scale block: blocks span K, or are a power of two of at least 16 columns;
    e4m3 weights need SM 8.9+ (Ada, Hopper) for the conversion on CUDA."""
    reasons = []
    block = ctx.param("block_size")
    if block is not None:
        bk = block[1]
        if bk < ctx.hidden and (bk < 16 or bk & (bk - 1)):
            reasons.append(Reason(R.CONSTRAINT_FAILED, f"scale blocks of {bk} columns: needs all {ctx.hidden} columns "
                                                       "or a power of two >= 16"))
    return reasons + _fp8_sm(ctx)


def _int4_groups(ctx: SelectionContext) -> list[Reason]:
    """The GEMV sums each group of columns before its scale, as a reshape: groups are powers of two >= 16."""
    group = ctx.param("group_size")
    if group is not None and (group < 16 or group & (group - 1)):
        return [Reason(R.CONSTRAINT_FAILED, f"group_size {group}: the Triton kernel takes powers of two >= 16")]
    return []


GEMV_MAX_ROWS = 8  # decode's batch 1-8; more rows are a GEMM's work
# Where the GEMV measured faster than cuBLAS on weights read from DRAM, as a decode step reads them (H200,
# benchmarks/reports/gemv_bandwidth_h200.md, gemv_bandwidth_tp2_h200.md): every weight from 64 MiB (LM heads,
# gate+up, the 8B's down). Under 64 MiB its column blocks leave SMs idle or in a partial last wave (96-192 programs
# of 32 outputs for 3072-6144 outputs): long rows (K >= 4096) of 16-64 MiB go to the split-K form below, and to the
# GEMV only where K does not divide into the split's slices and there are 3072+ outputs (1-10% faster than cuBLAS
# there). Shorter rows or fewer outputs lost to cuBLAS's split-K: Qwen3-30B-A3B's QKV (K 2048) 8.1 against 7.7 µs,
# the 1B's down (2048 outputs) 17 against 13.
GEMV_MIN_WEIGHT_BYTES = 64 * 2**20
GEMV_LONG_ROWS_MIN_BYTES = 16 * 2**20
GEMV_LONG_ROW = 4096
GEMV_MIN_OUT_FEATURES = 3072
# Long rows under 64 MiB (the 8B's QKV and O, its TP=2 QKV and down shards, Qwen3-30B-A3B's O projection): K split
# in SPLITK_SLICES slices of whole SPLITK_BLOCK_K steps (gemv.linear_splitk), 8 x 32-128 programs, so every SM
# streams. Qwen3-30B-A3B's O (2048 outputs): 1.3 µs a layer faster than cuBLAS's split-K in a chain of layers
# (benchmarks/reports/splitk_chain_h200.md); the 8B's QKV and O (3072-6144 outputs, before on the one-pass GEMV):
# whole decode 6.4% faster at TP=1 and 5.4% at TP=2 (benchmarks/reports/distributed_h200.md). On the Llama-3.1-8B
# TP=2 O shard (K 2048) it only tied, so rows under 4096 stay on cuBLAS.
SPLITK_SLICES = 8
SPLITK_BLOCK_K = 128
# (SPLITS, BLOCK_N, BLOCK_K) of a projection a fused op takes with its input (`proj`): its split-K partials summed by
# the op's own kernel where it reads them, not by a sum kernel in between. The best of the tilings tried on
# Qwen3-30B-A3B's O and QKV (benchmarks/reports/moe_fusion_ceiling_h200.md): more slices cost the reader more bytes
# than they save the GEMV (O at (8, 64, 128), the split-K GEMV's own tile, lost the whole gain)
FUSED_SPLITK_TILE = (4, 32, 128)


def _gemv_rows(ctx: SelectionContext, kernel: str) -> list[Reason]:
    """The reason against more rows than a skinny GEMV takes (GEMV_MAX_ROWS), if any."""
    if ctx.tokens > GEMV_MAX_ROWS:
        return [Reason(R.CONSTRAINT_FAILED, f"{ctx.tokens} rows: the {kernel} takes at most {GEMV_MAX_ROWS} "
                                            "(more rows are a GEMM's)")]
    return []


def _skinny(ctx: SelectionContext, kernel: str) -> tuple[list[Reason], int, int]:
    """What both skinny-linear rules start from: the reason against too many rows (if any), the weight's outputs and
    its bytes."""
    out = ctx.param("out_features") or 0
    return _gemv_rows(ctx, kernel), out, out * ctx.hidden * (ctx.dtype.itemsize if ctx.dtype is not None else 2)


def _splitk_sized(nbytes: int) -> bool:
    """A weight of the split-K GEMV's sizes: 16 to 64 MiB."""
    return GEMV_LONG_ROWS_MIN_BYTES <= nbytes < GEMV_MIN_WEIGHT_BYTES


def _long_rows(ctx: SelectionContext, nbytes: int) -> bool:
    """A weight the split-K form is for: rows of GEMV_LONG_ROW+ columns, 16 to 64 MiB."""
    return ctx.hidden >= GEMV_LONG_ROW and _splitk_sized(nbytes)


def _slices(ctx: SelectionContext) -> bool:
    """Whether K divides into the split-K form's slices of whole steps."""
    return ctx.hidden % (SPLITK_SLICES * SPLITK_BLOCK_K) == 0


def _gemv_shape(ctx: SelectionContext) -> list[Reason]:
    """The skinny-linear kernel runs where it measured faster than cuBLAS: few rows, and a weight of 64 MiB or
    more, or a long-row one of 16 MiB or more with 3072+ outputs whose K the split-K form cannot slice."""
    reasons, out, nbytes = _skinny(ctx, "GEMV")
    unsliced = _long_rows(ctx, nbytes) and not _slices(ctx) and out >= GEMV_MIN_OUT_FEATURES
    if nbytes < GEMV_MIN_WEIGHT_BYTES and not unsliced:
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"a {nbytes / 2**20:.0f} MiB weight of {out} x {ctx.hidden}: "
                                                   f"under {GEMV_MIN_WEIGHT_BYTES // 2**20} MiB cuBLAS or the "
                                                   f"split-K GEMV measured faster (but on rows of {GEMV_LONG_ROW}+ "
                                                   f"with {GEMV_MIN_OUT_FEATURES}+ outputs that do not slice)"))
    return reasons


def _splitk_shape(ctx: SelectionContext) -> list[Reason]:
    """The split-K linear runs where it measured faster than cuBLAS and the one-pass GEMV: few rows, long rows, a
    weight of 16 to 64 MiB whose K divides into its slices."""
    reasons, out, nbytes = _skinny(ctx, "split-K GEMV")
    if not _long_rows(ctx, nbytes):
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"a {nbytes / 2**20:.0f} MiB weight of {out} x {ctx.hidden}: the "
                                                   f"split-K GEMV measured faster only on rows of {GEMV_LONG_ROW}+, "
                                                   f"{GEMV_LONG_ROWS_MIN_BYTES // 2**20} to "
                                                   f"{GEMV_MIN_WEIGHT_BYTES // 2**20} MiB"))
    elif not _slices(ctx):
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"K = {ctx.hidden} is not a multiple of {SPLITK_SLICES} slices "
                                                   f"of {SPLITK_BLOCK_K}"))
    return reasons


REDUCE_NORM_PRIORITY = 75  # the two-op form, below the one-kernel form wherever that takes the rows
REDUCE_NORM_MAX_BLOCK = 16384  # the widest row one program holds in registers
REDUCE_NORM_MAX_ROWS = 64  # rows (programs) a call takes: each has its own call counter
REDUCE_NORM_SLOT_BYTES = 256 * 1024  # one rank's rows in one phase: 32 rows of a 4096-wide bf16 stream


def _reduce_norm_fits(ctx: SelectionContext) -> list[Reason]:
    """The one-kernel all-reduce + add + norm takes few rows (decode's): they travel through a fixed symmetric slot."""
    reasons = []
    if ctx.hidden > REDUCE_NORM_MAX_BLOCK:
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"hidden {ctx.hidden}: one program holds at most "
                                                   f"{REDUCE_NORM_MAX_BLOCK}"))
    nbytes = ctx.tokens * ctx.hidden * (ctx.dtype.itemsize if ctx.dtype is not None else 2)
    if ctx.tokens > REDUCE_NORM_MAX_ROWS or nbytes > REDUCE_NORM_SLOT_BYTES:
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"{ctx.tokens} rows ({nbytes // 1024} KiB): the symmetric slot "
                                                   f"takes at most {REDUCE_NORM_MAX_ROWS} rows and "
                                                   f"{REDUCE_NORM_SLOT_BYTES // 1024} KiB"))
    return reasons


def _argmax_shape(ctx: SelectionContext) -> list[Reason]:
    """The kernel reduces the last dim of a 2-D [rows, V]."""
    ndim = ctx.param("ndim", 2)
    if ndim != 2:
        return [Reason(R.CONSTRAINT_FAILED, f"a {ndim}-D input: the Triton argmax takes 2-D [rows, V]")]
    return []


def _experts_fit(experts: int) -> list[Reason]:
    """One program holds a token's scores in registers: at most MAX_ROUTED_EXPERTS of them."""
    if experts > MAX_ROUTED_EXPERTS:
        return [Reason(R.CONSTRAINT_FAILED, f"{experts} experts: the routing kernel holds at most "
                                            f"{MAX_ROUTED_EXPERTS} scores per token")]
    return []


def _route_experts(ctx: SelectionContext) -> list[Reason]:
    return _experts_fit(ctx.hidden)  # moe_route's "hidden" is the logits' width: the experts


def _gate_experts(ctx: SelectionContext) -> list[Reason]:
    return _experts_fit(ctx.param("experts"))


def _gate_decode(ctx: SelectionContext) -> list[Reason]:
    """The one-launch router and routing: at most MOE_GATE_ROWS tokens, one tile of rows."""
    reasons = _gate_experts(ctx)
    if ctx.tokens > MOE_GATE_ROWS:
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"{ctx.tokens} tokens: the one-launch router takes at most "
                                                   f"{MOE_GATE_ROWS}; more take the matmul and the routing kernel"))
    return reasons


MAX_LORA_RANK = 256  # lora_expand holds a row's whole (stacked) rank in one tile
# most rows the per-row LoRA kernels take: beyond, one tile of rows per adapter slot reads each adapter once
# (benchmarks/reports/lora_tiles_h200.md)
LORA_SHRINK_ROWS = 16
LORA_EXPAND_ROWS = 32


def _lora_rank(ctx: SelectionContext) -> list[Reason]:
    rank = ctx.param("rank")
    if rank > MAX_LORA_RANK:
        return [Reason(R.CONSTRAINT_FAILED, f"a stacked LoRA rank of {rank}: the expand kernel holds at most "
                                            f"{MAX_LORA_RANK} in one tile")]
    return []


def _few_rows(ctx: SelectionContext, limit: int) -> list[Reason]:
    if ctx.tokens > limit:
        return [Reason(R.CONSTRAINT_FAILED, f"{ctx.tokens} rows: past {limit} rows, reading each row's adapter on "
                                            "its own costs more than one tile of rows per adapter")]
    return []


def _lora_shrink_rows(ctx: SelectionContext) -> list[Reason]:
    return _few_rows(ctx, LORA_SHRINK_ROWS)


def _lora_expand_rows(ctx: SelectionContext) -> list[Reason]:
    return _few_rows(ctx, LORA_EXPAND_ROWS) + _lora_rank(ctx)


def _norm_router(ctx: SelectionContext) -> list[Reason]:
    """The norm-and-router kernel: a few tokens, a row in registers."""
    reasons = _gate_experts(ctx)
    if ctx.tokens > NORM_ROUTER_ROWS:
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"{ctx.tokens} tokens: the norm-and-router kernel takes at most "
                                                   f"{NORM_ROUTER_ROWS} (each program redoes its token's norm)"))
    if ctx.hidden > MAX_NORM_ROUTER_HIDDEN:
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"a hidden size of {ctx.hidden}: the norm-and-router kernel "
                                                   f"holds at most {MAX_NORM_ROUTER_HIDDEN} columns a row"))
    return reasons


def _folded_projection(ctx: SelectionContext) -> list[Reason]:
    """A fused op that sums its projection's split-K slices where it reads them: a projection given (params
    `proj_rows` x `proj_columns`, `proj_dtype`) in x's dtype, the skinny GEMVs' rows (GEMV_MAX_ROWS), a weight of the
    split-K GEMV's sizes, K in its slices."""
    rows, columns = ctx.param("proj_rows") or 0, ctx.param("proj_columns") or 0
    if not columns:
        return [Reason(R.CONSTRAINT_FAILED, "no projection to fold: the input is given already projected")]
    reasons = []
    proj_dtype = ctx.param("proj_dtype")
    if ctx.dtype is not None and proj_dtype != str(ctx.dtype).removeprefix("torch."):
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"a {proj_dtype} projection of {ctx.dtype} rows: the split-K GEMV "
                                                   "takes one dtype"))
    reasons += _gemv_rows(ctx, "projection's split-K GEMV")
    nbytes = rows * columns * (ctx.dtype.itemsize if ctx.dtype is not None else 2)
    if not _splitk_sized(nbytes):
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"a projection of {nbytes / 2**20:.1f} MiB: its slices are folded "
                                                   f"only from {GEMV_LONG_ROWS_MIN_BYTES // 2**20} to "
                                                   f"{GEMV_MIN_WEIGHT_BYTES // 2**20} MiB, the split-K GEMV's sizes"))
    splits, _, block_k = FUSED_SPLITK_TILE
    if columns % (splits * block_k):
        reasons.append(Reason(R.CONSTRAINT_FAILED, f"the projection's {columns} columns are not a multiple of the "
                                                   f"split-K GEMV's {splits} slices of {block_k}"))
    return reasons


def _reduce_norm_splitk(ctx: SelectionContext) -> list[Reason]:
    return _reduce_norm_fits(ctx) + _folded_projection(ctx)


def _norm_router_splitk(ctx: SelectionContext) -> list[Reason]:
    return _norm_router(ctx) + _folded_projection(ctx)


def _moe_routed_decode(ctx: SelectionContext) -> list[Reason]:
    """The decode path ranking each token's experts itself (its scores in registers): few pairs, as the other."""
    return _moe_decode_pairs(ctx) + _experts_fit(ctx.param("experts"))


def _moe_decode_pairs(ctx: SelectionContext) -> list[Reason]:
    """The sort-free path reads each pair's expert on its own: only while pairs are few."""
    if not ctx.param("decode_pairs"):
        return [Reason(R.CONSTRAINT_FAILED, f"more than {MOE_DECODE_PAIRS} (token, expert) pairs: pairs share "
                                            "experts, and the grouped GEMM reads each expert once")]
    return []


def _fp8_sm(ctx: SelectionContext) -> list[Reason]:
    if ctx.quant_format == "fp8_e4m3" and ctx.platform == "cuda" and (ctx.sm or 0) < 89:
        return [Reason(R.SM_TOO_OLD, f"float8_e4m3fn weights need SM89+, device is SM{ctx.sm}")]
    return []


def _moe_w8(ctx: SelectionContext) -> list[Reason]:
    """A K tile must sit inside one scale block of both projections: blocks span K or are powers of two >= 16."""
    bk, widest = ctx.param("block_size")[1], max(ctx.hidden, ctx.param("inner"))
    if bk < widest and (bk < 16 or bk & (bk - 1)):
        return [Reason(R.CONSTRAINT_FAILED, f"scale blocks of {bk} columns: needs blocks spanning the {widest} "
                                            "inputs or a power of two >= 16")] + _fp8_sm(ctx)
    return _fp8_sm(ctx)


def _moe_w8_decode(ctx: SelectionContext) -> list[Reason]:
    return _moe_w8(ctx) + _moe_decode_pairs(ctx)


def _varlen_launch(ctx: SelectionContext) -> LaunchConfig:
    # Grid (query tiles over every sequence's tokens, heads): T / 64 + N tiles, 64 the smallest tile used on CUDA.
    return LaunchConfig((max(1, ctx.tokens // 64 + ctx.batch), max(ctx.num_heads, 1), 1), 256)


def _paged_launch(ctx: SelectionContext) -> LaunchConfig:
    # Grid (sequences, KV heads, splits <= 64); at most 8 warps.
    return LaunchConfig((ctx.batch, max(ctx.num_kv_heads, 1), 1), 256)


def kernel_specs() -> list[KernelSpec]:
    """One spec per Triton kernel; platforms and graph safety follow TRITON_INTERPRET at call time."""
    interpreted = interpret_requested()
    version = _triton_version()
    common: dict[str, Any] = dict(
        backend="triton",
        version=version,
        platforms=frozenset({"cuda", "cpu"}) if interpreted else frozenset({"cuda"}),
        dtypes=FLOATS,
        graph_safe=not interpreted,
        available=available,
    )
    attention: dict[str, Any] = dict(common, max_head_dim=MAX_ATTENTION_HEAD_DIM, supports_gqa=True,
                                     supports_sliding_window=True)
    kv: dict[str, Any] = dict(kv_cache_layouts=frozenset({"NHD"}), kv_cache_dtypes=FLOATS,
                              kv_strategies=frozenset({"paged"}), requires_last_dim_contiguous=True)
    return [
        KernelSpec("triton.rms_norm", "rms_norm", impl=_lazy("norm", "rms_norm"), priority=PRIORITY, **common),
        KernelSpec("triton.fused_add_rms_norm", "fused_add_rms_norm", impl=_lazy("norm", "fused_add_rms_norm"),
                   priority=PRIORITY, **common),
        KernelSpec("triton.all_reduce_add_rms_norm", "all_reduce_add_rms_norm",
                   impl=_lazy("reduce_norm", "all_reduce_add_rms_norm"), priority=PRIORITY, check=_reduce_norm_fits,
                   **common),
        KernelSpec("triton.all_reduce_add_rms_norm_splitk", "all_reduce_add_rms_norm",
                   impl=_lazy("reduce_norm", "all_reduce_add_rms_norm_splitk"), priority=FOLD_PRIORITY,
                   check=_reduce_norm_splitk, **common),
        KernelSpec("triton.reduce_then_add_rms_norm", "all_reduce_add_rms_norm",
                   impl=_lazy("reduce_norm", "reduce_then_add_rms_norm"), priority=REDUCE_NORM_PRIORITY, **common),
        KernelSpec("triton.rope", "rope", impl=_lazy("rope", "rope"), priority=PRIORITY, head_dim_multiple=2,
                   **common),
        KernelSpec("triton.silu_and_mul", "silu_and_mul", impl=_lazy("activation", "silu_and_mul"),
                   priority=PRIORITY, **common),
        KernelSpec("triton.gelu_and_mul", "gelu_and_mul", impl=_lazy("activation", "gelu_and_mul"),
                   priority=PRIORITY, check=_gelu_mode, **common),
        KernelSpec("triton.linear", "linear", impl=_lazy("gemv", "linear_gemv"), priority=PRIORITY,
                   check=_gemv_shape, **common),
        KernelSpec("triton.linear_splitk", "linear", impl=_lazy("gemv", "linear_splitk"), priority=PRIORITY,
                   check=_splitk_shape, **common),
        KernelSpec("triton.linear_w8", "linear_w8", impl=_lazy("linear_w8", "linear_w8"), priority=PRIORITY,
                   quant_formats=frozenset({"int8", "fp8_e4m3"}), check=_w8_blocks, **common),
        KernelSpec("triton.linear_int4", "linear_int4", impl=_lazy("linear_int4", "linear_int4"), priority=PRIORITY,
                   check=_int4_groups, **common),
        KernelSpec("triton.argmax", "argmax", impl=_lazy("argmax", "argmax"), priority=PRIORITY,
                   requires_last_dim_contiguous=True, check=_argmax_shape, **common),
        KernelSpec("triton.fused_moe", "fused_moe", impl=_lazy("moe", "fused_moe"), priority=PRIORITY, **common),
        KernelSpec("triton.moe_route", "moe_route", impl=_lazy("moe_route", "moe_route"), priority=PRIORITY,
                   check=_route_experts, **common),
        KernelSpec("triton.moe_gate", "moe_gate", impl=_lazy("moe_route", "moe_gate"), priority=PRIORITY,
                   check=_gate_experts, **common),
        KernelSpec("triton.moe_gate_decode", "moe_gate", impl=_lazy("moe_route", "moe_gate_decode"),
                   priority=DECODE_PRIORITY, check=_gate_decode, **common),
        KernelSpec("triton.fused_moe_decode", "fused_moe", impl=_lazy("moe_decode", "fused_moe_decode"),
                   priority=DECODE_PRIORITY, check=_moe_decode_pairs, **common),
        KernelSpec("triton.fused_add_rms_norm_router_decode", "fused_add_rms_norm_router",
                   impl=_lazy("moe_route", "fused_add_rms_norm_router_decode"), priority=DECODE_PRIORITY,
                   check=_norm_router, **common),
        KernelSpec("triton.fused_add_rms_norm_router_splitk", "fused_add_rms_norm_router",
                   impl=_lazy("moe_route", "fused_add_rms_norm_router_splitk"), priority=FOLD_PRIORITY,
                   check=_norm_router_splitk, **common),
        KernelSpec("triton.fused_moe_routed_decode", "fused_moe_routed",
                   impl=_lazy("moe_decode", "fused_moe_routed_decode"), priority=DECODE_PRIORITY,
                   check=_moe_routed_decode, **common),
        KernelSpec("triton.fused_moe_w8", "fused_moe_w8", impl=_lazy("moe", "fused_moe_w8"), priority=PRIORITY,
                   quant_formats=frozenset({"int8", "fp8_e4m3"}), check=_moe_w8, **common),
        KernelSpec("triton.fused_moe_w8_decode", "fused_moe_w8", impl=_lazy("moe_decode", "fused_moe_w8_decode"),
                   priority=DECODE_PRIORITY, quant_formats=frozenset({"int8", "fp8_e4m3"}), check=_moe_w8_decode,
                   **common),
        KernelSpec("triton.lora_shrink", "lora_shrink", impl=_lazy("lora", "lora_shrink"), priority=PRIORITY,
                   check=_lora_rank, **common),
        KernelSpec("triton.lora_expand", "lora_expand", impl=_lazy("lora", "lora_expand"), priority=PRIORITY,
                   check=_lora_rank, **common),
        KernelSpec("triton.lora_shrink_rows", "lora_shrink", impl=_lazy("lora", "lora_shrink_rows"),
                   priority=DECODE_PRIORITY, check=_lora_shrink_rows, **common),
        KernelSpec("triton.lora_expand_rows", "lora_expand", impl=_lazy("lora", "lora_expand_rows"),
                   priority=DECODE_PRIORITY, check=_lora_expand_rows, **common),
        KernelSpec("triton.store_kv_cache", "store_kv_cache", impl=_lazy("kv_cache", "store_kv_cache"),
                   priority=PRIORITY, **common, **kv),
        KernelSpec("triton.rope_store_kv", "rope_store_kv", impl=_lazy("rope_kv", "rope_store_kv"),
                   priority=PRIORITY, head_dim_multiple=2, **common, **kv),
        KernelSpec("triton.rope_store_kv_splitk", "rope_store_kv", impl=_lazy("rope_kv", "rope_store_kv_splitk"),
                   priority=FOLD_PRIORITY, head_dim_multiple=2, check=_folded_projection, **common, **kv),
        KernelSpec("triton.paged_attention", "paged_attention", impl=_lazy("paged_attention", "paged_attention"),
                   priority=PRIORITY, launch=_paged_launch, **attention, **kv),
        KernelSpec("triton.paged_prefill_attention", "paged_prefill_attention",
                   impl=_lazy("varlen_attention", "paged_prefill_attention"), priority=PRIORITY,
                   layouts=frozenset({"THD"}), launch=_varlen_launch, **attention, **kv),
        KernelSpec("triton.varlen_attention", "varlen_attention",
                   impl=_lazy("varlen_attention", "varlen_attention"), priority=VARLEN_PRIORITY,
                   layouts=frozenset({"THD"}), launch=_varlen_launch, **attention),
    ]


def _triton_version() -> str:
    try:
        return metadata.version("triton")
    except metadata.PackageNotFoundError:
        return ""
