"""Every reason code has a context that triggers it (and the same kernel passes without the trigger)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

import layerzero as lz
from layerzero.extend import capabilities
from layerzero.extend.capabilities import apply_descriptor
from layerzero.kernels.optional import probe
from layerzero.select import constraints
from layerzero.select import reasons as R
from layerzero.select.context import SelectionContext
from layerzero.select.engine import SelectionEngine
from layerzero.select.errors import KernelLockError
from layerzero.select.kernel_spec import KernelSpec, LaunchConfig
from layerzero.select.registry import Registry

BASE = SelectionContext(
    op="attention", device="cuda:0", platform="cuda", sm=90, cuda_version=(12, 4), dtype=torch.float16, batch=2,
    seq_q=128, seq_k=128, tokens=256, num_heads=8, num_kv_heads=8, head_dim=128, layout="BSHD",
)


def spec(kernel_id: str = "t.k", op: str = "attention", **kw) -> KernelSpec:
    return KernelSpec(kernel_id=kernel_id, op=op, backend=kernel_id.split(".")[0], impl=lambda *a, **k: None, **kw)


def _raise(ctx):
    raise RuntimeError("broken check")


# code -> (spec fields, context changes)
DECLARATIVE = {
    R.PLATFORM_MISMATCH: ({"platforms": frozenset({"cpu"})}, {}),
    R.SM_TOO_OLD: ({"min_sm": 100}, {}),
    R.SM_TOO_NEW: ({"max_sm": 80}, {}),
    R.DTYPE_UNSUPPORTED: ({"dtypes": frozenset({torch.bfloat16})}, {}),
    R.HEAD_DIM_INVALID: ({"max_head_dim": 64}, {}),
    R.HEAD_DIM_ALIGNMENT: ({"head_dim_multiple": 48}, {}),
    R.SEQ_TOO_LONG: ({"max_seq_len": 4096}, {"seq_k": 5000}),
    R.GQA_UNSUPPORTED: ({"supports_gqa": False}, {"num_kv_heads": 2}),
    R.CUDA_GRAPH_UNSAFE: ({}, {"capturing": True}),
    R.ATTN_MASK_UNSUPPORTED: ({}, {"attn_mask_type": "float"}),
    R.STRIDE_LAST_DIM: ({"requires_last_dim_contiguous": True}, {"last_dim_contiguous": False}),
    R.KV_CACHE_LAYOUT_MISMATCH: ({"kv_cache_layouts": frozenset({"HND"})}, {"kv_cache_layout": "NHD"}),
    R.KV_CACHE_DTYPE_MISMATCH: ({"kv_cache_dtypes": frozenset({torch.float16})}, {"kv_cache_dtype": torch.float32}),
    R.PACKED_WEIGHTS_REQUIRED: ({"requires_packed_weights": True}, {}),
    R.NON_DETERMINISTIC: ({"deterministic": False}, {"deterministic": True}),
    R.CONSTRAINT_FAILED: ({"check": _raise}, {}),
    R.CUDA_BLOCK_LIMIT_EXCEEDED: ({"launch": lambda c: LaunchConfig((c.batch * c.num_heads, 1, 1), 2048)}, {}),
    R.CUDA_GRID_DIM_EXCEEDED: ({"launch": lambda c: LaunchConfig((1, c.batch * c.seq_q, 1), 128)}, {"seq_q": 40000}),
    R.QUANT_FORMAT_UNSUPPORTED: ({"quant_formats": frozenset({"int8"})}, {"quant_format": "nvfp4"}),
    R.KV_STRATEGY_UNSUPPORTED: ({"kv_strategies": frozenset({"paged"})}, {"kv_strategy": "virtual"}),
    R.DRIVER_VERSION_UNSUPPORTED: ({"min_cuda_version": (13, 0)}, {}),
    R.SLIDING_WINDOW_UNSUPPORTED: ({"supports_sliding_window": False}, {"sliding_window": True}),
    R.LAYOUT_UNSUPPORTED: ({"op": "paged_attention", "layouts": frozenset({"HND"})}, {"op": "paged_attention", "layout": "NHD"}),
}
# codes raised outside constraints.check: each has its own test below
ENGINE_LEVEL = {R.NOT_INSTALLED, R.BACKEND_IMPORT_FAILED, R.CAPABILITIES_SCHEMA_MISMATCH, R.POLICY_BLOCKED,
                R.CIRCUIT_OPEN, R.OP_UNSUPPORTED}


def test_every_code_is_covered():
    assert set(DECLARATIVE) | ENGINE_LEVEL == R.ALL_CODES


def _codes(kernel: KernelSpec, ctx: SelectionContext) -> list[str]:
    return [r.code for r in constraints.check(kernel, ctx, strict=False, deterministic=False)[0]]


@pytest.mark.parametrize("code", sorted(DECLARATIVE))
def test_declarative_reason_triggers(code):
    fields, changes = DECLARATIVE[code]
    op = fields.get("op", BASE.op)
    kernel = spec(**{"graph_safe": code != R.CUDA_GRAPH_UNSAFE, **fields})
    triggered = constraints.check(kernel, BASE.with_(**changes), strict=False, deterministic=False)[0]
    assert [r.code for r in triggered] == [code]
    assert triggered[0].message
    if set(changes) - {"op", "layout"}:  # the kernel alone does not trigger it: the context change does
        assert _codes(kernel, BASE.with_(op=op)) == []
    if set(fields) - {"op"}:  # the context alone does not trigger it: the kernel's constraint does
        assert _codes(spec(op=op, graph_safe=True), BASE.with_(**changes)) == []


def _engine(*specs: KernelSpec) -> SelectionEngine:
    registry = Registry()
    for s in specs:
        registry.register(s)
    return SelectionEngine(registry, perfdb=lambda: None)


def _reasons(engine: SelectionEngine, ctx: SelectionContext, kernel_id: str) -> list[str]:
    report = engine.explain(ctx)
    return [r.code for c in report.candidates if c.kernel_id == kernel_id for r in c.reasons]


def test_not_installed():
    engine = _engine(spec("ghost.k", available=probe("ghost-kernels", "lz_no_such_module_for_tests")))
    assert _reasons(engine, BASE, "ghost.k") == [R.NOT_INSTALLED]


def test_backend_import_failed(tmp_path, monkeypatch):
    package = tmp_path / "lz_broken_backend_for_tests"
    package.mkdir()
    (package / "__init__.py").write_text(textwrap.dedent("raise ImportError('undefined symbol: _ZN3c10 (ABI mismatch)')"))
    monkeypatch.syspath_prepend(str(tmp_path))
    engine = _engine(spec("broken.k", available=probe("broken", "lz_broken_backend_for_tests")))
    assert _reasons(engine, BASE, "broken.k") == [R.BACKEND_IMPORT_FAILED]
    sys.modules.pop("lz_broken_backend_for_tests", None)


def test_capabilities_schema_mismatch(monkeypatch):
    monkeypatch.setattr(capabilities, "_statuses", {})  # the broken descriptor must not outlive the test
    (constrained,) = apply_descriptor([spec("caps.k")], {"schema_version": "v0", "backend": "caps"})
    engine = _engine(constrained)
    assert _reasons(engine, BASE, "caps.k") == [R.CAPABILITIES_SCHEMA_MISMATCH]


def test_policy_blocked_while_disabled():
    engine = _engine(spec("fast.k", graph_safe=True), spec("ref.k", is_reference=True))
    with lz.disabled():
        assert _reasons(engine, BASE, "fast.k") == [R.POLICY_BLOCKED]
        assert engine.select(BASE).kernel_id == "ref.k"
    assert engine.select(BASE).kernel_id == "fast.k"


def test_circuit_open_after_failures():
    engine = _engine(spec("flaky.k"), spec("ref.k", is_reference=True))
    for _ in range(engine.breaker.threshold):
        engine.breaker.record_failure("flaky", RuntimeError("illegal memory access"))
    assert _reasons(engine, BASE, "flaky.k") == [R.CIRCUIT_OPEN]


def test_op_unsupported_lock():
    engine = _engine(spec("norm.k", op="rms_norm"), spec("ref.k", is_reference=True))
    lz.lock("attention", "norm.k")
    try:
        with pytest.raises(KernelLockError) as err:
            engine.select(BASE)
        assert [r.code for r in err.value.reasons] == [R.OP_UNSUPPORTED]
    finally:
        lz.unlock("attention")


def test_reason_is_json_friendly():
    reason = R.Reason(R.SM_TOO_OLD, "requires SM90+")
    assert reason.to_dict() == {"code": "SM_TOO_OLD", "message": "requires SM90+"}
    assert str(reason) == "[SM_TOO_OLD] requires SM90+"
