"""dispatch: runtime fallback with one warning per key, circuit breaker, adaptation, errors, threads."""

from __future__ import annotations

import threading
import warnings

import pytest
import torch

import layerzero as lz
from layerzero.dispatch.call import FallbackWarning, dispatch
from layerzero.kernels.reference import specs as reference
from layerzero.policy import state as policy
from layerzero.select import engine as selection
from layerzero.select import reasons as R
from layerzero.select.breaker import CircuitBreaker
from layerzero.select.engine import SelectionEngine
from layerzero.select.errors import KernelExecutionError
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.registry import Registry


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _fresh_policy():
    policy.reset()
    yield
    policy.reset()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def engine(monkeypatch, clock) -> SelectionEngine:
    registry = Registry()
    for spec in reference.kernel_specs():
        registry.register(spec)
    eng = SelectionEngine(registry, CircuitBreaker(threshold=3, cooldown_s=10.0, clock=clock), perfdb=lambda: None)
    monkeypatch.setattr(selection, "_ENGINE", eng)
    return eng


class Flaky:
    """An rms_norm kernel that raises while `broken`, counting its calls."""

    def __init__(self) -> None:
        self.calls = 0
        self.broken = True

    def __call__(self, x, weight, *, eps, weight_offset):
        self.calls += 1
        if self.broken:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return reference.rms_norm(x, weight, eps=eps, weight_offset=weight_offset)


def _register(engine: SelectionEngine, kernel_id: str, impl, priority: int = 90, op: str = "rms_norm", **kw) -> None:
    engine.registry.register(KernelSpec(kernel_id, op, kernel_id.split(".")[0], impl, priority=priority, **kw))


def test_fallback_answers_with_one_warning_per_key_then_breaker_opens(engine, clock):
    flaky = Flaky()
    _register(engine, "flaky.rms", flaky)
    x, w = torch.randn(4, 32), torch.randn(32)
    expected = reference.rms_norm(x, w, eps=1e-6, weight_offset=0.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.testing.assert_close(lz.rms_norm(x, w), expected)
        lz.rms_norm(torch.randn(2, 32), w)  # another key: its own warning
    fallbacks = [w for w in caught if issubclass(w.category, FallbackWarning)]
    assert len(fallbacks) == 2
    assert "flaky.rms raised RuntimeError" in str(fallbacks[0].message) and "reference.rms_norm" in str(fallbacks[0].message)
    # three consecutive failures opened the circuit: the kernel is no longer tried
    assert flaky.calls == 3
    torch.testing.assert_close(lz.rms_norm(x, w), expected)
    assert flaky.calls == 3
    report = lz.explain("rms_norm", x, w, eps=1e-6, weight_offset=0.0)
    flaky_row = next(c for c in report.candidates if c.kernel_id == "flaky.rms")
    assert [r.code for r in flaky_row.reasons] == [R.CIRCUIT_OPEN]
    # after the cool-down the backend is tried again; a success closes the circuit
    flaky.broken = False
    clock.now = 11.0
    torch.testing.assert_close(lz.rms_norm(x, w), expected)
    assert flaky.calls == 4 and engine.breaker.snapshot() == {}


def test_half_open_failure_reopens_immediately(engine, clock):
    flaky = Flaky()
    _register(engine, "flaky.rms", flaky)
    x, w = torch.randn(4, 32), torch.randn(32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FallbackWarning)
        for _ in range(3):
            lz.rms_norm(x, w)
        clock.now = 11.0
        lz.rms_norm(x, w)
        lz.rms_norm(x, w)
    assert flaky.calls == 4
    assert engine.breaker.snapshot()["flaky"]["open"]


def test_bad_inputs_raise_as_is_without_charging_the_breaker(engine):
    flaky = Flaky()
    _register(engine, "flaky.rms", flaky)
    with pytest.raises(RuntimeError, match="shape|size"):
        lz.rms_norm(torch.randn(4, 32), torch.randn(7))  # every kernel fails: the inputs are at fault
    assert engine.breaker.snapshot() == {}


def test_locked_or_no_fallback_raises_kernel_execution_error(engine):
    _register(engine, "flaky.rms", Flaky())
    x, w = torch.randn(4, 32), torch.randn(32)
    lz.lock("rms_norm", "flaky.rms")
    with pytest.raises(KernelExecutionError, match="flaky.rms failed"):
        lz.rms_norm(x, w)
    lz.unlock("rms_norm")
    lz.configure(fallback_enabled=False)
    with pytest.raises(KernelExecutionError):
        lz.rms_norm(x, w)


def test_layout_adaptation_transposes_around_a_bhsd_only_kernel(engine):
    seen = []

    def bhsd_only(q, k, v, *, causal, scale, sliding_window, layout):
        seen.append(layout)
        assert layout == "BHSD"
        return reference.attention(q, k, v, causal=causal, scale=scale, sliding_window=sliding_window, layout=layout)

    _register(engine, "bhsd.attn", bhsd_only, op="attention", layouts=frozenset({"BHSD"}))
    q, k, v = torch.randn(2, 6, 4, 8), torch.randn(2, 6, 2, 8), torch.randn(2, 6, 2, 8)
    out = lz.attention(q, k, v, causal=True, layout="BSHD", sliding_window=3)
    expected = reference.attention(q, k, v, causal=True, scale=8**-0.5, sliding_window=3, layout="BSHD")
    torch.testing.assert_close(out, expected)
    assert seen == ["BHSD"] and out.shape == q.shape


def test_dtype_adaptation_upcasts_and_casts_back(engine):
    def f32_only(x, weight, *, eps, weight_offset):
        assert x.dtype == torch.float32 and weight.dtype == torch.float32
        return reference.rms_norm(x, weight, eps=eps, weight_offset=weight_offset)

    _register(engine, "f32.rms", f32_only, dtypes=frozenset({torch.float32}))
    x, w = torch.randn(4, 32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)
    out = lz.rms_norm(x, w, weight_offset=1.0)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out, reference.rms_norm(x, w, eps=1e-6, weight_offset=1.0), rtol=1e-2, atol=1e-2)

    def f32_fused(x, residual, weight, *, eps, weight_offset):
        assert x.dtype == residual.dtype == torch.float32
        return reference.fused_add_rms_norm(x, residual, weight, eps=eps, weight_offset=weight_offset)

    _register(engine, "f32.fused", f32_fused, op="fused_add_rms_norm", dtypes=frozenset({torch.float32}))
    x, r = torch.randn(4, 32, dtype=torch.float16), torch.randn(4, 32, dtype=torch.float16)
    normed, summed = lz.fused_add_rms_norm(x, r, w.half())
    assert normed.dtype == summed.dtype == torch.float16  # a tuple output is cast back element-wise
    torch.testing.assert_close(summed, x + r)


def test_dispatch_from_many_threads(engine):
    errors: list[BaseException] = []

    def work(rows: int) -> None:
        try:
            for _ in range(50):
                x, w = torch.randn(rows, 16), torch.randn(16)
                torch.testing.assert_close(dispatch("rms_norm", x, w, eps=1e-5, weight_offset=0.0),
                                           reference.rms_norm(x, w, eps=1e-5, weight_offset=0.0))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(r,)) for r in (1, 2, 3, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(engine.call_cache) == 4


def test_compile_path_goes_through_the_torch_library_ops(monkeypatch):
    import layerzero.extend.library as library

    calls = []
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    monkeypatch.setattr(library, "call_op", lambda op, *a, **k: calls.append((op, k)) or "compiled")
    assert lz.rms_norm(torch.randn(2, 4), torch.randn(4)) == "compiled"
    assert calls == [("rms_norm", {"eps": 1e-6, "weight_offset": 0.0})]
