"""EngineClient: the API server's side of the engine core, on the server's event loop.

Requests go to the core (core_process.py) as token ids over a ZMQ DEALER socket, batched per event-loop turn;
each step's outputs come back as arrays and are turned into text here (text.py: detokenization, stop
strings), then delivered to per-request asyncio queues. A stop string found here is sent back to the core
as an abort with reason "stop". The client sends a heartbeat with its serving metrics every second (the core
aborts the requests of a silent API server and sums every server's metrics for /metrics). When the core's
connection drops or it reports a crash, every live request fails at once and `on_core_gone` is called. Should a
core come back on the same address (data parallelism restarts a dead core), the socket reconnects by itself and
the client serves again (`on_core_back`).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import pickle
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from infer import wire as m
from infer.frontend.metrics import ServingMetrics
from infer.frontend.outputs import StepOutput
from infer.frontend.text import TextProcessor
from infer.loader.tokenizer import Tokenizer
from infer.sampling.params import SamplingParams
from infer.wire import CoreInfo, ProbeCatalog, validate_prompt

log = logging.getLogger("infer.server")

HEARTBEAT_S = 1.0


class QueueFullError(RuntimeError):
    """The waiting queue holds max_waiting_requests requests already (the server answers 503)."""


class CoreGoneError(RuntimeError):
    """The engine core has exited or crashed (the server answers 503 and shuts down)."""


@dataclass(slots=True)
class _Live:
    """A request submitted here and not finished yet."""

    queue: asyncio.Queue[StepOutput]
    ended: asyncio.Future[None]  # done once its final output is queued
    submitted: float = field(default_factory=time.monotonic)
    last_token: float | None = None

    def put(self, out: StepOutput) -> None:
        self.queue.put_nowait(out)
        if out.finished and not self.ended.done():  # a reader that left cancelled it
            self.ended.set_result(None)


class RequestStream:
    """The outputs of one request, in order; leaving the iteration early aborts the request."""

    def __init__(self, client: EngineClient, request_id: str, live: _Live) -> None:
        self._client = client
        self.request_id = request_id
        self._live = live
        self.finished = False

    @property
    def queued(self) -> bool:
        """Outputs have arrived that the iteration has not taken yet."""
        return not self._live.queue.empty()

    async def __aiter__(self) -> AsyncIterator[StepOutput]:
        try:
            while not self.finished:
                out = await self._live.queue.get()
                self.finished = out.finished
                yield out
        finally:
            if not self.finished:
                self._client.abort(self.request_id)

    async def whole(self) -> list[StepOutput]:
        """Every output at once, when the request has ended: one wake-up per request instead of one per token, for
        a caller that reads only the end (offline generation, a response sent whole). Leaving early aborts it."""
        try:
            await self._live.ended
        finally:
            if not self._live.ended.done() or self._live.ended.cancelled():
                self._client.abort(self.request_id)
        queue = self._live.queue
        outputs = [queue.get_nowait() for _ in range(queue.qsize())]
        self.finished = True
        return outputs


class EngineClient:
    def __init__(self, info: CoreInfo, tokenizer: Tokenizer, max_waiting_requests: int,
                 on_core_gone: Callable[[str], None] | None = None,
                 on_core_back: Callable[[], None] | None = None) -> None:
        self.info = info
        self.max_waiting_requests = max_waiting_requests
        self.metrics = ServingMetrics()
        self.probes: ProbeCatalog | None = info.probes
        self.loras: dict[str, str] = dict(info.config.lora_modules or {})  # LoRA adapter name -> its path
        self.on_core_gone = on_core_gone
        self.on_core_back = on_core_back
        self.on_live_count: Callable[[int], None] | None = None  # told num_live whenever it changes (DP routing)
        self.gone_reason: str | None = None
        self.text = TextProcessor(tokenizer)
        self._live: dict[str, _Live] = {}
        self._adds: list[tuple[str, msgspec.Raw]] = []  # request id, the request encoded alone (m.encode_request)
        self._aborts: list[str] = []
        self._flush_scheduled = False
        self._core_waiting = 0  # the core's waiting queue as last reported
        self._core_running = 0  # and its running batch (data parallelism routes by both: dp_router.py)
        self._submitted = 0  # requests this client has submitted
        self._received = 0  # of which the core had taken in at that report (the rest are on their way)
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._call_ids = itertools.count(1)
        self._tasks: list[asyncio.Task[None]] = []

    # lifetime ----------------------------------------------------------------------------------

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.asyncio.Context()
        self._socket = self._ctx.socket(zmq.DEALER)
        for option, value in ((zmq.SNDHWM, 0), (zmq.RCVHWM, 0), (zmq.LINGER, 0)):
            self._socket.setsockopt(option, value)
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
        self._socket.connect(self.info.address)
        self._send(m.Heartbeat(self.metrics.snapshot()))  # the core knows us from now on
        self._tasks = [asyncio.create_task(c) for c in (self._read(), self._heartbeat(), self._watch(self._monitor))]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._socket.disable_monitor()
        self._monitor.close(linger=0)
        self._socket.close(linger=0)
        self._ctx.term()

    @property
    def alive(self) -> bool:
        return self.gone_reason is None

    @property
    def dead_engines(self) -> list[int]:
        """Its core, while gone (DPClient lists each of its engines so)."""
        return [] if self.alive else [0]

    @property
    def infos(self) -> list[CoreInfo]:
        """Every core this client talks to: its one (DPClient has several)."""
        return [self.info]

    @property
    def num_waiting(self) -> int:
        """Requests waiting in the core (as last reported) plus this client's that the core had not taken in then."""
        return self._core_waiting + self._submitted - self._received

    @property
    def num_running(self) -> int:
        """The core's running batch, as last reported to this client."""
        return self._core_running

    # requests ----------------------------------------------------------------------------------

    def submit(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
               probe_names: tuple[str, ...] = (), incremental_text: bool = True) -> RequestStream:
        """Queue a request; ValueError for a prompt the engine cannot run (m.UnsendableRequest, naming the field, for
        one that cannot be encoded), QueueFullError when full, CoreGoneError once the core has gone. Nothing of a
        refused request stays behind. `incremental_text=False`: only the final text is read (TextProcessor.add)."""
        if self.gone_reason is not None:
            raise CoreGoneError(self.gone_reason)
        validate_prompt(prompt_token_ids, self.info.config.max_seq_len, self.info.vocab_size)
        if self.num_waiting >= self.max_waiting_requests:
            raise QueueFullError(f"the waiting queue is full ({self.max_waiting_requests} requests); retry later")
        payload = m.encode_request(m.CoreRequest(request_id, list(prompt_token_ids), params))
        live = self._live[request_id] = _Live(asyncio.Queue(), self._loop.create_future())
        self.text.add(request_id, prompt_token_ids, params, probe_names, incremental_text)
        self._adds.append((request_id, payload))
        self._submitted += 1
        self._schedule_flush()
        self._live_changed()
        return RequestStream(self, request_id, live)

    def abort(self, request_id: str) -> None:
        """End a request early (its client left); its final output still counts in the metrics."""
        if request_id in self._live and self.gone_reason is None:
            self._aborts.append(request_id)
            self._schedule_flush()

    @property
    def num_live(self) -> int:
        """Requests submitted through this client and not finished."""
        return len(self._live)

    def abort_all(self) -> int:
        """End every live request (the server is stopping; finish_reason "abort"); how many there were."""
        for request_id in list(self._live):
            self.abort(request_id)
        return len(self._live)

    async def call(self, method: str, *args: Any) -> Any:
        """Run a utility call in the core between two steps; its result, or RuntimeError with its error."""
        if self.gone_reason is not None:
            raise CoreGoneError(self.gone_reason)
        call_id = next(self._call_ids)
        future = self._calls[call_id] = self._loop.create_future()
        self._send(m.Call(call_id, method, list(args)))
        return await future

    # the wire ----------------------------------------------------------------------------------

    def _send(self, msg: m.ToCore | m.EncodedAdd) -> None:
        self._socket.send(m.encode(msg), copy=False)  # never blocks: no high-water mark

    def _schedule_flush(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send what was submitted and aborted since the last flush, as one message each. It runs at the end of the
        event-loop turn that queued them; a caller done submitting calls it at once, so the core starts before the
        caller's own work in that turn (a response's set-up) ends."""
        self._flush_scheduled = False
        if self.gone_reason is not None:
            return
        adds, aborts = self._adds, self._aborts
        self._adds, self._aborts = [], []  # taken before sending: what one send did never reaches the next
        if adds:
            try:
                self._send(m.EncodedAdd([payload for _, payload in adds]))
            except Exception as exc:  # noqa: BLE001 - these requests never reached the core: they fail, no one else
                log.exception("could not send %d request(s) to the engine core", len(adds))
                self._submitted -= len(adds)
                for request_id, _ in adds:
                    self._fail(request_id, f"the request could not be sent to the engine core: {exc}")
        if aborts:
            self._send(m.Abort(aborts))

    async def _read(self) -> None:
        while True:
            msg = m.decode_from_core(await self._socket.recv())
            if isinstance(msg, m.Outputs):
                self._deliver(msg.step)
            elif isinstance(msg, m.Reply):
                self._reply(msg)
            elif isinstance(msg, m.Shutdown):
                self._gone(f"the engine core failed: {msg.reason}")

    def _deliver(self, step: m.CoreOutputs) -> None:
        self._core_waiting, self._core_running, self._received = step.num_waiting, step.num_running, step.received
        now = time.monotonic()
        live_of, observe = self._live, self.metrics.observe
        ended = False
        for out in self.text.process_step(step.emitted):
            live = live_of.get(out.request_id)
            if live is None:
                continue
            observe(out, now, live.submitted, live.last_token)
            if out.token_id is not None:
                live.last_token = now
            if out.finished:
                del live_of[out.request_id]
                ended = True
            live.put(out)
        if ended:
            self._live_changed()
        stopped = self.text.take_stopped()
        if stopped:
            self._send(m.Abort(stopped, "stop"))

    def _reply(self, msg: m.Reply) -> None:
        if msg.call_id == m.PROBES_CHANGED:  # a probe reload through any API server: names are checked against the new set
            self.probes = pickle.loads(msg.result)
            return
        if msg.call_id == m.LORAS_CHANGED:  # an adapter loaded or unloaded through any API server
            self.loras = pickle.loads(msg.result)
            return
        future = self._calls.pop(msg.call_id, None)
        if future is None or future.done():
            return
        if msg.error is not None:
            future.set_exception(RuntimeError(msg.error))
        else:
            future.set_result(pickle.loads(msg.result))

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_S)
            self._send(m.Heartbeat(self.metrics.snapshot()))

    async def _watch(self, monitor: zmq.asyncio.Socket) -> None:
        """The core's connection dropping means its process has ended; connecting again, that a new core serves
        on its address (a core binds only once it is ready)."""
        while True:
            event = parse_monitor_message(await monitor.recv_multipart())
            if event["event"] == zmq.EVENT_DISCONNECTED:
                self._gone(f"the engine core process (pid {self.info.pid}) exited")
            elif event["event"] == zmq.EVENT_CONNECTED and self.gone_reason is not None:
                self._back()

    def _back(self) -> None:
        """A new core serves on the address: nothing of the old one's counts, and it learns of us at once."""
        log.warning("an engine core serves again on %s", self.info.address)
        self.gone_reason = None
        self._core_waiting = self._core_running = self._submitted = self._received = 0
        self._send(m.Heartbeat(self.metrics.snapshot()))
        if self.on_core_back is not None:
            self.on_core_back()

    def _fail(self, request_id: str, reason: str) -> None:
        """End one live request with an error output."""
        live = self._live.pop(request_id, None)
        out = self.text.finish(request_id, reason)
        if live is not None and out is not None:
            live.put(out)
        if live is not None:
            self._live_changed()

    def _live_changed(self) -> None:
        """Tell `on_live_count` (the DP load board) how many requests are live here now."""
        if self.on_live_count is not None:
            self.on_live_count(len(self._live))

    def _gone(self, reason: str) -> None:
        """Fail every live request and call, once."""
        if self.gone_reason is not None:
            return
        self.gone_reason = reason
        log.error("%s; failing %d live request(s)", reason, len(self._live))
        for request_id in list(self._live):
            self._fail(request_id, reason)
        for future in self._calls.values():
            if not future.done():
                future.set_exception(CoreGoneError(reason))
        self._calls.clear()
        if self.on_core_gone is not None:
            self.on_core_gone(reason)
