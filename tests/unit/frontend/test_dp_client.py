"""DPClient over fake engine clients: submits go where the router says, past a full queue; an abort reaches only the
engine that owns the request; utility calls reach every engine and combine (metrics summed, probe reloads on all,
idle only when all are); one engine gone fails every engine's requests and tells the server once. And each DP
engine's config: its own device (TP-wide strides on CUDA), its own seed, data_parallel_size 1."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from infer.frontend.client import CoreGoneError, QueueFullError
from infer.engine.config import EngineConfig, EngineConfigError
from infer.wire import EngineStats
from infer.frontend.dp_client import DPClient
from infer.frontend.load_board import LoadBoard
from infer.build.dp_cores import engine_configs
from infer.frontend.metrics import ServingMetrics
from infer.sampling.params import SamplingParams


@dataclass
class FakeClient:
    """What DPClient uses of an EngineClient."""

    num_waiting: int = 0
    num_running: int = 0
    live: set[str] = field(default_factory=set)
    aborted: list[str] = field(default_factory=list)
    calls: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    answer: Any = None
    gone: str | None = None
    metrics: ServingMetrics = field(default_factory=ServingMetrics)
    probes: Any = None
    on_live_count: Any = None

    def submit(self, request_id: str, prompt: list[int], params: Any, probe_names: tuple[str, ...] = (),
               incremental_text: bool = True) -> str:
        self.live.add(request_id)
        self.num_waiting += 1
        self.on_live_count(len(self.live))
        return request_id

    def finish(self, request_id: str) -> None:
        self.live.discard(request_id)
        self.num_waiting -= 1
        self.on_live_count(len(self.live))

    def abort(self, request_id: str) -> None:
        if request_id in self.live:
            self.aborted.append(request_id)

    def flush(self) -> None:
        self.calls.append(("flush", ()))

    def abort_all(self) -> int:
        for request_id in self.live:
            self.abort(request_id)
        return len(self.live)

    @property
    def num_live(self) -> int:
        return len(self.live)

    async def call(self, method: str, *args: Any) -> Any:
        self.calls.append((method, args))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer

    @property
    def alive(self) -> bool:
        return self.gone is None


@dataclass
class FakeInfo:
    config: EngineConfig
    pid: int = 1
    probes: Any = None


def dp(n: int, method: str = "least_load", max_waiting: int = 4,
       board: LoadBoard | None = None) -> tuple[DPClient, list[FakeClient], list[str]]:
    gone: list[str] = []
    config = EngineConfig(device="cpu", load_balance_method=method)
    client = DPClient([FakeInfo(config, pid=i) for i in range(n)], _NoTokenizer(), max_waiting, gone.append,  # type: ignore[list-item]
                      method, board)
    fakes = [FakeClient(on_live_count=real.on_live_count) for real in client.clients]  # what DPClient hooked up
    client.clients = fakes  # type: ignore[assignment]
    return client, fakes, gone


class _NoTokenizer:
    eos_token_ids: frozenset[int] = frozenset()


def test_submits_spread_by_least_load_and_skip_a_full_engine():
    cells = LoadBoard.shared(2, 2)
    client, fakes, _ = dp(2, max_waiting=2, board=LoadBoard(cells, 2, 2, row=0))
    LoadBoard(cells, 2, 2, row=1).set(0, 5)  # another API server's 5 live requests on engine 0
    for i in range(3):
        client.submit(f"r{i}", [1, 2], SamplingParams())
    assert fakes[1].live == {"r0", "r1"} and fakes[0].live == {"r2"}  # engine 1 filled its queue, then engine 0
    client.submit("r3", [1], SamplingParams())
    with pytest.raises(QueueFullError, match="every live engine"):
        client.submit("r4", [1], SamplingParams())
    assert client.max_waiting_requests == 4 and client.num_live == 4


def test_api_servers_sharing_a_board_split_a_burst_evenly_and_see_requests_end():
    """Two API servers whose ties both start at engine 0 (rows 0 and 2 of 2 engines): by their own requests alone
    each would send 2 of its 3 to engine 0 (4 against 2); through the board the burst lands 3 and 3."""
    cells = LoadBoard.shared(3, 2)
    servers = [dp(2, board=LoadBoard(cells, 3, 2, row=row))[:2] for row in (0, 2)]
    for s, (client, _) in enumerate(servers):
        for i in range(3):
            client.submit(f"s{s}-r{i}", [1], SamplingParams())

    def on_engines() -> list[int]:
        return [sum(len(fakes[e].live) for _, fakes in servers) for e in range(2)]

    assert on_engines() == [3, 3]
    client, fakes = servers[0]
    for request_id in list(fakes[0].live):
        fakes[0].finish(request_id)
    assert on_engines() == [1, 3]
    assert [load.requests for load in client.loads()] == [1, 3] == [load.requests for load in servers[1][0].loads()]


def test_an_abort_reaches_only_the_owner():
    client, fakes, _ = dp(3, "round_robin")
    for i in range(3):
        client.submit(f"r{i}", [1], SamplingParams())
    client.abort("r1")
    assert [f.aborted for f in fakes] == [[], ["r1"], []]
    assert client.abort_all() == 3
    client.flush()
    assert all(f.calls == [("flush", ())] for f in fakes)


def test_metrics_sum_every_engine_and_keep_each_servers_snapshots():
    client, fakes, _ = dp(2)
    for i, fake in enumerate(fakes):
        fake.answer = (EngineStats(num_running=i + 1, kv_blocks_total=100, kv_blocks_free=90 - i, num_preemptions=i,
                                   prefix_cache_queries=10, prefix_cache_hits=i), 3, [{"e": i}])
    stats, waiting, snapshots = asyncio.run(client.call("metrics", {}))
    assert stats == EngineStats(3, 200, 179, 1, 20, 1) and waiting == 6 and snapshots == [{"e": 0}, {"e": 1}]
    assert all(f.calls[0][0] == "metrics" for f in fakes)


def test_probe_reloads_idle_and_audits_reach_every_engine():
    client, fakes, _ = dp(2)
    for fake in fakes:
        fake.answer = "layout-v2"
    assert asyncio.run(client.call("reload_probes")) == "layout-v2"
    assert [f.calls for f in fakes] == [[("reload_probes", ())]] * 2
    fakes[1].answer = False
    fakes[0].answer = True
    assert asyncio.run(client.call("idle")) is False
    fakes[0].answer, fakes[1].answer = {}, {3: "r1"}
    assert asyncio.run(client.call("audit_blocks")) == {(1, 3): "r1"}
    client.probes = "v3"
    assert [f.probes for f in fakes] == ["v3", "v3"]


def test_a_failed_call_names_the_engine_and_a_gone_core_wins():
    client, fakes, _ = dp(2)
    fakes[1].answer = RuntimeError("bad probe file")
    with pytest.raises(RuntimeError, match="engine 1: bad probe file"):
        asyncio.run(client.call("reload_probes"))
    fakes[0].answer = CoreGoneError("core 0 exited")
    with pytest.raises(CoreGoneError):
        asyncio.run(client.call("reload_probes"))


def test_one_engine_gone_leaves_the_others_serving_until_every_one_is_gone():
    """A gone engine (its client failed its own requests) takes no new request and no utility call; the server
    is told only when the last engine is gone, once; an engine that serves again takes requests again."""
    client, fakes, gone = dp(2)
    fakes[1].gone = "the engine core process (pid 7) exited"
    client._core_gone(1, fakes[1].gone)
    assert client.alive and client.dead_engines == [1] and gone == []
    for i in range(3):
        client.submit(f"r{i}", [1], SamplingParams())
    assert fakes[0].live == {"r0", "r1", "r2"} and fakes[1].live == set()
    fakes[0].answer = {}
    assert asyncio.run(client.call("audit_blocks")) == {} and fakes[1].calls == []
    fakes[0].gone = "the engine core process (pid 6) exited"
    client._core_gone(0, fakes[0].gone)
    client._core_gone(0, "again")
    assert not client.alive and len(gone) == 1 and "every engine core is gone" in gone[0]
    with pytest.raises(CoreGoneError):
        client.submit("r", [1], SamplingParams())
    fakes[1].gone = None  # restarted: its socket reconnected
    client._core_back(1)
    assert client.dead_engines == [0] and client.alive


def test_each_engine_gets_its_device_seed_and_no_dp_of_its_own(monkeypatch):
    cpu = engine_configs(EngineConfig(device="cpu", data_parallel_size=3, seed=5))
    assert [(c.device, c.seed, c.data_parallel_size) for c in cpu] == [("cpu", 5, 1), ("cpu", 6, 1), ("cpu", 7, 1)]
    monkeypatch.setattr("infer.build.dp_cores.cuda_device_count", lambda: 8)  # engine/devices.py's count
    config = replace(EngineConfig(device="cpu"), device="cuda:2", data_parallel_size=3, tensor_parallel_size=2)
    assert [c.device for c in engine_configs(config)] == ["cuda:2", "cuda:4", "cuda:6"]
    with pytest.raises(EngineConfigError, match="data_parallel_size=4: needs 4 x tensor_parallel_size=2"):
        engine_configs(replace(config, data_parallel_size=4))
