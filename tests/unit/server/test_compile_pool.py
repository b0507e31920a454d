"""The API server's grammar compile pool: costly grammars never shut structured output off for anyone else. A
request's budget counts its own compile (not its queueing), a compile past its budget frees its slot, small
constraints have a lane of their own, one constraint compiles once however many requests wait for it, and the
queue is bounded."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from infer.server import workers as w
from infer.server.workers import CompileBusyError, CompileTimeoutError, Workers
from infer.structured import Constraint

BIG = "x" * (w.SMALL_SPEC_CHARS + 1)


def _big(name: str, seconds: float) -> Constraint:
    return Constraint("regex", f"{name}:{seconds}:{BIG}")


def _small(name: str, seconds: float) -> Constraint:
    return Constraint("regex", f"{name}:{seconds}:")


class FakeGrammars:
    """A compiler whose compile of a constraint takes the seconds written in its spec, and counts its compiles."""

    def __init__(self) -> None:
        self.cached: set[Constraint] = set()
        self.compiles: list[str] = []
        self.lock = threading.Lock()

    def is_cached(self, constraint: Constraint) -> bool:
        return constraint in self.cached

    def compile(self, constraint: Constraint) -> None:
        name, seconds, _ = constraint.spec.split(":", 2)
        with self.lock:
            self.compiles.append(name)
        time.sleep(float(seconds))
        self.cached.add(constraint)


@pytest.fixture()
def pool():
    workers = Workers(compile_timeout_s=0.3)
    yield workers, FakeGrammars()
    workers.close()


async def _timed(workers: Workers, grammars: FakeGrammars, constraint: Constraint) -> float:
    start = time.monotonic()
    await workers.compile(grammars, constraint)  # type: ignore[arg-type]
    return time.monotonic() - start


def test_a_small_constraint_never_waits_behind_big_ones(pool):
    workers, grammars = pool

    async def scenario() -> float:
        hogs = [asyncio.create_task(_timed(workers, grammars, _big(f"hog{i}", 1.0))) for i in range(2)]
        await asyncio.sleep(0.05)
        small = await _timed(workers, grammars, _small("small", 0.01))
        for hog in hogs:
            with pytest.raises(CompileTimeoutError):
                await hog
        return small

    assert asyncio.run(scenario()) < 0.2


def test_a_compile_past_its_budget_frees_its_slot_and_is_cached_when_done(pool):
    workers, grammars = pool

    async def scenario() -> None:
        hogs = [asyncio.create_task(_timed(workers, grammars, _big(f"hog{i}", 1.0))) for i in range(2)]
        for hog in hogs:
            with pytest.raises(CompileTimeoutError):
                await hog  # 0.3 s: both slots are given back while the compiles run on
        assert await _timed(workers, grammars, _big("next", 0.05)) < 0.2  # starts at once
        await asyncio.sleep(1.0)
        assert all(grammars.is_cached(_big(f"hog{i}", 1.0)) for i in range(2))
        assert await _timed(workers, grammars, _big("hog0", 1.0)) < 0.01  # the late result was kept

    asyncio.run(scenario())


def test_the_budget_counts_the_compile_not_the_queue(pool):
    """Two big compiles of 0.25 s each hold both slots; a third waits for one, then compiles within its own 0.3 s."""
    workers, grammars = pool

    async def scenario() -> float:
        first = [asyncio.create_task(_timed(workers, grammars, _big(f"a{i}", 0.25))) for i in range(2)]
        await asyncio.sleep(0.05)
        waited = await _timed(workers, grammars, _big("b", 0.2))
        await asyncio.gather(*first)
        return waited

    assert asyncio.run(scenario()) > 0.3  # queued ~0.2 s, then compiled 0.2 s: over the budget, yet not refused


def test_one_constraint_compiles_once_for_every_request_waiting_on_it(pool):
    workers, grammars = pool

    async def scenario() -> None:
        same = _big("same", 0.1)
        await asyncio.gather(*(workers.compile(grammars, same) for _ in range(5)))  # type: ignore[arg-type]

    asyncio.run(scenario())
    assert grammars.compiles == ["same"]


def test_a_full_queue_is_refused(pool, monkeypatch):
    workers, grammars = pool
    monkeypatch.setattr(w, "MAX_WAITING", 1)

    async def scenario() -> None:
        running = [asyncio.create_task(workers.compile(grammars, _big(f"r{i}", 0.2))) for i in range(3)]
        await asyncio.sleep(0.05)  # two compile, one waits: the lane's queue is full
        with pytest.raises(CompileBusyError):
            await workers.compile(grammars, _big("refused", 0.01))  # type: ignore[arg-type]
        await workers.compile(grammars, _small("small", 0.01))  # type: ignore[arg-type]  # the small lane is open
        await asyncio.gather(*running)

    asyncio.run(scenario())
