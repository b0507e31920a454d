"""Bound call sites: chosen once, then called directly; re-bound by whatever would change dispatch's choice."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import layerzero as lz
from layerzero.dispatch.call import FallbackWarning
from layerzero.kernels import get_registry
from layerzero.select.engine import get_engine
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import CONSTRAINT_FAILED, Reason

EPS = {"eps": 1e-6, "weight_offset": 0.0}


@contextmanager
def locked(op: str, kernel_id: str) -> Iterator[None]:
    lz.lock(op, kernel_id)
    try:
        yield
    finally:
        lz.unlock(op)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return lz.rms_norm(x, w)


@pytest.fixture
def kernel():
    """A test rms_norm kernel (top priority, rows <= 4 only) that counts its calls; unregistered afterwards."""
    calls: list[tuple[int, ...]] = []

    def impl(x, weight, *, eps, weight_offset):
        calls.append(tuple(x.shape))
        return torch.nn.functional.rms_norm(x.float(), x.shape[-1:], weight.float() + weight_offset, eps).to(x.dtype)

    def small_only(ctx) -> list[Reason]:
        return [] if ctx.tokens <= 4 else [Reason(CONSTRAINT_FAILED, f"{ctx.tokens} rows > 4")]

    spec = KernelSpec(kernel_id="test_bound.rms_norm", op="rms_norm", backend="test_bound", impl=impl, priority=1000,
                      check=small_only)
    get_registry().register(spec)
    yield calls
    get_registry().unregister(spec.kernel_id)


def test_binds_once_and_runs_what_dispatch_runs(kernel) -> None:
    site = lz.bind("rms_norm")
    x, w = torch.randn(3, 16), torch.randn(16)
    for _ in range(5):
        assert torch.equal(site(x, w, **EPS), rms(x, w))
    assert site.kernel_id == "test_bound.rms_norm" == lz.which("rms_norm", x, w, **EPS)["kernel_id"]
    assert site.binds == 1 and len(kernel) == 10


def test_a_new_shape_rebinds_and_respects_the_kernels_constraint(kernel) -> None:
    site = lz.bind("rms_norm")
    w = torch.randn(16)
    site(torch.randn(3, 16), w, **EPS)
    site(torch.randn(8, 16), w, **EPS)  # 8 rows: the test kernel refuses, another one runs
    assert site.binds == 2 and site.kernel_id != "test_bound.rms_norm" and kernel == [(3, 16)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 8), st.sampled_from([torch.float32, torch.bfloat16]), st.booleans()),
                min_size=1, max_size=12))
def test_every_call_runs_the_kernel_lz_which_names(calls) -> None:
    """Random sequences of shapes, dtypes and strides through one site: each call runs dispatch's choice."""
    spec = KernelSpec(kernel_id="test_bound.prop", op="rms_norm", backend="test_bound", priority=1000,
                      impl=lambda x, weight, *, eps, weight_offset: torch.full_like(x, 7.0),
                      check=lambda ctx: [] if ctx.tokens % 2 else [Reason(CONSTRAINT_FAILED, "even rows")])
    get_registry().register(spec)
    try:
        site = lz.bind("rms_norm")
        for rows, dtype, transposed in calls:
            x = torch.randn(16, rows, dtype=dtype).t() if transposed else torch.randn(rows, 16, dtype=dtype)
            w = torch.randn(16, dtype=dtype)
            chosen = lz.which("rms_norm", x, w, **EPS)["kernel_id"]
            out = site(x, w, **EPS)
            assert site.kernel_id == chosen
            assert torch.equal(out, torch.full_like(x, 7.0)) == (chosen == "test_bound.prop")
    finally:
        get_registry().unregister(spec.kernel_id)


def test_policy_changes_rebind(kernel) -> None:
    site = lz.bind("rms_norm")
    x, w = torch.randn(2, 16), torch.randn(16)
    site(x, w, **EPS)
    with lz.disabled():  # a context-local policy: the reference runs inside, the bound kernel again after
        site(x, w, **EPS)
        assert site.kernel_id == "reference.rms_norm"
    site(x, w, **EPS)
    assert site.kernel_id == "test_bound.rms_norm"
    with locked("rms_norm", "torch.rms_norm"):
        site(x, w, **EPS)
        assert site.kernel_id == "torch.rms_norm"
    site(x, w, **EPS)
    assert site.kernel_id == "test_bound.rms_norm" and site.binds == 4  # the binding from before disabled() came back


def test_registry_changes_rebind() -> None:
    site = lz.bind("silu_and_mul")
    x = torch.randn(2, 8)
    site(x)
    before = site.kernel_id
    spec = KernelSpec(kernel_id="test_bound.silu", op="silu_and_mul", backend="test_bound", priority=1000,
                      impl=lambda x: torch.zeros(x.shape[0], x.shape[1] // 2))
    get_registry().register(spec)
    try:
        assert torch.equal(site(x), torch.zeros(2, 4)) and site.kernel_id == "test_bound.silu"
    finally:
        get_registry().unregister(spec.kernel_id)
    site(x)
    assert site.kernel_id == before


def test_determinism_flag_is_part_of_the_guard() -> None:
    site = lz.bind("rms_norm")
    x, w = torch.randn(2, 16), torch.randn(16)
    site(x, w, **EPS)
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(not previous)
    try:
        site(x, w, **EPS)
    finally:
        torch.use_deterministic_algorithms(previous)
    assert site.binds == 2


def test_a_value_of_another_type_rebinds_instead_of_raising() -> None:
    site = lz.bind("gelu_and_mul")
    x = torch.randn(2, 8)
    site(x, approximate="tanh")
    assert torch.allclose(site(x, approximate="none"), lz.gelu_and_mul(x, "none"))
    assert site.binds == 2


def test_a_failing_bound_kernel_falls_back_and_rebinds() -> None:
    failing = KernelSpec(kernel_id="test_bound.fails", op="silu_and_mul", backend="test_bound_fails", priority=1000,
                         impl=lambda x: (_ for _ in ()).throw(RuntimeError("boom")))
    x = torch.randn(2, 8)
    site = lz.bind("silu_and_mul")
    get_registry().register(failing)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            site(x)  # the first call binds through dispatch, which falls back
            site(x)  # the breaker holds a failure: no binding, every call dispatches
        assert any(issubclass(w.category, FallbackWarning) for w in caught)
        assert torch.allclose(site(x), lz.silu_and_mul(x))
    finally:
        get_registry().unregister(failing.kernel_id)
        get_engine().breaker.record_success("test_bound_fails")


def test_spec_dotted_names_are_aliases() -> None:
    x, w = torch.randn(2, 16), torch.randn(16)
    assert lz.bind("norm.rms").op == "rms_norm"
    assert lz.which("norm.rms", x, w, **EPS) == lz.which("rms_norm", x, w, **EPS)
    assert lz.explain("norm.rms", x, w, **EPS).op == "rms_norm"
    with locked("norm.rms", "reference.rms_norm"):
        assert lz.which("rms_norm", x, w, **EPS)["kernel_id"] == "reference.rms_norm"
    assert lz.list_kernels("posenc.rope") == lz.list_kernels("rope")
    with pytest.raises(ValueError, match="silu_and_mul or gelu_and_mul"):
        lz.bind("mlp.fused")


def test_a_site_alternating_between_signatures_keeps_both_bindings(kernel) -> None:
    site = lz.bind("rms_norm")
    w = torch.randn(16)
    a, b = torch.randn(3, 16), torch.randn(2, 16)
    for _ in range(5):
        assert torch.equal(site(a, w, **EPS), rms(a, w))
        assert torch.equal(site(b, w, **EPS), rms(b, w))
    assert site.binds == 2 and len(kernel) == 20
    with locked("rms_norm", "torch.rms_norm"):  # the policy changed: the kept bindings no longer apply
        site(a, w, **EPS)
        assert site.kernel_id == "torch.rms_norm" and site.binds == 3


def test_a_plan_vouches_after_two_passes_then_skips_the_guard(kernel) -> None:
    site = lz.bind("rms_norm")
    w = torch.randn(16)
    small, large = torch.randn(3, 16), torch.randn(8, 16)
    for i in range(3):
        with lz.plan(("shape", 3)):
            assert torch.equal(site(small, w, **EPS), rms(small, w))
        assert site.vouched == (i >= 1)  # trusted from the second pass that saw it called once
    with lz.plan(("shape", 3)):  # a caller breaking its promise: the guard is skipped, the bound kernel runs
        site(large, w, **EPS)
    assert kernel[-1] == (8, 16) and site.binds == 1
    calls = len(kernel)
    with lz.plan(("shape", 8)):  # another signature: guarded again, so the constraint holds
        site(large, w, **EPS)
    assert len(kernel) == calls and site.kernel_id != "test_bound.rms_norm"


def test_a_policy_change_between_passes_is_seen(kernel) -> None:
    site = lz.bind("rms_norm")
    x, w = torch.randn(2, 16), torch.randn(16)
    for _ in range(3):
        with lz.plan("sig"):
            site(x, w, **EPS)
    assert site.vouched and site.kernel_id == "test_bound.rms_norm"
    with locked("rms_norm", "torch.rms_norm"):
        with lz.plan("sig"):
            site(x, w, **EPS)
        assert site.kernel_id == "torch.rms_norm"


def test_a_site_called_twice_in_a_pass_is_never_vouched(kernel) -> None:
    site = lz.bind("rms_norm")
    w = torch.randn(16)
    small, large = torch.randn(3, 16), torch.randn(8, 16)
    for _ in range(4):
        with lz.plan("two calls"):
            site(small, w, **EPS)
            site(large, w, **EPS)  # the test kernel refuses 8 rows: it must never run them
    assert not site.vouched and (8, 16) not in kernel
