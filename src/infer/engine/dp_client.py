"""DPClient: N engine cores (`--data-parallel-size N`) behind the interface of one EngineClient.

It wraps one EngineClient per core (each with its own ZMQ socket, heartbeats, text processing and serving
metrics) and adds only what differs: `submit` asks the Router (dp_router.py) which core takes the request;
`abort` reaches the core that owns it (only the client holding a live request sends anything); utility calls go
to every core and their answers are combined (`metrics` sums the cores' stats and queues and concatenates every
API server's serving metrics; `reload_probes` swaps the set in every core; `idle` and `audit_blocks` cover all).
One core exiting fails every live request of every core with a clear error and calls `on_core_gone`, as one
EngineClient does for its core: the server stops instead of serving on part of its engines.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

from infer.engine.client import CoreGoneError, EngineClient, QueueFullError, RequestStream
from infer.engine.core import EngineStats
from infer.engine.core_process import CoreInfo
from infer.engine.dp_router import EngineLoad, Router
from infer.engine.metrics import ServingMetrics
from infer.loader.tokenizer import Tokenizer
from infer.sampling.params import SamplingParams
from omniscience import ProbeLayout


class DPClient:
    def __init__(self, infos: Sequence[CoreInfo], tokenizer: Tokenizer, max_waiting_requests: int,
                 on_core_gone: Callable[[str], None] | None = None, load_balance_method: str = "least_load") -> None:
        self.infos = list(infos)
        self.on_core_gone = on_core_gone
        self.gone_reason: str | None = None
        self.per_engine_waiting = max_waiting_requests
        self.clients = [EngineClient(info, tokenizer, max_waiting_requests, self._core_gone) for info in self.infos]
        self.router = Router(load_balance_method, len(self.clients), self.infos[0].config.block_size)

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
    def probe_layout(self) -> ProbeLayout | None:
        return self.clients[0].probe_layout

    @probe_layout.setter
    def probe_layout(self, layout: ProbeLayout | None) -> None:
        for client in self.clients:
            client.probe_layout = layout

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

    def _core_gone(self, reason: str) -> None:
        """One core exited or crashed: fail the others' requests too, once, and tell the server."""
        if self.gone_reason is not None:
            return
        self.gone_reason = reason
        for client in self.clients:
            client._gone(reason)  # the gone core's client has already failed its own; the others fail theirs now
        if self.on_core_gone is not None:
            self.on_core_gone(reason)

    # requests ----------------------------------------------------------------------------------

    def loads(self) -> list[EngineLoad]:
        return [EngineLoad(c.num_waiting, c.num_running, c.num_waiting >= self.per_engine_waiting)
                for c in self.clients]

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               probe_names: tuple[str, ...] = (), incremental_text: bool = True) -> RequestStream:
        """Queue a request on the core the router picks; errors as EngineClient.submit's."""
        if self.gone_reason is not None:
            raise CoreGoneError(self.gone_reason)
        index = self.router.pick(prompt_token_ids, self.loads())
        if index is None:
            raise QueueFullError(f"the waiting queue of every engine is full ({self.per_engine_waiting} requests "
                                 f"each, {len(self.clients)} engines); retry later")
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
        if method == "metrics":  # each client sends its own serving metrics, not the merged ones
            calls = [c.call(method, c.metrics.snapshot()) for c in self.clients]
        else:
            calls = [c.call(method, *args) for c in self.clients]
        results = await asyncio.gather(*calls, return_exceptions=True)
        errors = [(i, r) for i, r in enumerate(results) if isinstance(r, BaseException)]
        gone = next((r for _, r in errors if isinstance(r, CoreGoneError)), None)
        if gone is not None:
            raise gone
        if errors:
            raise RuntimeError("; ".join(f"engine {i}: {r}" for i, r in errors))
        return combine(method, results)


def combine(method: str, results: list[Any]) -> Any:
    """One answer from every core's answer to a utility call."""
    if method == "metrics":
        stats = [r[0] for r in results]
        summed = EngineStats(**{f.name: sum(getattr(s, f.name) for s in stats) for f in dataclasses.fields(EngineStats)})
        return summed, sum(r[1] for r in results), [snap for r in results for snap in r[2]]
    if method == "idle":
        return all(results)
    if method == "audit_blocks":  # leaked blocks keyed (engine, block id): empty when no core leaked one
        return {(i, block): owner for i, r in enumerate(results) for block, owner in r.items()}
    if method == "reload_probes":
        return results[0]  # every core read the same file
    return results


def client_for(infos: Sequence[CoreInfo], tokenizer: Tokenizer,
               on_core_gone: Callable[[str], None] | None = None) -> EngineClient | DPClient:
    """The API server's client: an EngineClient for one core, a DPClient routing over several."""
    config = infos[0].config
    if len(infos) == 1:
        return EngineClient(infos[0], tokenizer, config.max_waiting_requests, on_core_gone)
    return DPClient(infos, tokenizer, config.max_waiting_requests, on_core_gone, config.load_balance_method)
