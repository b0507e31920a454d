"""Inspection: which / explain agree with selection and policy, list_kernels, validate vs the reference, readiness."""

from __future__ import annotations

import json
import os

import pytest
import torch

from layerzero.extend import capabilities

from layerzero.extend.plugins import register_kernel
from layerzero.kernels import get_registry
from layerzero.policy import state as policy
from layerzero.select.context import SelectionContext
from layerzero.select.errors import KernelLockError
from layerzero.select.reasons import CONSTRAINT_FAILED, DTYPE_UNSUPPORTED, NOT_INSTALLED, POLICY_BLOCKED
from layerzero.tools.inspect import ValidationResult, explain, list_kernels, readiness_check, validate, which

USER_IDS = ("test_inspect.rms_close", "test_inspect.rms_wrong", "test_inspect.rms_raises", "test_inspect.rms_half",
            "test_inspect.store_nothing")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith("LAYERZERO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LAYERZERO_PERFDB", "off")
    monkeypatch.setattr(capabilities, "_statuses", {})
    policy.reset()
    yield
    registry = get_registry()
    for kernel_id in USER_IDS:
        if registry.get(kernel_id) is not None:
            registry.unregister(kernel_id)
    monkeypatch.undo()
    policy.reset()


def _rms_args(dtype=torch.float32):
    return (torch.randn(5, 64, dtype=dtype), torch.randn(64, dtype=dtype)), {"eps": 1e-6, "weight_offset": 0.0}


def test_which_and_explain_agree_and_report_every_candidate():
    args, kwargs = _rms_args()
    chosen = which("rms_norm", *args, **kwargs)
    report = explain("rms_norm", *args, **kwargs)
    assert chosen["kernel_id"] == report.selected
    assert {c.kernel_id for c in report.candidates} == {s.kernel_id for s in get_registry().kernels("rms_norm")}
    best = next(c for c in report.candidates if c.kernel_id == report.selected)
    assert best.valid and chosen["score"] == pytest.approx(best.score)
    assert all(c.reasons for c in report.candidates if not c.valid)
    json.dumps(report.to_dict())  # JSON-serializable end to end


def test_policy_steers_which_prefer_disabled_lock():
    args, kwargs = _rms_args()
    with policy.prefer("reference"):
        assert which("rms_norm", *args, **kwargs)["kernel_id"] == "reference.rms_norm"
    with policy.disabled():
        report = explain("rms_norm", *args, **kwargs)
        assert report.selected == "reference.rms_norm"
        others = [c for c in report.candidates if c.kernel_id != "reference.rms_norm"]
        assert others and all(any(r.code == POLICY_BLOCKED for r in c.reasons) for c in others)
    policy.lock("rms_norm", "reference.rms_norm")
    assert which("rms_norm", *args, **kwargs)["kernel_id"] == "reference.rms_norm"
    policy.lock("rms_norm", "nobody.rms_norm")
    with pytest.raises(KernelLockError):
        which("rms_norm", *args, **kwargs)
    report = explain("rms_norm", *args, **kwargs)
    assert report.selected is None and "nobody.rms_norm" in report.error


def test_explain_accepts_a_context_for_another_device():
    ctx = SelectionContext(op="rms_norm", device="cuda:0", platform="cuda", sm=90, dtype=torch.float16, tokens=8,
                           hidden=64)
    report = explain("rms_norm", ctx)
    assert report.context["sm"] == 90 and report.context["platform"] == "cuda"
    with pytest.raises(ValueError, match="not 'attention'"):
        explain("attention", ctx)


def test_list_kernels_by_priority_with_availability():
    kernels = list_kernels("rms_norm")
    assert [k["priority"] for k in kernels] == sorted((k["priority"] for k in kernels), reverse=True)
    reference = next(k for k in kernels if k["kernel_id"] == "reference.rms_norm")
    assert reference["available"] and reference["is_reference"]
    assert all(k["unavailable_reason"]["code"] for k in kernels if not k["available"])
    everything = list_kernels()
    assert {k["op"] for k in everything} == set(get_registry().ops())
    assert list_kernels("no_such_op") == []


def test_validate_measures_error_against_the_reference_with_spec_tolerances():
    @register_kernel(op="rms_norm", kernel_id="test_inspect.rms_close")
    def rms_close(x, weight, *, eps, weight_offset):
        return get_registry().reference("rms_norm").impl(x, weight, eps=eps, weight_offset=weight_offset) + 2e-6

    @register_kernel(op="rms_norm", kernel_id="test_inspect.rms_wrong")
    def rms_wrong(x, weight, *, eps, weight_offset):
        return x * weight

    args, kwargs = _rms_args()
    valid, reasons = validate("test_inspect.rms_close", *args, **kwargs)
    assert valid and reasons == []
    close = validate("test_inspect.rms_close", *args, **kwargs)
    assert 1e-6 < close.max_abs_error < 1e-5 and close.worst_ratio <= 1
    assert close.tolerances == {"float32": (1e-5, 1e-5)}
    wrong = validate("test_inspect.rms_wrong", *args, **kwargs)
    assert not wrong.valid and wrong.reasons[0].code == CONSTRAINT_FAILED
    assert "exceeds the tolerance" in str(wrong.reasons)
    assert wrong.reference_id == "reference.rms_norm" and wrong.worst_ratio > 1
    json.dumps(wrong.to_dict())


def test_validate_reports_raising_unknown_and_constraint_failures():
    @register_kernel(op="rms_norm", kernel_id="test_inspect.rms_raises")
    def rms_raises(x, weight, *, eps, weight_offset):
        raise RuntimeError("boom")

    @register_kernel(op="rms_norm", kernel_id="test_inspect.rms_half", dtypes=[torch.float16])
    def rms_half(x, weight, *, eps, weight_offset):
        return x

    args, kwargs = _rms_args()
    raised = validate("test_inspect.rms_raises", *args, **kwargs)
    assert not raised.valid and "RuntimeError: boom" in raised.reasons[0].message
    assert validate("nobody.kernel", *args, **kwargs).reasons[0].code == NOT_INSTALLED
    half = validate("test_inspect.rms_half", *args, **kwargs)
    assert not half.valid and half.reasons[0].code == DTYPE_UNSUPPORTED and half.max_abs_error is None
    assert isinstance(half, ValidationResult)


def test_validate_in_place_ops_and_generators():
    @register_kernel(op="store_kv_cache", kernel_id="test_inspect.store_nothing")
    def store_nothing(key, value, key_cache, value_cache, slot_mapping):
        return None

    key, value = torch.randn(3, 2, 8), torch.randn(3, 2, 8)
    caches = torch.zeros(4, 4, 2, 8), torch.zeros(4, 4, 2, 8)
    slots = torch.tensor([5, -1, 9])
    assert validate("reference.store_kv_cache", key, value, *caches, slots).valid
    assert caches[0].abs().sum() == 0  # validate works on copies
    wrong = validate("test_inspect.store_nothing", key, value, *caches, slots)
    assert not wrong.valid

    logits = torch.randn(4, 50)
    generator = torch.Generator().manual_seed(3)
    result = validate("reference.sample_topk", logits, 5, temperature=1.0, generator=generator, noise=None)
    assert result.valid and result.tolerances == {}  # integer outputs compare exactly


def test_readiness_check_passes_by_default_and_fails_on_bad_locks_and_descriptors():
    report = readiness_check()
    assert report.ok, str(report)
    names = {c.name for c in report.checks}
    assert {"policy", "backends", "fallbacks", "capabilities", "plugins", "selection_cache", "perfdb"} <= names
    assert next(c for c in report.checks if c.name == "perfdb").status == "warn"  # LAYERZERO_PERFDB=off here
    json.dumps(report.to_dict())

    policy.lock("rms_norm", "reference.attention")
    bad = readiness_check()
    check = next(c for c in bad.checks if c.name == "policy")
    assert not bad.ok and check.status == "fail" and "implements attention" in check.detail
    policy.unlock("rms_norm")

    spec = get_registry().reference("rms_norm")
    capabilities.apply_descriptor([spec], {"schema_version": "0.9"})
    check = next(c for c in readiness_check().checks if c.name == "capabilities")
    assert check.status == "fail" and "schema_version" in check.detail
    capabilities.apply_descriptor([spec], {
        "schema_version": "1.0", "backend": "reference", "backend_version": "x", "platform": ["cpu", "cuda"],
        "ops": {"rms_norm": [{"kernel_id": "reference.rms_norm", "dtypes": None, "requires_layouts": None}]}})
    assert next(c for c in readiness_check().checks if c.name == "capabilities").status == "pass"
