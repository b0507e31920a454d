"""A load-generating client for serving benchmarks: streams completions and records when each SSE chunk arrives.

    python benchmarks/sse_client.py URL BODIES.json RESULT.json [fresh]

Imports only httpx (start-up stays out of the measured time). BODIES.json lists the streams: each a request body, or
a list of bodies the stream sends one after another (a closed loop: a user who sends the next request when the last
one ended). Prints "ready" once it holds one open connection per stream (with `fresh`: one warm connection only, each
stream opening its own when released, as a burst of new clients does), waits for a line on stdin (the parent
releases every client at once), starts every stream at once, reads every chunk of every stream, and writes
{"streams": [{"tokens", "usage", "chunk_times", "sent", "done"}, ...], "cpu_s"} to RESULT.json: one record per
request, in the order of the bodies (times from time.time(): when the request went out, each text chunk arrived, the
stream ended), and cpu_s, the process's CPU seconds from its release to its last stream's end.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

import httpx


async def stream_completion(http: httpx.AsyncClient, url: str, body: dict) -> dict:
    """One streamed completion: its usage, generated tokens (from usage) and the arrival time of each text chunk."""
    times: list[float] = []
    usage: dict[str, int] = {}
    sent = time.time()
    async with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.time())
    return {"tokens": usage.get("completion_tokens", 0), "usage": usage, "chunk_times": times, "sent": sent,
            "done": time.time()}


async def _closed_loop(http: httpx.AsyncClient, url: str, bodies: list[dict]) -> list[dict]:
    """One stream's requests, each sent when the one before it ended."""
    return [await stream_completion(http, url, body) for body in bodies]


async def _main(url: str, bodies: list[dict | list[dict]], fresh: bool) -> tuple[list[dict], float]:
    limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        # one warm keep-alive connection per stream, as a long-running client has: a fresh client's first request
        # pays its connection and lazy set-up (~70-200 ms), which is not the server's time to first token; `fresh`
        # warms the client with one connection and leaves the others to be opened in the burst
        health = url.split("/v1/")[0] + "/health"
        started = time.time()
        await asyncio.gather(*(http.get(health) for _ in bodies[: 1 if fresh else len(bodies)]))
        connected = time.time()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        released = cpu_seconds()
        try:
            streams = await asyncio.gather(*(_closed_loop(http, url, b if isinstance(b, list) else [b])
                                             for b in bodies))
        except httpx.HTTPError:  # which phase was slow: connecting, or waiting idle for the release
            print(f"connections opened in {connected - started:.2f} s, released {time.time() - connected:.2f} s "
                  "after (the server closes idle keep-alive connections after --keep-alive-timeout-s)",
                  file=sys.stderr)
            raise
        return [request for stream in streams for request in stream], cpu_seconds() - released


def cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


if __name__ == "__main__":
    url, bodies_path, result_path = sys.argv[1:4]
    with open(bodies_path) as f:
        bodies = json.load(f)
    streams, cpu_s = asyncio.run(_main(url, bodies, sys.argv[4:5] == ["fresh"]))
    with open(result_path, "w") as f:
        json.dump({"streams": streams, "cpu_s": cpu_s}, f)
