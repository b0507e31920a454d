"""Selection caches: bounded LRU, thread safety, sound keys (sizes inside one bucket), invalidation."""

from __future__ import annotations

import threading

import pytest
import torch

import layerzero as lz
from layerzero.kernels.reference.specs import kernel_specs as reference_specs
from layerzero.policy import state as policy
from layerzero.select import engine as selection
from layerzero.select.cache import LRUCache
from layerzero.select.context import DEVICES, SelectionContext
from layerzero.select.engine import SelectionEngine
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.registry import Registry

CTX = SelectionContext(op="attention", device="cuda:0", platform="cuda", sm=90, dtype=torch.float16, batch=1,
                       seq_q=200, seq_k=200, tokens=200, num_heads=8, num_kv_heads=8, head_dim=64, layout="BSHD")


@pytest.fixture(autouse=True)
def _fresh_policy():
    policy.reset()
    yield
    policy.reset()


@pytest.fixture
def engine(monkeypatch) -> SelectionEngine:
    """A fresh engine (references registered) installed as the process engine for dispatch."""
    registry = Registry()
    for spec in reference_specs():
        registry.register(spec)
    eng = SelectionEngine(registry, perfdb=lambda: None)
    monkeypatch.setattr(selection, "_ENGINE", eng)
    return eng


def spec(kernel_id: str, priority: int = 50, op: str = "attention", impl=None, **kw) -> KernelSpec:
    return KernelSpec(kernel_id=kernel_id, op=op, backend=kernel_id.split(".")[0],
                      impl=impl or (lambda *a, **k: None), priority=priority, **kw)


def test_lru_is_bounded_and_evicts_least_recent():
    cache: LRUCache[int] = LRUCache(3)
    for i in range(3):
        cache.put(i, i)
    assert cache.get(0) == 0  # 0 becomes most recent: 1 is now the oldest
    cache.put(3, 3)
    assert cache.get(1) is None and cache.get(0) == 0 and cache.get(3) == 3
    assert len(cache) == 3
    assert not cache.add(3, 33) and cache.get(3) == 3 and cache.add(4, 4)
    with pytest.raises(ValueError):
        LRUCache(0)


def test_lru_under_concurrent_writers_and_readers():
    cache: LRUCache[int] = LRUCache(64)
    once: LRUCache[int] = LRUCache(1000)
    errors: list[BaseException] = []
    inserted: list[int] = []

    def work(seed: int) -> None:
        try:
            for i in range(3000):
                key = (seed * 7 + i) % 200
                if cache.get(key) not in (None, key):
                    raise AssertionError("wrong value")
                cache.put(key, key)
                if once.add(i % 50, seed):
                    inserted.append(i % 50)
        except BaseException as exc:  # surfaced in the main thread
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(cache) <= 64
    assert sorted(inserted) == list(range(50))  # add() is atomic: each key inserted by exactly one thread


def test_key_is_sound_for_a_limit_inside_one_bucket(engine):
    engine.registry.register(spec("short.k", 90, max_seq_len=300))
    engine.registry.register(spec("any.k", 50))
    assert CTX.perf_bucket() == CTX.with_(seq_q=400, seq_k=400, tokens=400).perf_bucket()
    assert engine.select(CTX).kernel_id == "short.k"
    assert engine.select(CTX.with_(seq_q=400, seq_k=400, tokens=400)).kernel_id == "any.k"
    assert engine.select(CTX).kernel_id == "short.k"


def test_key_is_sound_for_a_policy_rule_inside_one_bucket(engine):
    engine.registry.register(spec("a.k", 60))
    engine.registry.register(spec("b.k", 50))
    lz.configure(rules=[{"match": {"seq_len": ">300"}, "avoid_sources": ["a"]}])
    assert engine.select(CTX).kernel_id == "a.k"
    assert engine.select(CTX.with_(seq_k=400)).kernel_id == "b.k"


def test_key_is_per_device_capability(engine):
    engine.registry.register(spec("hopper.k", 90, min_sm=90))
    engine.registry.register(spec("any.k", 50))
    assert engine.select(CTX).kernel_id == "hopper.k"
    assert engine.select(CTX.with_(device="cuda:1", sm=80)).kernel_id == "any.k"
    assert engine.select(CTX).kernel_id == "hopper.k"


def _rms(x, weight, *, eps, weight_offset):
    return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)


def test_dispatch_call_cache_hit_skips_context_building(engine, monkeypatch):
    built = []
    original = SelectionContext.from_tensors.__func__

    def counting(cls, op, *args, **kwargs):
        built.append(op)
        return original(cls, op, *args, **kwargs)

    monkeypatch.setattr(SelectionContext, "from_tensors", classmethod(counting))
    x, w = torch.randn(3, 8), torch.randn(8)
    for _ in range(3):
        lz.rms_norm(x, w)
    assert built == ["rms_norm"]
    lz.rms_norm(torch.randn(5, 8), w)  # another shape: another context
    lz.rms_norm(x.t().contiguous().t(), w)  # same shape, other strides: another context
    assert built == ["rms_norm"] * 3


def test_invalidated_by_policy_registry_device_and_breaker_changes(engine):
    x, w = torch.randn(4, 16), torch.randn(16)
    ran: list[str] = []

    def tagged(name):
        def impl(x, weight, *, eps, weight_offset):
            ran.append(name)
            return _rms(x, weight, eps=eps, weight_offset=weight_offset)
        return impl

    engine.registry.register(spec("a.rms", 60, op="rms_norm", impl=tagged("a")))
    lz.rms_norm(x, w)
    engine.registry.register(spec("b.rms", 70, op="rms_norm", impl=tagged("b")))  # registry version bump
    lz.rms_norm(x, w)
    lz.configure(prefer_sources=["a"])  # policy change: +20 for a
    lz.rms_norm(x, w)
    with lz.prefer("b"):  # context-manager policy: per thread
        lz.rms_norm(x, w)
    lz.rms_norm(x, w)
    assert ran == ["a", "b", "a", "b", "a"]
    assert len(engine.call_cache) > 0
    DEVICES.refresh()
    engine.sync()
    assert len(engine.call_cache) == 0 and len(engine.cache) == 0
    lz.rms_norm(x, w)
    for _ in range(engine.breaker.threshold):
        engine.breaker.record_failure("a", RuntimeError("boom"))
    lz.rms_norm(x, w)
    assert ran[-2:] == ["a", "b"]


def test_prefer_is_per_thread(engine):
    engine.registry.register(spec("a.rms", 60, op="rms_norm", impl=_rms))
    engine.registry.register(spec("b.rms", 70, op="rms_norm", impl=_rms))
    ctx = SelectionContext.from_tensors("rms_norm", torch.randn(2, 4), torch.randn(4))
    seen: dict[str, str] = {}
    barrier = threading.Barrier(2)

    def preferring() -> None:
        with lz.prefer("a"):
            barrier.wait()
            seen["prefer"] = engine.select(ctx).kernel_id
            barrier.wait()

    def plain() -> None:
        barrier.wait()
        seen["plain"] = engine.select(ctx).kernel_id
        barrier.wait()

    threads = [threading.Thread(target=preferring), threading.Thread(target=plain)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert seen == {"prefer": "a.rms", "plain": "b.rms"}
