"""lz.tune: measures every valid kernel into the PerfDB; timings then move the selection."""

from __future__ import annotations

import time

import pytest
import torch

from layerzero.kernels.reference import specs as reference
from layerzero.perf.perfdb import PerfDB
from layerzero.perf.tune import tune
from layerzero.policy import state as policy
from layerzero.select.context import SelectionContext
from layerzero.select.engine import SelectionEngine
from layerzero.select.errors import LayerZeroError
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.registry import Registry


@pytest.fixture(autouse=True)
def _fresh_policy():
    policy.reset()
    yield
    policy.reset()


def sleeping(seconds: float):
    def impl(x, weight, *, eps, weight_offset):
        time.sleep(seconds)
        return reference.rms_norm(x, weight, eps=eps, weight_offset=weight_offset)
    return impl


def broken(x, weight, *, eps, weight_offset):
    raise RuntimeError("no kernel image for this device")


def test_tune_records_timings_and_reselects(tmp_path):
    db = PerfDB(tmp_path / "perf.sqlite")
    registry = Registry()
    for kernel_id, impl, priority in (("slow.rms", sleeping(0.008), 52), ("fast.rms", sleeping(0.001), 50),
                                      ("broken.rms", broken, 40)):
        registry.register(KernelSpec(kernel_id, "rms_norm", kernel_id.split(".")[0], impl, priority=priority))
    engine = SelectionEngine(registry, perfdb=lambda: db)
    x, w = torch.randn(4, 16), torch.randn(16)
    ctx = SelectionContext.from_tensors("rms_norm", x, w, eps=1e-6, weight_offset=0.0)
    assert engine.select(ctx).kernel_id == "slow.rms"

    result = tune("rms_norm", x, w, eps=1e-6, weight_offset=0.0, samples=20, warmup=1, db=db, engine=engine)

    assert set(result.timings) == {"slow.rms", "fast.rms"}
    assert "no kernel image" in result.failures["broken.rms"]
    assert result.timings["slow.rms"].median_us > 4 * result.timings["fast.rms"].median_us
    assert result.selected == "fast.rms" and engine.select(ctx).kernel_id == "fast.rms"
    assert db.count() == 2
    report = engine.explain(ctx)
    slow = next(c for c in report.candidates if c.kernel_id == "slow.rms")
    assert slow.breakdown["perf"] < -2.0 and slow.perf["n"] == 20
    assert result.to_dict()["selected"] == "fast.rms"


def test_tune_samples_default_to_the_policy(tmp_path):
    db = PerfDB(tmp_path / "perf.sqlite")
    registry = Registry()
    registry.register(KernelSpec("fast.rms", "rms_norm", "fast", sleeping(0.0)))
    policy.configure(perfdb={"tune_samples": 3})
    result = tune("rms_norm", torch.randn(2, 4), torch.randn(4), eps=1e-6, weight_offset=0.0, warmup=0, db=db,
                  engine=SelectionEngine(registry, perfdb=lambda: db))
    assert result.timings["fast.rms"].n == 3


def test_tune_needs_a_perfdb(monkeypatch):
    monkeypatch.setenv("LAYERZERO_PERFDB", "off")
    policy.reset()
    with pytest.raises(LayerZeroError, match="PerfDB is disabled"):
        tune("rms_norm", torch.randn(2, 4), torch.randn(4), eps=1e-6, weight_offset=0.0,
             engine=SelectionEngine(Registry(), perfdb=lambda: None))
