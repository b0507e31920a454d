"""Where `infer serve`'s processes run on the host's CPUs: each CUDA engine core on CPUs of its own, chosen by its
physical GPU so that servers started one per GPU do not share them, and everything else on the rest."""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from infer.build import placement
from infer.build.dp_cores import place_the_rest
from infer.build.placement import CPUS_PER_RANK, MIN_OTHER_CPUS, core_cpus, other_cpus, physical_gpu, ranges

HOST = list(range(32))


def test_a_core_takes_the_cpus_of_its_gpu_and_its_tp_ranks():
    assert core_cpus("cuda:0", 1, HOST) == frozenset({0, 1})
    assert core_cpus("cuda", 1, HOST) == frozenset({0, 1})  # "cuda" is the current device, cuda:0
    assert core_cpus("cuda:1", 1, HOST) == frozenset({2, 3})
    assert core_cpus("cuda:2", 2, HOST) == frozenset(range(4, 8))  # ranks on cuda:2 and cuda:3


def test_positions_are_taken_among_the_available_cpus():
    narrowed = [3, 5, 7, 9, 11, 13]  # e.g. under `taskset -c 3,5,7,9,11,13`
    assert core_cpus("cuda:1", 1, narrowed) == frozenset({7, 9})


def test_nothing_is_pinned_off_cuda_or_without_room_for_the_others():
    assert core_cpus("cpu", 1, HOST) is None
    assert core_cpus("mps", 1, HOST) is None
    room = list(range(CPUS_PER_RANK + MIN_OTHER_CPUS))
    assert core_cpus("cuda:0", 1, room) == frozenset(range(CPUS_PER_RANK))
    assert core_cpus("cuda:0", 1, room[:-1]) is None
    assert core_cpus("cuda:15", 1, HOST) is None  # slot 30-31 would leave nothing beside it


def test_the_physical_gpu_comes_from_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert physical_gpu(0) == 3 and physical_gpu(1) == 1
    assert core_cpus("cuda:0", 1, HOST) == frozenset({6, 7})  # a second server on GPU 0 takes 0-1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f3a")  # UUIDs: the logical index
    assert physical_gpu(0) == 0
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert physical_gpu(2) == 2


def test_the_others_take_every_cpu_no_core_holds_and_only_when_every_core_is_pinned():
    assert other_cpus([("cuda:0", 1), ("cuda:1", 1)], HOST) == frozenset(range(4, 32))
    assert other_cpus([("cuda:0", 1), ("cpu", 1)], HOST) is None
    assert other_cpus([], HOST) is None


def test_ranges_reads_like_taskset():
    assert ranges(frozenset({0, 1, 2, 3, 8, 10, 11})) == "0-3,8,10-11"
    assert ranges(frozenset({5})) == "5"


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_pin_sets_this_process_affinity_and_none_leaves_it(monkeypatch):
    calls = []
    monkeypatch.setattr(placement.os, "sched_setaffinity", lambda pid, cpus: calls.append((pid, set(cpus))))
    assert placement.pin(None) is None and calls == []
    assert placement.pin(frozenset({2, 3})) == "2-3"
    assert calls == [(0, {2, 3})]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_a_refused_cpu_set_leaves_the_process_unpinned(monkeypatch):
    def refuse(pid, cpus):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(placement.os, "sched_setaffinity", refuse)
    assert placement.pin(frozenset({0, 1})) is None


def _core(device: str, host_cpus: list[int] | None, tp: int = 1) -> SimpleNamespace:
    config = SimpleNamespace(device=device, tensor_parallel_size=tp)
    return SimpleNamespace(info=SimpleNamespace(config=config), host_cpus=host_cpus)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this OS")
def test_the_launcher_takes_what_placed_cores_leave_and_nothing_otherwise(monkeypatch):
    calls = []
    monkeypatch.setattr(placement.os, "sched_setaffinity", lambda pid, cpus: calls.append(set(cpus)))
    assert place_the_rest([_core("cuda:0", HOST), _core("cuda:1", HOST)]) == "4-31"
    assert calls == [set(range(4, 32))]
    assert place_the_rest([_core("cuda:0", None)]) is None  # one engine: not placed
    assert place_the_rest([_core("cpu", HOST), _core("cpu", HOST)]) is None  # CPU engines use every core
    assert len(calls) == 1
