"""The native backend's kernel specs: each is available once its C library builds on this machine."""

from __future__ import annotations

from collections.abc import Callable

import torch

from layerzero.kernels.native import activation, amx, attention, gemm, linear, moe, norm, rope_kv
from layerzero.kernels.native.build import NativeBuildError, kernel, vector_isa
from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CONSTRAINT_FAILED, NOT_INSTALLED, Reason

PRIORITY = 70  # above torch's and oneDNN's CPU kernels and the reference
VERSION = "1"
FLOAT32 = frozenset({torch.float32})
BF16 = frozenset({torch.bfloat16})
# the KV caches the native kernels read and write (bf16: a CPU bf16 model's, each row widened exactly as it is read)
KV_DTYPES = frozenset({torch.float32, torch.bfloat16})


def _builds(library: str, symbol: str, argtypes: tuple[type, ...]) -> Callable[[], Reason | None]:
    def available() -> Reason | None:
        try:
            kernel(library, symbol, argtypes)
        except NativeBuildError as exc:
            return Reason(NOT_INSTALLED, str(exc))
        return None
    return available


def _all(*probes: Callable[[], Reason | None]) -> Callable[[], Reason | None]:
    """Available when every probe is: a composite of several native libraries."""
    def available() -> Reason | None:
        return next((reason for reason in (probe() for probe in probes) if reason is not None), None)
    return available


def _groups(ctx: SelectionContext) -> list[Reason]:
    group = ctx.param("group_size")
    if group is not None and group % linear.CHUNK:
        return [Reason(CONSTRAINT_FAILED,
                       f"group_size {group}: the native kernel reads whole {linear.CHUNK}-column chunks")]
    return []


def _w8_blocks(ctx: SelectionContext) -> list[Reason]:
    block = ctx.param("block_size")
    if block is not None and (block[0] != 1 or block[1] % linear.HALF or ctx.hidden % block[1]):
        return [Reason(CONSTRAINT_FAILED, f"scale blocks {tuple(block)}: the native int8 kernel takes one row by a "
                                          f"multiple of {linear.HALF} columns that divides the {ctx.hidden} inputs")]
    return []


def _moe_int4(ctx: SelectionContext) -> list[Reason]:
    group = ctx.param("group_size")
    if group % linear.CHUNK or ctx.hidden % group or ctx.param("inner") % group:
        return [Reason(CONSTRAINT_FAILED, f"group_size {group}: the native kernel reads whole {linear.CHUNK}-column "
                                          "chunks of groups that divide both projections' inputs")]
    return _moe_activation(ctx)


def _moe_w8(ctx: SelectionContext) -> list[Reason]:
    block = ctx.param("block_size")
    if block[0] != 1 or block[1] % linear.HALF or ctx.hidden % block[1] or ctx.param("inner") % block[1]:
        return [Reason(CONSTRAINT_FAILED, f"scale blocks {tuple(block)}: the native int8 experts take one row by a "
                                          f"multiple of {linear.HALF} columns that divides both projections' inputs")]
    return _moe_activation(ctx)


def _moe_dense(ctx: SelectionContext) -> list[Reason]:
    """float32 rows through float32 or bfloat16 experts whose projections' inputs are whole 16-column steps."""
    if ctx.param("weight_dtype") not in ("float32", "bfloat16"):
        return [Reason(CONSTRAINT_FAILED, f"{ctx.param('weight_dtype')} experts: takes float32 or bfloat16 stacks, "
                                          "both of one dtype")]
    if ctx.hidden % moe.DENSE_STEP or ctx.param("inner") % moe.DENSE_STEP:
        return [Reason(CONSTRAINT_FAILED, f"hidden {ctx.hidden}, expert intermediate {ctx.param('inner')}: the dense "
                                          f"tiles read whole {moe.DENSE_STEP}-column steps")]
    return _moe_activation(ctx)


def _moe_activation(ctx: SelectionContext) -> list[Reason]:
    if ctx.param("activation") not in moe.ACTIVATIONS:
        return [Reason(CONSTRAINT_FAILED, f"activation {ctx.param('activation')!r}: takes {sorted(moe.ACTIVATIONS)}")]
    return []


def _gemv_steps(ctx: SelectionContext, name: str, max_rows: int, past: str) -> list[Reason]:
    """The dense GEMVs' shape: rows that split into 16-column steps, at most `max_rows` of them."""
    if ctx.hidden % linear.HALF:
        return [Reason(CONSTRAINT_FAILED, f"{ctx.hidden} inputs: the {name} reads {linear.HALF} columns a step")]
    if ctx.tokens > max_rows:
        return [Reason(CONSTRAINT_FAILED, f"{ctx.tokens} rows: past {max_rows} {past}")]
    return []


def _bf16_weight(ctx: SelectionContext) -> list[Reason]:
    """float32 x times a bfloat16 weight whose rows split into 16-column steps."""
    if ctx.param("weight_dtype") != "bfloat16" or ctx.dtype != torch.float32:
        # never through the dispatcher's float32 cast: that would widen the weight too
        return [Reason(CONSTRAINT_FAILED, "takes bfloat16 weights with float32 activations only")]
    return _gemv_steps(ctx, "bf16 kernel", linear.BF16_MAX_ROWS,
                       "a GEMM is faster: a bf16 one (AMX, AVX512-BF16; benchmarks/reports/cpu_vs_vllm.md), on "
                       "AVX2 oneDNN's float32 one (docs/quantization.md, \"AVX2\")")


def _f32_weight(ctx: SelectionContext) -> list[Reason]:
    """float32 x times a float32 weight whose rows split into 16-column steps, at a decode's few rows."""
    if (ctx.param("weight_dtype") or "float32") != "float32":
        return [Reason(CONSTRAINT_FAILED, "takes float32 weights only")]
    return _gemv_steps(ctx, "float32 GEMV", linear.F32_MAX_ROWS,
                       "a GEMM is faster (on AVX2 the native one, elsewhere oneDNN's: "
                       "benchmarks/reports/cpu_f32_gemv.md)")


def _gemm_rows(ctx: SelectionContext) -> list[Reason]:
    """float32 rows past the float32 GEMV's, times a float32 or bfloat16 weight, on a CPU whose vectors are AVX2 (with
    AVX-512 oneDNN's GEMM was not measured against it)."""
    if (ctx.param("weight_dtype") or "float32") not in ("float32", "bfloat16") or ctx.dtype != torch.float32:
        return [Reason(CONSTRAINT_FAILED, "takes float32 rows times float32 or bfloat16 weights only")]
    if vector_isa() != "AVX2":
        return [Reason(CONSTRAINT_FAILED, f"{vector_isa()} vectors: the GEMM is measured (and faster than oneDNN's) "
                                          "on AVX2 CPUs only")]
    if ctx.tokens <= linear.F32_MAX_ROWS:
        return [Reason(CONSTRAINT_FAILED, f"{ctx.tokens} rows: the GEMVs take up to {linear.F32_MAX_ROWS}")]
    return []


def _amx_weight(ctx: SelectionContext) -> list[Reason]:
    """A bfloat16 weight whose inputs split into AMX's 32-column steps; float32 x only past the exact GEMV's rows."""
    if ctx.param("weight_dtype") != "bfloat16":
        return [Reason(CONSTRAINT_FAILED, "multiplies bfloat16 weights only")]
    if ctx.hidden % amx.KSTEP:
        return [Reason(CONSTRAINT_FAILED, f"{ctx.hidden} inputs: AMX reads {amx.KSTEP} columns a tile")]
    if ctx.dtype == torch.float32 and ctx.tokens <= linear.BF16_MAX_ROWS:
        return [Reason(CONSTRAINT_FAILED, f"{ctx.tokens} float32 rows: the bf16 GEMV keeps them exact up to "
                                          f"{linear.BF16_MAX_ROWS}")]
    if ctx.tokens > amx.MAX_ROWS:
        return [Reason(CONSTRAINT_FAILED, f"{ctx.tokens} rows: past {amx.MAX_ROWS} oneDNN's bf16 GEMM is faster "
                                          "(benchmarks/reports/cpu_amx_gemm.md)")]
    return []


def _amx_available() -> Reason | None:
    if (reason := _builds("amx_linear", "amx_linear", amx.ARGS)()) is not None:
        return reason
    if not amx.available():
        return Reason(NOT_INSTALLED, "no AMX here: the CPU lacks AMX-BF16 (or Linux refused its tile state)")
    return None


def _float32_residual(ctx: SelectionContext) -> list[Reason]:
    """bf16 rows added to a float32 residual stream (a CPU bf16 model's projection output): the sum stays float32."""
    if ctx.param("residual_dtype") != "float32":
        return [Reason(CONSTRAINT_FAILED, f"a {ctx.param('residual_dtype')} residual: adds bfloat16 rows to a float32 "
                                          "residual only")]
    return []


def kernel_specs() -> list[KernelSpec]:
    cpu = frozenset({"cpu"})
    norms = _builds("norm", "rms_norm", norm.ARGS)
    paged = _builds("attention", "paged_attention", attention.ARGS)
    gates = _builds("activation", "gated_activation", activation.ARGS)
    gates_bf16 = _builds("activation", "gated_activation_bf16", activation.ARGS)
    ropes = _builds("rope", "rope", rope_kv.ROPE_ARGS)
    stores = _builds("kv_cache", "store_kv_cache", rope_kv.STORE_ARGS)
    experts = _builds("quant_linear", "moe_quant", moe.ARGS)
    return [
        KernelSpec("native.linear_int4_cpu", "linear_int4", "native", linear.linear_int4, VERSION, platforms=cpu,
                   dtypes=frozenset({torch.float32, torch.bfloat16}), priority=PRIORITY, check=_groups,
                   available=_builds("quant_linear", "int4_linear", linear.ARGS)),
        KernelSpec("native.linear_w8_int8_cpu", "linear_w8", "native", linear.linear_w8_int8, VERSION, platforms=cpu,
                   dtypes=frozenset({torch.float32, torch.bfloat16}), priority=PRIORITY,
                   quant_formats=frozenset({"int8"}), check=_w8_blocks,
                   available=_builds("quant_linear", "int8_linear", linear.W8_ARGS)),
        KernelSpec("native.linear_bf16_cpu", "linear", "native", linear.linear_bf16, VERSION, platforms=cpu,
                   dtypes=FLOAT32, priority=PRIORITY, check=_bf16_weight,
                   available=_builds("quant_linear", "bf16_linear", linear.DENSE_ARGS)),
        KernelSpec("native.linear_f32_cpu", "linear", "native", linear.linear_f32, VERSION, platforms=cpu,
                   dtypes=FLOAT32, priority=PRIORITY, check=_f32_weight,
                   available=_builds("quant_linear", "f32_linear", linear.DENSE_ARGS)),
        KernelSpec("native.linear_f32_gemm_cpu", "linear", "native", gemm.linear, VERSION, platforms=cpu,
                   dtypes=FLOAT32, priority=PRIORITY, check=_gemm_rows,
                   available=_builds("f32_gemm", "f32_gemm", gemm.ARGS)),
        KernelSpec("native.linear_bf16_amx_cpu", "linear", "native", amx.linear, VERSION, platforms=cpu,
                   dtypes=FLOAT32 | BF16, priority=PRIORITY, check=_amx_weight, available=_amx_available),
        KernelSpec("native.fused_moe_cpu", "fused_moe", "native", moe.fused_moe, VERSION, platforms=cpu,
                   dtypes=FLOAT32, priority=PRIORITY, check=_moe_dense, available=experts),
        KernelSpec("native.fused_moe_int4_cpu", "fused_moe_int4", "native", moe.fused_moe_int4, VERSION,
                   platforms=cpu, dtypes=FLOAT32, priority=PRIORITY, check=_moe_int4, available=experts),
        KernelSpec("native.fused_moe_w8_int8_cpu", "fused_moe_w8", "native", moe.fused_moe_w8_int8, VERSION,
                   platforms=cpu, dtypes=FLOAT32, priority=PRIORITY, quant_formats=frozenset({"int8"}),
                   check=_moe_w8, available=experts),
        KernelSpec("native.rms_norm_cpu", "rms_norm", "native", norm.rms_norm, VERSION, platforms=cpu, dtypes=FLOAT32,
                   priority=PRIORITY, available=norms),
        KernelSpec("native.fused_add_rms_norm_cpu", "fused_add_rms_norm", "native", norm.fused_add_rms_norm, VERSION,
                   platforms=cpu, dtypes=FLOAT32, priority=PRIORITY, available=norms),
        KernelSpec("native.add_rms_norm_bf16_cpu", "fused_add_rms_norm", "native", norm.fused_add_rms_norm, VERSION,
                   platforms=cpu, dtypes=BF16, priority=PRIORITY, check=_float32_residual,
                   available=_builds("norm", "add_rms_norm_bf16", norm.ARGS)),
        KernelSpec("native.paged_attention_cpu", "paged_attention", "native", attention.paged_attention, VERSION,
                   platforms=cpu, dtypes=FLOAT32, kv_cache_dtypes=KV_DTYPES, priority=PRIORITY, available=paged),
        KernelSpec("native.paged_prefill_attention_cpu", "paged_prefill_attention", "native",
                   attention.paged_prefill_attention, VERSION, platforms=cpu, dtypes=FLOAT32,
                   kv_cache_dtypes=KV_DTYPES, priority=PRIORITY, available=paged),
        KernelSpec("native.silu_and_mul_cpu", "silu_and_mul", "native", activation.silu_and_mul, VERSION,
                   platforms=cpu, dtypes=FLOAT32, priority=PRIORITY, available=gates),
        KernelSpec("native.gelu_and_mul_cpu", "gelu_and_mul", "native", activation.gelu_and_mul, VERSION,
                   platforms=cpu, dtypes=FLOAT32, priority=PRIORITY, available=gates),
        KernelSpec("native.silu_and_mul_bf16_cpu", "silu_and_mul", "native", activation.silu_and_mul, VERSION,
                   platforms=cpu, dtypes=BF16, priority=PRIORITY, available=gates_bf16),
        KernelSpec("native.gelu_and_mul_bf16_cpu", "gelu_and_mul", "native", activation.gelu_and_mul, VERSION,
                   platforms=cpu, dtypes=BF16, priority=PRIORITY, available=gates_bf16),
        KernelSpec("native.rope_cpu", "rope", "native", rope_kv.rope, VERSION, platforms=cpu, dtypes=FLOAT32,
                   priority=PRIORITY, available=ropes),
        KernelSpec("native.store_kv_cache_cpu", "store_kv_cache", "native", rope_kv.store_kv_cache, VERSION,
                   platforms=cpu, dtypes=FLOAT32, kv_cache_dtypes=KV_DTYPES, priority=PRIORITY, available=stores),
        KernelSpec("native.rope_store_kv_cpu", "rope_store_kv", "native", rope_kv.rope_store_kv, VERSION,
                   platforms=cpu, dtypes=FLOAT32, kv_cache_dtypes=KV_DTYPES, priority=PRIORITY,
                   available=_all(norms, ropes, stores)),
    ]
