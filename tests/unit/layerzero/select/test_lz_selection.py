"""SelectionEngine: order (priority, policy, PerfDB, adaptation penalty), strict mode, locks, errors, explain."""

from __future__ import annotations

import json

import pytest
import torch

import layerzero as lz
from layerzero.perf.perfdb import PerfStats
from layerzero.policy import state as policy
from layerzero.select import reasons as R
from layerzero.select.context import SelectionContext
from layerzero.select.engine import SelectionEngine
from layerzero.select.errors import CudaGraphUnsafeError, KernelLockError, NoKernelFoundError
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.registry import Registry

CTX = SelectionContext(op="attention", device="cuda:0", platform="cuda", sm=90, dtype=torch.float16, batch=2,
                       seq_q=64, seq_k=64, tokens=128, num_heads=8, num_kv_heads=8, head_dim=64, layout="BSHD")


@pytest.fixture(autouse=True)
def _fresh_policy():
    policy.reset()
    yield
    policy.reset()


def spec(kernel_id: str, priority: int = 50, **kw) -> KernelSpec:
    kw.setdefault("op", "attention")
    return KernelSpec(kernel_id=kernel_id, backend=kernel_id.split(".")[0], impl=lambda *a, **k: None,
                      priority=priority, **kw)


def engine_of(*specs: KernelSpec, perfdb=None) -> SelectionEngine:
    registry = Registry()
    for s in specs:
        registry.register(s)
    return SelectionEngine(registry, perfdb=lambda: perfdb)


def test_highest_priority_wins_and_explain_ranks_all():
    engine = engine_of(spec("a.k", 60), spec("b.k", 80), spec("ref.k", 10, is_reference=True),
                       spec("cpu.k", 99, platforms=frozenset({"cpu"})))
    assert engine.select(CTX).kernel_id == "b.k"
    report = engine.explain(CTX)
    assert [c.kernel_id for c in report.candidates] == ["b.k", "a.k", "ref.k", "cpu.k"]
    assert [c.score for c in report.candidates[:3]] == [80.0, 60.0, 10.0]
    assert report.candidates[3].valid is False and report.candidates[3].reasons[0].code == R.PLATFORM_MISMATCH
    assert report.selected == "b.k"
    assert json.loads(json.dumps(report.to_dict()))["selected"] == "b.k"
    assert "cpu.k: [PLATFORM_MISMATCH]" in str(report)


def test_policy_prefer_and_avoid():
    engine = engine_of(spec("a.k", 60), spec("b.k", 80))
    with lz.prefer("a"):
        assert engine.select(CTX).kernel_id == "a.k"
    assert engine.select(CTX).kernel_id == "b.k"
    lz.configure(avoid_sources=["b"])
    assert engine.select(CTX).kernel_id == "a.k"


class FakePerfDB:
    def __init__(self, stats: dict[str, PerfStats]) -> None:
        self.stats = stats

    def lookup(self, op, kernel_id, bucket, device_sig, **kw):
        return self.stats.get(kernel_id)


@pytest.mark.parametrize("confidence, winner", [(1.0, "fast.k"), (0.1, "slow.k")])
def test_perfdb_timings_weighted_by_confidence(confidence, winner, monkeypatch):
    monkeypatch.setattr("layerzero.select.engine.device_signature", lambda device: "test-device")
    db = FakePerfDB({"fast.k": PerfStats(100.0, 95.0, 105.0, 20, confidence),
                     "slow.k": PerfStats(400.0, 390.0, 410.0, 20, confidence)})
    engine = engine_of(spec("fast.k", 55), spec("slow.k", 60), perfdb=db)
    assert engine.select(CTX).kernel_id == winner
    slow = next(c for c in engine.explain(CTX).candidates if c.kernel_id == "slow.k")
    assert slow.breakdown["perf"] == pytest.approx(-30.0 * confidence)
    assert slow.perf["median_us"] == 400.0


def test_layout_adaptation_is_penalized_and_strict_mode_forbids_it():
    engine = engine_of(spec("bhsd.k", 52, layouts=frozenset({"BHSD"})), spec("any.k", 50))
    assert engine.select(CTX).kernel_id == "any.k"  # 52 - 5 (transpose) < 50
    engine = engine_of(spec("bhsd.k", 60, layouts=frozenset({"BHSD"})), spec("any.k", 50))
    choice = engine.choose(CTX)
    assert choice.spec.kernel_id == "bhsd.k" and choice.adaptation.layout == "BHSD" and choice.score == 55.0
    lz.configure(strict_mode=True)
    assert engine.select(CTX).kernel_id == "any.k"
    rejected = next(c for c in engine.explain(CTX).candidates if c.kernel_id == "bhsd.k")
    assert rejected.reasons[0].code == R.LAYOUT_UNSUPPORTED and "strict_mode" in rejected.reasons[0].message


def test_dtype_upcast_adaptation_and_strict_mode():
    engine = engine_of(spec("f32.k", 70, dtypes=frozenset({torch.float32})), spec("any.k", 50))
    choice = engine.choose(CTX)
    assert choice.spec.kernel_id == "f32.k" and choice.adaptation.cast == torch.float32
    lz.configure(strict_mode=True)
    assert engine.select(CTX).kernel_id == "any.k"
    # a downcast is never implicit
    half_only = engine_of(spec("h.k", 70, dtypes=frozenset({torch.float16})), spec("any.k", 50))
    assert half_only.select(CTX.with_(dtype=torch.float32)).kernel_id == "any.k"


def test_lock_is_honoured_or_raises():
    engine = engine_of(spec("a.k", 60), spec("b.k", 80), spec("gpu80.k", 90, max_sm=80))
    lz.lock("attention", "a.k")
    assert engine.choose(CTX).source == "locked" and engine.select(CTX).kernel_id == "a.k"
    lz.lock("attention", "gpu80.k")
    with pytest.raises(KernelLockError, match=r"gpu80.k cannot be honoured: \[SM_TOO_NEW\]"):
        engine.select(CTX)
    lz.lock("attention", "nope.k")
    with pytest.raises(KernelLockError, match="NOT_INSTALLED"):
        engine.select(CTX)
    lz.unlock("attention")
    assert engine.select(CTX).kernel_id == "b.k"


def test_no_kernel_error_lists_every_candidate():
    engine = engine_of(spec("gpu.k", platforms=frozenset({"cuda"})), spec("old.k", max_sm=75, dtypes=frozenset({torch.bfloat16})))
    with pytest.raises(NoKernelFoundError) as err:
        engine.select(CTX.with_(platform="cpu", device="cpu", sm=None))
    text = str(err.value)
    assert "No kernel available for 'attention'" in text
    assert "gpu.k:\n    - [PLATFORM_MISMATCH]" in text
    assert "old.k:\n    - [DTYPE_UNSUPPORTED]" in text
    assert set(err.value.failures) == {"gpu.k", "old.k"}
    with pytest.raises(NoKernelFoundError, match="no kernel is registered"):
        engine.select(CTX.with_(op="nothing"))


def test_capture_without_graph_safe_kernel_raises_graph_error():
    engine = engine_of(spec("unsafe.k"), spec("ref.k", 10, is_reference=True))
    with pytest.raises(CudaGraphUnsafeError, match="CUDA_GRAPH_UNSAFE"):
        engine.select(CTX.with_(capturing=True))
    safe = engine_of(spec("unsafe.k", 80), spec("safe.k", 20, graph_safe=True))
    assert safe.select(CTX.with_(capturing=True)).kernel_id == "safe.k"
    assert safe.select(CTX).kernel_id == "unsafe.k"


def test_graph_strict_mode_needs_a_dummy_capture_verification():
    engine = engine_of(spec("safe.k", 20, graph_safe=True))
    capturing = CTX.with_(capturing=True)
    assert engine.select(capturing).kernel_id == "safe.k"
    lz.configure(graph_strict_mode=True)
    with pytest.raises(CudaGraphUnsafeError, match="graph strict mode"):
        engine.select(capturing)


def test_deterministic_policy_excludes_nondeterministic_kernels():
    engine = engine_of(spec("fast.k", 80, deterministic=False), spec("det.k", 50))
    assert engine.select(CTX).kernel_id == "fast.k"
    lz.configure(deterministic=True)
    assert engine.select(CTX).kernel_id == "det.k"


def test_builtin_registry_on_cpu_prefers_torch_sdpa_and_reports_missing_backends():
    q, k = torch.randn(1, 8, 4, 16), torch.randn(1, 8, 2, 16)
    report = lz.explain("attention", q, k, k, causal=True, scale=0.25, sliding_window=None, layout="BSHD")
    assert report.selected == "torch.sdpa"
    flash = next(c for c in report.candidates if c.kernel_id == "flash_attn.attention")
    assert {r.code for r in flash.reasons} >= {R.PLATFORM_MISMATCH, R.NOT_INSTALLED}
    json.dumps(report.to_dict())
