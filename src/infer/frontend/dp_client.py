"""DPClient: N engine cores (`--data-parallel-size N`) behind the interface of one EngineClient.

It wraps one EngineClient per core (each with its own ZMQ socket, heartbeats, text processing and serving
metrics) and adds only what differs: `submit` asks the Router (dp_router.py) which core takes the request, by
the live requests every API server has on each core (the LoadBoard, load_board.py, which this client keeps
current for its own);
`abort` reaches the core that owns it (only the client holding a live request sends anything); utility calls go
to every live core and their answers are combined (`metrics` sums the cores' stats and queues and concatenates
every API server's serving metrics; `reload_probes` swaps the set in every core; `idle` and `audit_blocks` cover
all).
One core exiting fails that core's live requests only: the router sends new ones to the live cores, the server
reports itself degraded, and once the supervisor has restarted the core on its address (infer/server/launch.py)
its client serves again. Only when every core is gone is `on_core_gone` called and the server stops.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

from infer.frontend.client import CoreGoneError, EngineClient, QueueFullError, RequestStream
from infer.wire import EngineStats
from infer.frontend.dp_router import EngineLoad, Router
from infer.frontend.load_board import LoadBoard
from infer.frontend.metrics import ServingMetrics
from infer.loader.tokenizer import Tokenizer
from infer.sampling.params import SamplingParams
from infer.wire import CoreInfo, ProbeCatalog

log = logging.getLogger("infer.server")


class DPClient:
    def __init__(self, infos: Sequence[CoreInfo], tokenizer: Tokenizer, max_waiting_requests: int,
                 on_core_gone: Callable[[str], None] | None = None, load_balance_method: str = "least_load",
                 board: LoadBoard | None = None) -> None:
        self.infos = list(infos)
        self.on_core_gone = on_core_gone
        self.gone_reason: str | None = None  # set once every core is gone
        self.per_engine_waiting = max_waiting_requests
        self.clients = [EngineClient(info, tokenizer, max_waiting_requests, partial(self._core_gone, i),
                                     partial(self._core_back, i)) for i, info in enumerate(self.infos)]
        self.board = board or LoadBoard.private(len(self.clients))
        if self.board.engines != len(self.clients):
            raise ValueError(f"a load board of {self.board.engines} engines for {len(self.clients)} cores")
        for i, client in enumerate(self.clients):
            client.on_live_count = partial(self.board.set, i)
        self.router = Router(load_balance_method, len(self.clients), self.infos[0].config.block_size,
                             first=self.board.row)

    @property
    def info(self) -> CoreInfo:
        """The first core's facts (model, resolved config, vocabulary: the same on every core)."""
        return self.infos[0]

    @property
    def max_waiting_requests(self) -> int:
        """Requests all cores queue at once: the router sends a request past a full queue to another core."""
        return self.per_engine_waiting * len(self.clients)

    @property
    def metrics(self) -> ServingMetrics:
        return ServingMetrics.merged([c.metrics.snapshot() for c in self.clients])

    @property
    def probes(self) -> ProbeCatalog | None:
        return self.clients[0].probes

    @probes.setter
    def probes(self, layout: ProbeCatalog | None) -> None:
        for client in self.clients:
            client.probes = layout

    @property
    def loras(self) -> dict[str, str]:
        """The loaded LoRA adapters (every core loads the same)."""
        return self.clients[0].loras

    # lifetime ----------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        for client in self.clients:
            await client.start()

    async def close(self) -> None:
        for client in self.clients:
            await client.close()

    @property
    def alive(self) -> bool:
        return self.gone_reason is None

    @property
    def dead_engines(self) -> list[int]:
        """The engines whose core is gone (until it is restarted): the server is degraded while there are any."""
        return [i for i, c in enumerate(self.clients) if not c.alive]

    def _core_gone(self, index: int, reason: str) -> None:
        """One core exited or crashed (its client has failed its requests): serve on the others; stop when none is
        left."""
        log.error("engine %d of %d: %s; serving on the others until it is restarted", index, len(self.clients), reason)
        if self.gone_reason is None and not any(c.alive for c in self.clients):
            self.gone_reason = f"every engine core is gone (the last: {reason})"
            if self.on_core_gone is not None:
                self.on_core_gone(self.gone_reason)

    def _core_back(self, index: int) -> None:
        log.warning("engine %d of %d serves again", index, len(self.clients))
        self.gone_reason = None

    # requests ----------------------------------------------------------------------------------

    def loads(self) -> list[EngineLoad]:
        return [EngineLoad(live, not c.alive or c.num_waiting >= self.per_engine_waiting)
                for live, c in zip(self.board.totals(), self.clients)]

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               probe_names: tuple[str, ...] = (), incremental_text: bool = True) -> RequestStream:
        """Queue a request on the core the router picks; errors as EngineClient.submit's."""
        if self.gone_reason is not None:
            raise CoreGoneError(self.gone_reason)
        index = self.router.pick(prompt_token_ids, self.loads(), params.lora)
        if index is None:
            raise QueueFullError(f"the waiting queue of every live engine is full ({self.per_engine_waiting} requests "
                                 f"each, {len(self.clients) - len(self.dead_engines)} of {len(self.clients)} engines "
                                 f"live); retry later")
        return self.clients[index].submit(request_id, prompt_token_ids, params, probe_names, incremental_text)

    def abort(self, request_id: str) -> None:
        for client in self.clients:  # only the client that holds the request live sends the abort
            client.abort(request_id)

    def flush(self) -> None:
        """Every core's submissions and aborts now (EngineClient.flush)."""
        for client in self.clients:
            client.flush()

    @property
    def num_live(self) -> int:
        return sum(c.num_live for c in self.clients)

    def abort_all(self) -> int:
        return sum(c.abort_all() for c in self.clients)

    async def call(self, method: str, *args: Any) -> Any:
        """A utility call on every core, their answers combined (see the module docstring)."""
        if self.gone_reason is not None:
            raise CoreGoneError(self.gone_reason)
        live = [(i, c) for i, c in enumerate(self.clients) if c.alive]
        if method == "metrics":  # each client sends its own serving metrics, not the merged ones
            calls = [c.call(method, c.metrics.snapshot()) for _, c in live]
        else:
            calls = [c.call(method, *args) for _, c in live]
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [(i, r) for (i, _), r in zip(live, results) if isinstance(r, BaseException)]
        gone = next((r for _, r in errors if isinstance(r, CoreGoneError)), None)
        if gone is not None:
            raise gone
        if errors:
            raise RuntimeError("; ".join(f"engine {i}: {r}" for i, r in errors))
        return combine(method, results, [i for i, _ in live])


def combine(method: str, results: list[Any], engines: list[int]) -> Any:
    """One answer from the answers of `engines` (their indices) to a utility call."""
    if method == "metrics":
        stats = [r[0] for r in results]
        counts = [f.name for f in dataclasses.fields(EngineStats) if f.name != "lora_requests"]
        summed = EngineStats(**{name: sum(getattr(s, name) for s in stats) for name in counts},
                             lora_requests=merge_lora_requests([s.lora_requests for s in stats]))
        return summed, sum(r[1] for r in results), [snap for r in results for snap in r[2]]
    if method == "idle":
        return all(results)
    if method == "audit_blocks":  # leaked blocks keyed (engine, block id): empty when no core leaked one
        return {(i, block): owner for i, r in zip(engines, results) for block, owner in r.items()}
    if method in ("reload_probes", "load_lora", "unload_lora"):
        return results[0]  # every core read the same file
    return results


def merge_lora_requests(per_engine: list[tuple[tuple[str, int, int], ...]]) -> tuple[tuple[str, int, int], ...]:
    """Per-adapter (name, running, waiting) summed over engines."""
    merged: dict[str, tuple[int, int]] = {}
    for entries in per_engine:
        for name, running, waiting in entries:
            r, w = merged.get(name, (0, 0))
            merged[name] = (r + running, w + waiting)
    return tuple((name, r, w) for name, (r, w) in sorted(merged.items()))


def client_for(infos: Sequence[CoreInfo], tokenizer: Tokenizer,
               on_core_gone: Callable[[str], None] | None = None,
               board: LoadBoard | None = None) -> EngineClient | DPClient:
    """The API server's client: an EngineClient for one core, a DPClient routing over several (by `board`, the
    load board the API servers share, or a private one)."""
    config = infos[0].config
    if len(infos) == 1:
        return EngineClient(infos[0], tokenizer, config.max_waiting_requests, on_core_gone)
    return DPClient(infos, tokenizer, config.max_waiting_requests, on_core_gone, config.load_balance_method, board)
