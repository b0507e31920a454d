"""CPU time one API server spends per streamed token: the ceiling it puts on `infer serve`'s throughput.

    python benchmarks/api_server_cost.py [--streams 128] [--tokens 256] [--runs 3] [--profile] [--baseline]

The API server (uvicorn, the app `infer serve` runs) serves in this process's main thread, an engine core serves a
tiny random Llama (tests/checkpoints.py; its forward is cheap, so the core keeps the API server busy) in its own
process, and two sse_client.py processes stream completions and read every chunk. CPU per token is this process's
CPU time over a run (the driver thread that releases the clients does nothing meanwhile) over the tokens the
clients counted; 1e6 / that is the most streamed tokens per second one API server could format on this CPU.
`--profile` adds a cProfile of the server over every run; `--baseline` serves on uvicorn's pure-Python stack
(asyncio's event loop, the h11 parser) instead of the server's own (uvloop, httptools), for comparison. The first
run warms up and is not counted.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from checkpoints import save_tiny_with_tokenizer  # noqa: E402
from server_harness import free_port, wait_healthy  # noqa: E402

CLIENTS = 2


def drive(base: str, streams: int, tokens: int, runs: int, out: list[tuple[int, float]], stop: object) -> None:
    """Release the clients `runs` + 1 times; append (tokens, this process's CPU seconds) per counted run."""
    wait_healthy(base, timeout=120)
    bodies = [{"model": "m", "prompt": [5 + i % 200, 7, 9], "max_tokens": tokens, "ignore_eos": True,
               "temperature": 0, "stream": True, "stream_options": {"include_usage": True}} for i in range(streams)]
    work = Path(tempfile.mkdtemp(prefix="api-cost-"))
    client = str(Path(__file__).with_name("sse_client.py"))
    for run in range(runs + 1):
        procs = []
        for i in range(CLIENTS):
            (work / f"bodies{i}.json").write_text(json.dumps(bodies[i::CLIENTS]))
            procs.append(subprocess.Popen([sys.executable, client, f"{base}/v1/completions", str(work / f"bodies{i}.json"),
                                           str(work / f"result{i}.json")], stdin=subprocess.PIPE,
                                          stdout=subprocess.PIPE, text=True))
        for proc in procs:
            proc.stdout.readline()  # "ready"
        cpu = time.process_time()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        if any(proc.wait() for proc in procs):
            print("a client failed; its error is above", file=sys.stderr)
            break
        cpu = time.process_time() - cpu
        got = sum(s["tokens"] for i in range(CLIENTS)
                  for s in json.loads((work / f"result{i}.json").read_text())["streams"])
        if run:
            out.append((got, cpu))
    stop.should_exit = True  # type: ignore[attr-defined]


def main() -> None:
    import uvicorn

    from infer.build.dp_cores import start_cores
    from infer.engine.config import EngineConfig
    from infer.frontend.dp_client import client_for
    from infer.server.app import create_app
    from infer.server.http_server import uvicorn_config
    from infer.server.launch import served_model
    from infer.server.limits import ServerLimits
    from infer.server.state import ServerState

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--streams", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--baseline", action="store_true", help="uvicorn's asyncio loop and h11 parser")
    args = parser.parse_args()
    path = save_tiny_with_tokenizer("llama", Path(tempfile.mkdtemp(prefix="api-cost-")) / "tiny")
    cores = start_cores(EngineConfig(model=str(path), device="cpu", dtype="float32", max_batch_size=args.streams,
                                     max_waiting_requests=args.streams, max_seq_len=args.tokens + 64), timeout_s=600)
    try:
        served = served_model(cores[0].info)
        limits = ServerLimits(keep_alive_timeout_s=120)  # the clients hold their opened connections idle until released
        state = ServerState(served, client_for([c.info for c in cores], served.tokenizer), "m", limits=limits)
        port = free_port()
        config = uvicorn_config(create_app(state), limits, "warning", host="127.0.0.1", port=port)
        if args.baseline:
            config.loop, config.http = "asyncio", "h11"
        server = uvicorn.Server(config)
        runs: list[tuple[int, float]] = []
        threading.Thread(target=drive, args=(f"http://127.0.0.1:{port}", args.streams, args.tokens, args.runs, runs,
                                             server), daemon=True).start()
        profile = cProfile.Profile() if args.profile else None
        profile.runcall(server.run) if profile else server.run()
    finally:
        for core in cores:
            core.stop()
    if not runs:
        raise SystemExit("no run completed")
    per_token = [1e6 * cpu / tokens for tokens, cpu in runs]
    stack = "asyncio + h11" if args.baseline else "uvloop + httptools"
    print(f"{args.streams} streams x {args.tokens} tokens, {CLIENTS} client processes, {stack}: API server CPU "
          f"{statistics.median(per_token):.1f} us/token (runs {', '.join(f'{v:.1f}' for v in per_token)}), "
          f"at most {1e6 / statistics.median(per_token):,.0f} streamed tokens/s on one core of this CPU")
    if profile:
        text = io.StringIO()
        pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(30)
        print(text.getvalue())


if __name__ == "__main__":
    main()
