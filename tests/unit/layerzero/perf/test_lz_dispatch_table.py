"""Dispatch tables: solve -> save -> load round trip, use inside the buckets, runtime selection outside."""

from __future__ import annotations

import json
import warnings

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference import specs as reference
from layerzero.perf import tables as dispatch_table
from layerzero.perf.tables import DispatchTable, solve
from layerzero.policy import state as policy
from layerzero.select import engine as selection
from layerzero.select.engine import SelectionEngine
from layerzero.select.errors import LayerZeroError
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.registry import Registry

RMS_KW = {"eps": 1e-6, "weight_offset": 0.0}


@pytest.fixture(autouse=True)
def _fresh_policy():
    policy.reset()
    yield
    policy.reset()


@pytest.fixture
def ran() -> list[str]:
    return []


@pytest.fixture
def engine(monkeypatch, ran) -> SelectionEngine:
    registry = Registry()
    for spec in reference.kernel_specs():
        registry.register(spec)

    def tagged(name):
        def impl(x, weight, *, eps, weight_offset):
            ran.append(name)
            return reference.rms_norm(x, weight, eps=eps, weight_offset=weight_offset)
        return impl

    registry.register(KernelSpec("a.rms", "rms_norm", "a", tagged("a"), priority=60))
    registry.register(KernelSpec("b.rms", "rms_norm", "b", tagged("b"), priority=70))
    eng = SelectionEngine(registry, perfdb=lambda: None)
    monkeypatch.setattr(selection, "_ENGINE", eng)
    return eng


def test_solve_save_load_round_trip(engine, tmp_path):
    calls = [("rms_norm", (torch.randn(rows, 32), torch.randn(32)), RMS_KW) for rows in (1, 100, 3000)]
    table = solve(calls, model_id="tiny", engine=engine)
    assert len(table.plans) == 3 and set(table.plans.values()) == {"b.rms"}
    path = tmp_path / "table.json"
    table.save(path)
    data = json.loads(path.read_text())
    assert data["schema_version"] == "1.0" and data["fallback"] == {"mode": "runtime_select"}
    assert data["hardware_signature"] == table.hardware_signature and data["model_id"] == "tiny"
    loaded = DispatchTable.load(path)
    assert loaded.plans == table.plans and loaded.hardware_signature == table.hardware_signature
    with pytest.raises(LayerZeroError, match="schema"):
        DispatchTable.from_dict({**data, "schema_version": "0.1"})


def test_table_pins_choices_inside_buckets_and_selects_outside(engine, ran):
    w = torch.randn(32)
    with lz.prefer("a"):
        table = solve([("rms_norm", (torch.randn(100, 32), w), RMS_KW)], engine=engine)
    assert list(table.plans.values()) == ["a.rms"]
    dispatch_table.use(table, engine)
    try:
        lz.rms_norm(torch.randn(100, 32), w)  # the solved shape
        lz.rms_norm(torch.randn(90, 32), w)  # same bucket (tokens 17..128)
        lz.rms_norm(torch.randn(1000, 32), w)  # other bucket: runtime selection
        lz.rms_norm(torch.randn(100, 64), w.repeat(2))  # other validity (hidden size): runtime selection
        report = lz.explain("rms_norm", torch.randn(100, 32), w, **RMS_KW)
        assert report.source == "table" and report.selected == "a.rms"
    finally:
        dispatch_table.use(None, engine)
    lz.rms_norm(torch.randn(100, 32), w)
    assert ran[-5:] == ["a", "a", "b", "b", "b"]


def test_table_kernel_is_still_filtered(engine):
    w = torch.randn(32)
    x = torch.randn(4, 32)
    table = solve([("rms_norm", (x, w), RMS_KW)], engine=engine)
    assert list(table.plans.values()) == ["b.rms"]
    dispatch_table.use(table, engine)
    try:
        with lz.disabled():  # the policy still blocks the pinned kernel
            assert lz.explain("rms_norm", x, w, **RMS_KW).selected == "reference.rms_norm"
    finally:
        dispatch_table.use(None, engine)


def test_table_from_other_hardware_is_ignored_with_one_warning(engine, ran):
    w = torch.randn(32)
    table = solve([("rms_norm", (torch.randn(4, 32), w), RMS_KW)], engine=engine)
    other = DispatchTable("cuda|NVIDIA H100|sm90", {key: "a.rms" for key in table.plans})
    dispatch_table.use(other, engine)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            lz.rms_norm(torch.randn(4, 32), w)
            lz.rms_norm(torch.randn(3, 32), w)
        assert len([c for c in caught if "ignored" in str(c.message)]) == 1
        assert ran[-2:] == ["b", "b"]
    finally:
        dispatch_table.use(None, engine)
