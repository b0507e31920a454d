"""The Triton backend's KernelSpecs: coverage, platform and graph-safety rules, availability reasons."""

from __future__ import annotations

import sys

import pytest
import torch

from layerzero.kernels.triton import specs
from layerzero.select import reasons as R
from layerzero.select.context import SelectionContext

OPS = {"rms_norm", "fused_add_rms_norm", "rope", "silu_and_mul", "gelu_and_mul", "store_kv_cache", "rope_store_kv",
       "paged_attention", "paged_prefill_attention", "varlen_attention", "linear_w8", "linear_int4", "linear",
       "argmax", "fused_moe", "fused_moe_w8", "moe_route", "moe_gate", "lora_shrink", "lora_expand",
       "all_reduce_add_rms_norm", "fused_add_rms_norm_router", "fused_moe_routed"}


# an op's further kernels, for a regime the first serves badly (the *_splitk ones: with the op's projection folded in)
SECOND_KERNELS = {"triton.fused_moe_decode": "fused_moe", "triton.moe_gate_decode": "moe_gate", "triton.fused_moe_w8_decode": "fused_moe_w8",
                  "triton.lora_shrink_rows": "lora_shrink", "triton.lora_expand_rows": "lora_expand",
                  "triton.reduce_then_add_rms_norm": "all_reduce_add_rms_norm", "triton.linear_splitk": "linear",
                  "triton.fused_add_rms_norm_router_decode": "fused_add_rms_norm_router",
                  "triton.fused_moe_routed_decode": "fused_moe_routed",
                  "triton.fused_add_rms_norm_router_splitk": "fused_add_rms_norm_router",
                  "triton.rope_store_kv_splitk": "rope_store_kv",
                  "triton.all_reduce_add_rms_norm_splitk": "all_reduce_add_rms_norm"}
# ops whose only Triton kernel serves a few tokens (more take the torch backend's composition of their parts)
DECODE_ONLY = {"fused_add_rms_norm_router", "fused_moe_routed"}


def test_one_spec_per_kernel_family(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    got = specs.kernel_specs()
    assert {s.op for s in got} == OPS and len(got) == len(OPS) - len(DECODE_ONLY) + len(SECOND_KERNELS)
    for spec in got:
        assert spec.kernel_id in (f"triton.{spec.op}", *(k for k, op in SECOND_KERNELS.items() if op == spec.op))
        assert spec.backend == "triton"
        assert spec.platforms == {"cuda"} and spec.graph_safe
        assert spec.dtypes == {torch.float16, torch.bfloat16, torch.float32}
        assert spec.priority > 50 and spec.available is specs.available


def test_interpreter_adds_cpu_and_drops_graph_safety(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for spec in specs.kernel_specs():
        assert spec.platforms == {"cuda", "cpu"} and not spec.graph_safe


def test_attention_limits():
    by_op = {s.op: s for s in specs.kernel_specs()}
    for op in ("paged_attention", "varlen_attention"):
        assert by_op[op].max_head_dim == 256 and by_op[op].supports_gqa and by_op[op].supports_sliding_window
    assert by_op["rope"].head_dim_multiple == 2
    assert by_op["paged_attention"].kv_cache_dtypes == specs.FLOATS


def test_availability_reasons(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert specs.available().code == R.PLATFORM_MISMATCH
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert specs.available() is None
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton now raises ImportError
    assert specs.available().code == R.NOT_INSTALLED


@pytest.mark.parametrize("mode", ["tanh", "none", "exact"])
def test_gelu_mode_check(mode):
    gelu = next(s for s in specs.kernel_specs() if s.op == "gelu_and_mul")
    ctx = SelectionContext.from_tensors("gelu_and_mul", torch.randn(2, 8), approximate=mode)
    assert [r.code for r in gelu.check(ctx)] == ([] if mode != "exact" else [R.CONSTRAINT_FAILED])


@pytest.mark.parametrize(("group", "ok"), [(32, True), (128, True), (16, True), (24, False), (8, False)])
def test_int4_group_check(group, ok):
    int4 = next(s for s in specs.kernel_specs() if s.op == "linear_int4")
    ctx = SelectionContext(op="linear_int4", params=(("group_size", group),))
    assert [r.code for r in int4.check(ctx)] == ([] if ok else [R.CONSTRAINT_FAILED])


def test_varlen_launch_reports_the_flat_tile_grid():
    """Query tiles over every sequence's tokens (T / 64 + N) by heads: 70,000 sequences no longer need a grid
    dimension of their own."""
    varlen = next(s for s in specs.kernel_specs() if s.op == "varlen_attention")
    ctx = SelectionContext(op="varlen_attention", batch=70000, seq_q=300, tokens=70000 * 300, num_heads=32)
    assert varlen.launch(ctx).grid == (70000 * 300 // 64 + 70000, 32, 1)


@pytest.mark.parametrize("rows, shrink, expand", [(1, "rows", "rows"), (16, "rows", "rows"), (17, "tiles", "rows"),
                                                  (32, "tiles", "rows"), (33, "tiles", "tiles")])
def test_lora_kernels_split_by_row_count(rows, shrink, expand):
    """Per-row LoRA kernels for a decode's few rows, slot tiles past them; a stacked rank over one tile is refused."""
    by_id = {s.kernel_id: s for s in specs.kernel_specs()}

    def ok(kernel: str, rank: int = 48) -> bool:
        ctx = SelectionContext(op=by_id[kernel].op, tokens=rows, hidden=64, params=(("slots", 4), ("rank", rank)))
        return not by_id[kernel].check(ctx)

    assert ok("triton.lora_shrink_rows") == (shrink == "rows")
    assert ok("triton.lora_expand_rows") == (expand == "rows")
    assert ok("triton.lora_shrink") and ok("triton.lora_expand")
    assert not ok("triton.lora_expand", rank=300)


@pytest.mark.parametrize(("rows", "hidden", "dtype", "fits"), [
    (1, 4096, torch.bfloat16, True),
    (32, 4096, torch.bfloat16, True),  # 256 KiB: one slot
    (33, 4096, torch.bfloat16, False),
    (16, 4096, torch.float32, True),
    (64, 1024, torch.bfloat16, True),
    (65, 512, torch.bfloat16, False),  # a flag per row: at most 64 rows
    (1, 32768, torch.bfloat16, False),  # wider than one program's registers
])
def test_one_kernel_reduce_norm_takes_decode_rows(rows, hidden, dtype, fits):
    """The one-kernel all-reduce + add + norm takes rows that fit its symmetric slot; the two-op form takes the rest."""
    ctx = SelectionContext(op="all_reduce_add_rms_norm", device="cuda", platform="cuda", dtype=dtype, tokens=rows,
                           hidden=hidden)
    reasons = specs._reduce_norm_fits(ctx)
    assert (not reasons) is fits
    assert all(r.code == R.CONSTRAINT_FAILED for r in reasons)



@pytest.mark.parametrize(("rows", "proj", "fits"), [
    (1, (4096, 2048), True),  # Llama-3.1-8B's O shard at TP=2 (16 MiB)
    (8, (4096, 7168), True),  # its down shard (56 MiB)
    (9, (4096, 2048), False),  # more rows than the split-K GEMV takes
    (1, (2048, 2048), False),  # 8 MiB: below the split-K GEMV's sizes
    (1, (4096, 14336), False),  # 112 MiB: the one-pass GEMV's
    (1, (4096, 2304), False),  # K not in the fused tile's slices
    (1, None, False),  # nothing to fold
])
def test_reduce_norm_folds_a_projection_of_the_split_k_sizes(rows, proj, fits):
    """The reduce-and-norm that sums its projection's split-K slices takes what the one-kernel form and the split-K
    GEMV both take; the other kernels of the op project first."""
    columns = proj[1] if proj else 0
    ctx = SelectionContext(op="all_reduce_add_rms_norm", device="cuda", platform="cuda", dtype=torch.bfloat16,
                           tokens=rows, hidden=4096, params=(("proj_rows", proj[0] if proj else 0),
                                                             ("proj_columns", columns), ("proj_dtype", "bfloat16")))
    reasons = specs._reduce_norm_splitk(ctx)
    assert (not reasons) is fits, reasons
    assert all(r.code == R.CONSTRAINT_FAILED for r in reasons)
