"""Capabilities descriptors: schema v1 fails closed, constraints are applied, selection filters (never crashes)."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from layerzero.extend import capabilities as C
from layerzero.extend.schema_check import validate
from layerzero.select.context import SelectionContext
from layerzero.select.engine import SelectionEngine
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CAPABILITIES_SCHEMA_MISMATCH
from layerzero.select.registry import Registry


@pytest.fixture(autouse=True)
def fresh_statuses(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(C, "_statuses", {})


def _impl(*args, **kwargs):
    return None


def _spec(kernel_id: str, op: str = "attention", backend: str = "fastattn", **kw) -> KernelSpec:
    return KernelSpec(kernel_id=kernel_id, op=op, backend=backend, impl=_impl, priority=90, **kw)


# The appendix D example, with this implementation's op names.
DESCRIPTOR = {
    "schema_version": "1.0",
    "backend": "fastattn",
    "backend_version": "2.5.6",
    "platform": "cuda",
    "ops": {
        "attention": [{
            "kernel_id": "fastattn.causal", "min_sm": 80, "max_sm": None, "dtypes": ["float16", "bfloat16"],
            "min_head_dim": 32, "max_head_dim": 256, "head_dim_multiple": 8, "max_seq_len": None,
            "supports_gqa": True, "supports_attn_mask": False, "supports_dropout": False,
            "requires_layouts": ["BSHD"], "produces_layout": "BSHD", "requires_last_dim_stride1": True,
            "is_cuda_graph_safe": True, "deterministic": False, "fuses_ops": ["rope"], "transform_cost_hint": 0,
        }],
        "rms_norm": [{"kernel_id": "fastattn.rms_norm", "dtypes": None, "requires_layouts": None}],
    },
}


def _mutated(**changes) -> dict:
    out = copy.deepcopy(DESCRIPTOR)
    for path, value in changes.items():
        node = out
        *parents, last = path.split("__")
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is KeyError:
            del node[last]
        else:
            node[last] = value
    return out


def test_valid_descriptor_sets_constraints_and_fails_closed_on_missing_fields():
    attention, norm = C.apply_descriptor(
        [_spec("fastattn.causal"), _spec("fastattn.rms_norm", op="rms_norm")], DESCRIPTOR)
    assert attention.available is None and norm.available is None
    assert attention.min_sm == 80 and attention.max_sm is None and attention.version == "2.5.6"
    assert attention.dtypes == frozenset({torch.float16, torch.bfloat16})
    assert (attention.min_head_dim, attention.max_head_dim, attention.head_dim_multiple) == (32, 256, 8)
    assert attention.layouts == frozenset({"BSHD"}) and attention.platforms == frozenset({"cuda"})
    assert attention.supports_gqa and attention.graph_safe and not attention.deterministic
    assert attention.attn_mask_types == frozenset({"none"}) and attention.requires_last_dim_contiguous
    assert attention.priority == 90 and attention.impl is _impl
    # rms_norm's entry omits every optional field: unsupported, not permissive
    assert norm.dtypes is None and norm.layouts is None
    assert not norm.supports_gqa and not norm.supports_sliding_window and not norm.graph_safe
    assert not norm.deterministic and norm.requires_last_dim_contiguous


def test_descriptor_from_file_and_platform_list(tmp_path):
    path = tmp_path / "caps.json"
    path.write_text(json.dumps(_mutated(platform=["cpu", "cuda"])))
    (spec,) = C.apply_descriptor([_spec("fastattn.causal")], path)
    assert spec.platforms == frozenset({"cpu", "cuda"})
    status = next(s for s in C.statuses() if s.backend == "fastattn")
    assert status.ok and status.source == str(path) and status.unknown_kernels == ("fastattn.rms_norm",)


@pytest.mark.parametrize(
    "changes,fragment",
    [
        ({"schema_version": "2.0"}, "schema_version: unsupported '2.0'"),
        ({"schema_version": KeyError}, "missing required field 'schema_version'"),
        ({"colour": "red"}, "colour: unknown field"),
        ({"ops__attention__0__fast": True}, "ops.attention[0].fast: unknown field"),
        ({"ops__attention__0__min_sm": "80"}, "ops.attention[0].min_sm: expected integer or null, got string"),
        ({"ops__attention__0__supports_gqa": "yes"}, "ops.attention[0].supports_gqa: expected boolean"),
        ({"ops__attention__0__dtypes": "float16"}, "ops.attention[0].dtypes: expected array or null, got string"),
        ({"ops__attention__0__dtypes": ["float16", "float99"]}, 'ops.attention[0].dtypes[1]: "float99" is not'),
        ({"ops__attention__0__dtypes": KeyError}, "ops.attention[0]: missing required field 'dtypes'"),
        ({"ops__attention__0__requires_layouts": KeyError}, "missing required field 'requires_layouts'"),
        ({"ops__attention__0__requires_layouts": ["SBHD"]}, "requires_layouts[0]: \"SBHD\" is not one of"),
        ({"ops__attention__0__max_head_dim": 0}, "max_head_dim: 0 is below the minimum 1"),
        ({"ops__attention__0__min_head_dim": 512}, "min_head_dim=512 is above max_head_dim=256"),
        ({"ops__attention__0__max_sm": 75}, "min_sm=80 is above max_sm=75"),
        ({"ops__rms_norm__0__kernel_id": "fastattn.causal"}, "'fastattn.causal' is already declared"),
        ({"platform": "tpu"}, "platform: \"tpu\" is not one of"),
        ({"ops": {}}, "ops: needs at least 1"),
        ({"ops__attention": []}, "ops.attention: needs at least 1 item"),
        ({"backend_version": 2}, "backend_version: expected string"),
    ],
)
def test_invalid_descriptors_fail_closed_naming_the_field(changes, fragment):
    specs = [_spec("fastattn.causal"), _spec("fastattn.rms_norm", op="rms_norm")]
    with pytest.raises(C.CapabilitiesError) as info:
        C.load_descriptor(_mutated(**changes))
    assert fragment in str(info.value)
    applied = C.apply_descriptor(specs, _mutated(**changes))
    for spec in applied:
        reason = spec.available()
        assert reason.code == CAPABILITIES_SCHEMA_MISMATCH and fragment in reason.message
    assert not next(s for s in C.statuses() if s.backend == "fastattn").ok


def test_unreadable_files_and_unlisted_or_foreign_kernels_are_rejected(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    (spec,) = C.apply_descriptor([_spec("fastattn.causal")], bad)
    assert "invalid JSON" in spec.available().message and str(bad) in spec.available().message
    (spec,) = C.apply_descriptor([_spec("fastattn.causal")], tmp_path / "missing.json")
    assert "cannot read descriptor" in spec.available().message
    unlisted, foreign = C.apply_descriptor([_spec("fastattn.paged"), _spec("other.causal", backend="other")],
                                           DESCRIPTOR)
    assert "not declared" in unlisted.available().message
    assert "is for backend 'fastattn'" in foreign.available().message


def test_capabilities_hash_follows_descriptor_changes():
    C.apply_descriptor([_spec("fastattn.causal")], DESCRIPTOR)
    first = C.capabilities_hash()
    C.apply_descriptor([_spec("fastattn.causal")], _mutated(ops__attention__0__max_head_dim=128))
    assert C.capabilities_hash() != first
    C.apply_descriptor([_spec("fastattn.causal")], DESCRIPTOR)
    assert C.capabilities_hash() == first


def test_selection_filters_a_rejected_backend_and_uses_the_reference():
    registry = Registry()
    reference = KernelSpec(kernel_id="ref.attention", op="attention", backend="ref", impl=_impl, priority=10,
                           is_reference=True)
    registry.register(reference)
    for spec in C.apply_descriptor([_spec("fastattn.causal")], _mutated(schema_version="9")):
        registry.register(spec)
    for spec in C.apply_descriptor([_spec("good.causal", backend="good")], _mutated(backend="good", ops={
            "attention": [{"kernel_id": "good.causal", "dtypes": ["float32"], "requires_layouts": ["BSHD", "BHSD"]}]},
            platform="cpu")):
        registry.register(spec)
    engine = SelectionEngine(registry, perfdb=lambda: None)
    q = torch.randn(1, 4, 2, 8)
    ctx = SelectionContext.from_tensors("attention", q, q, q, causal=True, layout="BSHD")
    report = engine.explain(ctx)
    assert report.selected == "good.causal"
    rejected = next(c for c in report.candidates if c.kernel_id == "fastattn.causal")
    assert not rejected.valid and rejected.reasons[-1].code == CAPABILITIES_SCHEMA_MISMATCH
    assert engine.select(ctx.with_(dtype=torch.float64)) is reference  # good.causal declares float32 only


def test_schema_check_refuses_keywords_it_does_not_implement():
    with pytest.raises(ValueError, match="pattern"):
        validate("x", {"type": "string", "pattern": "^x$"})
    assert validate(C.SCHEMA, {"type": "object"}) == []
    assert C.SUPPORTED_SCHEMA_VERSIONS == ("1.0",)
