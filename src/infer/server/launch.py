"""`infer serve`: start the engine-core process, then serve HTTP from this process or from N API server processes.

With one API server (the default on the CPU) this process is it. With `--api-server-count N` (on CUDA the default
is one per 4 host cores, at most 4: `api_servers_for`) it starts N API server processes (forked from a fork server
that imports their modules while the core loads) that each bind the port with SO_REUSEPORT (the kernel spreads
connections over them), all talking to the one core, and supervises: the core's exit ends everything with a
non-zero code (each API server answers 503 and exits with the reason first); an API server's exit leaves the others
serving. With `--data-parallel-size N`
there are N cores (build/dp_cores.py) and every API server connects to each of them (frontend/dp_client.py); any
core's exit ends everything as above.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import multiprocessing.connection
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn

from infer.frontend.served import ServedModel
from infer.heap import settle_heap
from infer.engine.config import EngineConfig
from infer.build.core_process import CoreProcess, CoreStartError
from infer.wire import CoreInfo
from infer.frontend.dp_client import client_for
from infer.frontend.load_board import LoadBoard
from infer.build.dp_cores import place_the_rest, start_cores
from infer.build.placement import available_cpus, pin
from infer.server.http_server import ABORT_GRACE_S, DrainingServer, uvicorn_config
from infer.server.console import ended, say
from infer.server.limits import ServerLimits, raise_open_file_limit
from infer.server.restarts import CoreRestarts

API_SERVER_RESTARTS = 5  # a minute, per API server: past it, one that keeps dying is left down
SHUTDOWN_GRACE_S = 0.5  # after the core is gone: the in-flight requests get their 503 before the server stops
BUNDLED_NAME = "SmolLM2-135M-Instruct"


def serve(config: EngineConfig, host: str, port: int, served_model_name: str | None, log_level: str,
          api_server_count: int | None = None, limits: ServerLimits | None = None) -> int:
    """Run `infer serve` until interrupted or until the core exits; the process's exit code."""
    limits = limits or ServerLimits()
    raise_open_file_limit()  # before any child starts: they inherit it
    _check_port(host, port)  # before the minutes of loading: a taken port fails at once
    say(f"loading {config.model or 'the bundled ' + BUNDLED_NAME} in the engine-core process ...")
    # the HTTP side's imports (~0.6 s a process) while the core loads; the count is the launcher's guess of the one
    # decided below from the core's config (a wrong guess costs that overlap only)
    if api_servers_for(config, api_server_count) == 1:
        threading.Thread(target=_import_app, name="infer-import-app").start()  # this process will serve
    else:
        _start_fork_server()  # the API servers will be forked from it
    try:
        cores = start_cores(config)
    except CoreStartError as exc:
        if exc.config_error:
            raise ValueError(str(exc)) from None  # the CLI prints it and exits 2
        say(f"error: {exc}")
        return 1
    infos = [core.info for core in cores]
    info = infos[0]
    if (cpus := place_the_rest(cores)) is not None:
        say(f"API servers on CPUs {cpus}; the engine cores on their own")
    api_server_count = api_servers_for(info.config, api_server_count)  # the core's config names its device
    name = served_model_name or (BUNDLED_NAME if config.model is None else Path(info.model_path).stem)
    engines = f"engine core pid {info.pid}" if len(infos) == 1 else \
        f"{len(infos)} data-parallel engine cores, pids {', '.join(str(i.pid) for i in infos)}, " \
        f"routed by {config.load_balance_method}"
    say(f"loaded {Path(info.model_path).name} in {info.load_seconds:.1f}s (of which warming up {info.warmup_seconds:.1f}s) "
         f"({engines}); serving {name!r} on http://{host}:{port} from {api_server_count} API "
         f"server process(es)")
    restarts = CoreRestarts(cores).start() if len(cores) > 1 else None  # DP: a dead core is started again
    try:
        if api_server_count == 1:
            return run_api_server(infos, name, host, port, log_level, limits=limits)
        return _supervise(cores, name, host, port, log_level, api_server_count, limits)
    finally:
        if restarts is not None:
            restarts.stop()
        for core in cores:
            core.stop()


MAX_DEFAULT_API_SERVERS = 4  # one API server process formats ~35k streamed tokens/s (docs/serving.md)


def api_servers_for(config: EngineConfig, requested: int | None) -> int:
    """`--api-server-count`, or its default: 1 on the CPU (its cores run the model), on CUDA one per 4 host cores.
    `config`: a built engine's (its device resolved)."""
    if requested is not None:
        return requested
    if not config.resolved_device.startswith("cuda"):
        return 1
    return max(1, min(MAX_DEFAULT_API_SERVERS, (os.cpu_count() or 1) // 4))


def served_model(info: CoreInfo) -> ServedModel:
    """The API server's view of the model: the core's resolved config and its tokenizer, no weights."""
    return ServedModel(info.config, info.model_config, info.tokenizer, Path(info.model_path))


def run_api_server(infos: list[CoreInfo], name: str, host: str, port: int, log_level: str, index: int = 0,
                   reuse_port: bool = False, limits: ServerLimits | None = None, spawned: float | None = None,
                   board: tuple[Any, int] | None = None) -> int:
    """One API server on the port, connected to every core, until it is stopped (0) or a core is gone (1, after
    answering 503s). `spawned`: when its process was started (time.time()), else now, for the start-up report.
    `board`: the cells of the load board the API servers share and their number (several cores and API servers;
    this one writes row `index`)."""
    spawned = spawned or time.time()
    from infer.server.app import create_app
    from infer.server.state import ServerState

    served = served_model(infos[0])
    server: uvicorn.Server | None = None

    def core_gone(reason: str) -> None:
        say(f"error: {reason}; answering 503 and stopping")
        asyncio.get_running_loop().call_later(SHUTDOWN_GRACE_S, lambda: setattr(server, "should_exit", True))

    shared = None if board is None else LoadBoard(board[0], board[1], len(infos), row=index)
    client = client_for(infos, served.tokenizer, core_gone, shared)
    limits = limits or ServerLimits()
    state = ServerState(served, client, name, index, limits=limits)
    server = DrainingServer(uvicorn_config(create_app(state), limits, log_level), limits, client)
    if threading.current_thread() is threading.main_thread():
        stop_on_sigterm(server)
    settle_heap()  # the tokenizer, the app: frozen out of the collector before serving
    say(f"start-up: API server {index} up in {time.time() - spawned:.2f}s (pid {os.getpid()}: imports, tokenizer, "
        f"app)")
    server.run(sockets=[_bind(host, port, reuse_port)])
    if client.gone_reason is not None:
        say(f"exiting: {client.gone_reason}")
        return 1
    return 0


def _import_app() -> None:
    """Import the HTTP app's modules (FastAPI, the protocol's models), which this process needs once it serves, while
    the main thread waits for the engine core; a failure here is met again, and reported, where they are used."""
    try:
        import infer.server.app  # noqa: F401
        import infer.server.state  # noqa: F401
    except Exception:  # noqa: BLE001
        pass


def stop_on_sigterm(server: uvicorn.Server) -> None:
    """SIGTERM outside the span where DrainingServer handles it sets `server.should_exit`. Before serving (a SIGTERM
    can reach an API server still starting once another one answers on the port) uvicorn then returns right after
    its start-up, where ignoring it left the process serving until its supervisor killed it ~40 s later. After
    serving, a late SIGTERM's default action would kill this process before the caller stops the engine core (an
    orphaned core keeps the GPU); setting the finished server's flag does nothing."""
    signal.signal(signal.SIGTERM, lambda *_: setattr(server, "should_exit", True))


API_SERVER_PRELOAD = ["infer.server.launch", "infer.server.app", "infer.server.state"]


def _api_server_context() -> multiprocessing.context.BaseContext:
    """Where API server processes come from: a fork server (multiprocessing's "forkserver") that imported their
    modules once, so each API server (and each restart) begins with its imports done, ~1.5-2 s of a GPU host's
    start-up otherwise paid after the core is ready. The fork server is a fresh interpreter, as "spawn" gives (this
    process never imports torch: nothing CUDA-bound is forked)."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(API_SERVER_PRELOAD)  # read when the fork server starts
    return ctx


def _start_fork_server() -> None:
    """Start the API servers' fork server now, to import their modules while the engine core loads (the first
    Process.start would start it otherwise)."""
    from multiprocessing import forkserver

    _api_server_context()
    forkserver.ensure_running()


def _api_server_main(infos: list[CoreInfo], name: str, host: str, port: int, log_level: str, index: int,
                     limits: ServerLimits, spawned: float, board: tuple[Any, int] | None,
                     cpus: list[int]) -> None:
    pin(frozenset(cpus))  # the launcher's CPUs now (the fork server's are those of before the cores were placed)
    sys.exit(run_api_server(infos, name, host, port, log_level, index, reuse_port=True, limits=limits,
                            spawned=spawned, board=board))


def _supervise(cores: list[CoreProcess], name: str, host: str, port: int, log_level: str, count: int,
               limits: ServerLimits) -> int:
    """Run `count` API server processes until stopped. An API server that exits while serving is started again (at
    most API_SERVER_RESTARTS times a minute each); with one engine core its exit ends the server, under data
    parallelism CoreRestarts starts it again."""
    ctx = _api_server_context()
    infos = [core.info for core in cores]
    cpus = available_cpus()  # after place_the_rest: the CPUs the cores left
    board = (LoadBoard.shared(count, len(cores)), count) if len(cores) > 1 else None  # routing over DP cores

    def spawn(i: int) -> multiprocessing.process.BaseProcess:
        p = ctx.Process(target=_api_server_main, args=(infos, name, host, port, log_level, i, limits, time.time(),
                                                       board, cpus), name=f"infer-api-{i}")
        p.start()
        return p

    servers = [spawn(i) for i in range(count)]
    restarted: dict[int, list[float]] = {i: [] for i in range(count)}
    stopping = False

    def stop(*_: object) -> None:
        """The first signal drains every API server (each within --shutdown-timeout-s); a second kills them now."""
        nonlocal stopping
        if stopping:
            for p in servers:
                if p.is_alive():
                    p.kill()
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    code = 0
    live = list(servers)
    sentinels = {core.process.sentinel: core for core in cores} if len(cores) == 1 else {}
    while live and not stopping:
        ready = multiprocessing.connection.wait([*sentinels, *(p.sentinel for p in live)], timeout=0.5)
        exited = next((sentinels[s] for s in ready if s in sentinels), None)
        if exited is not None:
            exited.process.join(1)  # its exit code is known once it is joined
            say(f"error: the engine core (pid {exited.info.pid}) {ended(exited.process.exitcode)}; "
                f"stopping the API servers")
            code = 1
            break
        for p in [p for p in live if p.sentinel in ready]:
            live.remove(p)
            p.join(1)
            if stopping:
                break
            i = servers.index(p)
            now = time.monotonic()
            restarted[i] = [t for t in restarted[i] if now - t < 60.0] + [now]
            if len(restarted[i]) > API_SERVER_RESTARTS:
                say(f"API server {p.name} {ended(p.exitcode)}; restarted too often, {len(live)} still serving")
                code = max(code, 1 if p.exitcode else 0)
                continue
            servers[i] = spawn(i)
            live.append(servers[i])
            say(f"API server {p.name} {ended(p.exitcode)}; started again (pid {servers[i].pid})")
    for p in live:  # stopped, or the core is gone (they exit by themselves then, with their 503s answered)
        if stopping:
            p.terminate()
    for p in live:
        p.join(limits.shutdown_timeout_s + ABORT_GRACE_S + 5)
        if p.is_alive():
            p.kill()
            p.join()
    return code


def _bind(host: str, port: int, reuse_port: bool) -> socket.socket:
    # proto named: asyncio turns Nagle's algorithm off (TCP_NODELAY) only on connections of a socket whose proto is
    # IPPROTO_TCP; with 0, a response's body waited ~40 ms for the client's delayed ACK of its headers
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _check_port(host: str, port: int) -> None:
    """ValueError naming the flag when the port cannot be bound (bound without listening: it takes no connection).
    Tried without SO_REUSEPORT even when several API servers will share the port: with it, binding would succeed
    beside another server's listeners and split their connections."""
    try:
        _bind(host, port, reuse_port=False).close()
    except OSError as exc:
        raise ValueError(f"--port={port}: cannot listen on {host}:{port}: {exc.strerror}") from None
