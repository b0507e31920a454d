"""The engine-core process's loop: the scheduler and the runner in a busy loop, nothing else.

API server processes (infer/frontend/client.py) connect to one ROUTER socket over ZMQ (ipc): requests come in as
token ids, every step's outputs go back to the API server that sent each request, as arrays of token ids and
finish reasons (infer/wire.py). The core never detokenizes or formats. Between two steps it drains what
arrived (requests, aborts, utility calls, heartbeats); while nothing runs it waits on the socket. A request
whose grammar is not compiled yet waits for it off the step loop (grammar_jobs.py) and joins once it is ready.
An API server silent for CLIENT_TIMEOUT_S has its requests aborted, so the others lose nothing when one dies;
a crash of the core itself is told to every API server (`Shutdown`) before the process exits non-zero.
"""

from __future__ import annotations

import logging
import os
import pickle
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import repeat
from typing import Any

import zmq

from infer import wire as m
from infer.distributed.group import DistributedError
from infer.engine.core import EngineCore
from infer.engine.grammar_jobs import GrammarJobs
from omniscience import ProbeSet

log = logging.getLogger("infer.core")

CLIENT_TIMEOUT_S = 10.0  # an API server silent this long is gone: its requests are aborted
IDLE_POLL_MS = 1000
COMPILE_POLL_MS = 5  # while a grammar compiles and nothing else runs: how soon its request is admitted


class CoreLoop:
    """Drain messages, step, send each API server its outputs; repeat."""

    def __init__(self, engine: EngineCore, address: str, read_probe_set: Callable[[], ProbeSet]) -> None:
        self.engine = engine
        self._read_probe_set = read_probe_set  # the configured probe-set file, read again on a reload
        self._ctx = zmq.Context()
        self.socket = self._ctx.socket(zmq.ROUTER)
        self.socket.setsockopt(zmq.SNDHWM, 0)  # never drop an output
        self.socket.setsockopt(zmq.RCVHWM, 0)
        self.socket.setsockopt(zmq.LINGER, 1000)
        self.socket.bind(address)
        self._owner: dict[str, bytes] = {}  # request id -> the API server that sent it
        self._last_seen: dict[bytes, float] = {}
        self._metrics: dict[bytes, dict[str, Any]] = {}  # each API server's serving metrics (its last heartbeat)
        self._received: dict[bytes, int] = defaultdict(int)  # requests each API server has sent that arrived
        self._stopping = False
        self._next_check = 0.0
        self._parent = os.getppid()  # the process that started the core: its death ends the core too
        self.grammars = GrammarJobs(engine.grammars, engine.config.structured_compile_timeout_s)

    def stop(self) -> None:
        self._stopping = True

    def run(self) -> None:
        try:
            while not self._stopping:
                poll_ms = COMPILE_POLL_MS if self.grammars.pending else IDLE_POLL_MS
                self._drain(block=not self.engine.has_unfinished(), poll_ms=poll_ms)
                self._admit_compiled()
                self._check_clients()
                if self.engine.has_unfinished():
                    self._step()
        except BaseException as exc:  # a bug in the core: tell every API server why, then exit non-zero
            log.exception("engine core failed")
            self._broadcast(m.Shutdown(f"{type(exc).__name__}: {exc}"))
            raise
        finally:
            self.grammars.close()
            self.engine.runner.close()
            self.socket.close()
            self._ctx.term()

    def _step(self) -> None:
        try:
            step = self.engine.step_core()
        except DistributedError as exc:  # a tensor-parallel rank is gone: fail what is in flight, then exit
            self._send(m.CoreStep(outputs=self.engine.fail_all(f"{type(exc).__name__}: {exc}")))
            raise
        except Exception as exc:  # fail what is in flight, keep serving
            log.exception("engine step failed")
            step = m.CoreStep(outputs=self.engine.fail_all(f"{type(exc).__name__}: {exc}"))
        self._send(step)

    def _send(self, step: m.CoreStep) -> None:
        """Each API server its requests' part of the step."""
        if not step.request_ids and not step.outputs:
            return
        owners = self._owner
        by_owner: dict[bytes, m.CoreStep] = defaultdict(m.CoreStep)
        for request_id, token, values in zip(step.request_ids, step.token_ids, step.probes or repeat(None)):
            owner = owners.get(request_id)  # none only for a request failed since (fail_all after a step's error)
            if owner is None:
                continue
            part = by_owner[owner]
            part.request_ids.append(request_id)
            part.token_ids.append(token)
            if step.probes:
                part.probes.append(values)
        for out in step.outputs:
            owner = owners.pop(out.request_id, None) if out.finish_reason is not None else owners.get(out.request_id)
            if owner is not None:
                by_owner[owner].outputs.append(out)
        for owner, part in by_owner.items():
            self._send_to(owner, part)

    def _drain(self, block: bool, poll_ms: int = IDLE_POLL_MS) -> None:
        """Handle every message that has arrived; with `block`, wait up to `poll_ms` for the first."""
        if block and not self.socket.poll(poll_ms):
            return
        while True:
            try:
                identity, data = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self._last_seen[identity] = time.monotonic()
            self._handle(identity, m.decode_to_core(data))

    def _handle(self, identity: bytes, msg: m.ToCore) -> None:
        if isinstance(msg, m.Add):
            self._received[identity] += len(msg.requests)
            for req in msg.requests:
                if self.grammars.needs_compile(req):  # it waits alone for its grammar; the steps go on
                    self.grammars.submit(req, identity)
                    self._owner[req.request_id] = identity
                    continue
                try:
                    self.engine.add_request(req.prompt_token_ids, req.params, req.request_id)
                except ValueError as exc:
                    failed = m.CoreOutput(req.request_id, None, "error", str(exc), True)
                    self._send_to(identity, m.CoreStep(outputs=[failed]))
                    continue
                self._owner[req.request_id] = identity
        elif isinstance(msg, m.Abort):
            for request_id in msg.request_ids:
                if self.grammars.cancel(request_id) is not None:
                    self._send(m.CoreStep(outputs=[m.CoreOutput(request_id, None, msg.reason)]))
                else:
                    self.engine.abort(request_id, msg.reason)
        elif isinstance(msg, m.Heartbeat):
            self._metrics[identity] = msg.metrics
        elif isinstance(msg, m.Call):
            try:
                result, error = pickle.dumps(self._call(identity, msg.method, msg.args)), None
            except Exception as exc:  # the caller decides; the core keeps serving
                result, error = None, f"{type(exc).__name__}: {exc}"
            self.socket.send_multipart([identity, m.encode(m.Reply(msg.call_id, result, error))])

    def _admit_compiled(self) -> None:
        """Requests whose grammar is ready join the scheduler; a failed or too slow compile ends its request."""
        for done in self.grammars.take_finished():
            req = done.job.request
            error = done.error
            if error is None:
                try:
                    self.engine.add_request(req.prompt_token_ids, req.params, req.request_id)
                    continue
                except ValueError as exc:
                    error = str(exc)
            self._send(m.CoreStep(outputs=[m.CoreOutput(req.request_id, None, "error", error, True)]))

    def _send_to(self, identity: bytes, emitted: m.CoreStep) -> None:
        scheduler = self.engine.scheduler
        step = m.CoreOutputs(emitted, len(scheduler.waiting), len(scheduler.running), self._received[identity])
        self.socket.send_multipart([identity, m.encode(m.Outputs(step))], copy=False)

    def _call(self, identity: bytes, method: str, args: list[Any]) -> Any:
        """Utility calls, run between two steps."""
        engine = self.engine
        if method == "metrics":  # the caller's metrics now, and every API server's last
            self._metrics[identity] = args[0]
            return engine.stats(), len(engine.scheduler.waiting), list(self._metrics.values())
        if method == "audit_blocks":
            return engine.kv.audit_blocks()
        if method == "idle":
            return not engine.has_unfinished()
        if method == "reload_probes":
            engine.swap_probes(self._read_probe_set())
            catalog = engine.probe_catalog
            self._broadcast(m.Reply(m.PROBES_CHANGED, pickle.dumps(catalog)))  # every API server checks names against it now
            return catalog
        if method in ("load_lora", "unload_lora"):
            if method == "load_lora":
                engine.add_lora(*args)
            else:
                engine.remove_lora(*args)
            adapters = {ref.name: ref.path for ref in engine.lora_adapters()}
            self._broadcast(m.Reply(m.LORAS_CHANGED, pickle.dumps(adapters)))  # every API server serves the new set
            return adapters
        raise ValueError(f"unknown core call {method!r}")

    def _check_clients(self) -> None:
        """Abort the requests of API servers that stopped sending heartbeats (crashed or killed)."""
        now = time.monotonic()
        if now < self._next_check:
            return
        self._next_check = now + 1.0
        self.engine.runner.check()  # a dead tensor-parallel worker ends the core, idle or not
        if os.getppid() != self._parent:
            log.warning("the process that started the engine core is gone; exiting")
            self._stopping = True
        gone = {identity for identity, seen in self._last_seen.items() if now - seen > CLIENT_TIMEOUT_S}
        if not gone:
            return
        orphans = [rid for rid, owner in self._owner.items() if owner in gone]
        for request_id in orphans:
            if self.grammars.cancel(request_id) is None:
                self.engine.abort(request_id)
            del self._owner[request_id]
        for identity in gone:
            del self._last_seen[identity]
            self._metrics.pop(identity, None)
            self._received.pop(identity, None)
        log.warning("%d API server(s) went silent; aborted their %d request(s)", len(gone), len(orphans))

    def _broadcast(self, msg: m.FromCore) -> None:
        data = m.encode(msg)
        for identity in list(self._last_seen):
            try:
                self.socket.send_multipart([identity, data], zmq.NOBLOCK)
            except zmq.ZMQError:
                pass

