"""Hostile requests against `infer serve` on the CPU, each measured against its own baseline in one run:

1. echo + logprobs: a bystander stream's largest inter-chunk gap while a ~2,900-token uncached prompt is scored
   (`echo`, `logprobs: 1`, `max_tokens: 1`), beside its gap while the same kind of prompt runs without logprobs;
2. costly schemas: a 1-property json_schema request and a one-tool request, alone and while two fresh
   10,000-property schemas compile (each must not fail nor wait more than its own compile plus 1 s);
3. trickling connections: /health and a one-token completion, alone and with 20,000 connections open that send
   their headers and then one body byte every 20 s (from 4 client processes; the server's fd limit is the
   machine's `ulimit -n`).

    python benchmarks/hardening_cpu.py [--connections 20000]

Writes benchmarks/reports/hardening_cpu.{json,md} (or under OUT_DIR).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_harness import running_server  # noqa: E402  (the tests' in-process server harness)
from stream_gaps import StreamWatch  # noqa: E402

from infer.loader.gguf_file import bundled_smollm2  # noqa: E402
from infer.server.limits import ServerLimits  # noqa: E402

WORDS = "river stone light garden winter market silver window thunder paper orange valley engine forest".split()
TRICKLER = r"""
import socket, sys, time
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
socks = []
for _ in range(n):
    try:
        s = socket.create_connection((host, port), timeout=30)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100000\r\n\r\n{")
        socks.append(s)
    except OSError:
        pass
print(len(socks), flush=True)
while True:
    time.sleep(20)
    for s in socks:
        try:
            s.sendall(b" ")
        except OSError:
            pass
"""


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _timed(base: str, body: dict, route: str = "/v1/completions") -> tuple[int, float]:
    """(status, seconds) of one POST."""
    start = time.monotonic()
    r = httpx.post(f"{base}{route}", json=body, timeout=600)
    return r.status_code, time.monotonic() - start


def echo_logprobs(base: str, rng: random.Random) -> dict[str, float]:
    """The bystander's largest gap (ms) and its median, while each kind of prompt runs."""
    out: dict[str, float] = {}
    for name, extra in (("plain", {}), ("echo_logprobs", {"echo": True, "logprobs": 1})):
        prompt = f"{rng.random()} " + _prompt(rng, 2900)  # a fresh first token: nothing comes from the prefix cache
        with StreamWatch(base, 4000) as watch:  # within the 4096-token context
            code, seconds = _timed(base, {"prompt": prompt, "max_tokens": 1, **extra})
            end = time.monotonic()
            until = watch.wait_for_chunks_after(end, 5)
            largest, median, _ = watch.gaps_during(end - seconds, until)
        assert code == 200, code
        out[f"{name}_largest_gap_ms"], out[f"{name}_median_gap_ms"] = 1e3 * largest, 1e3 * median
        out[f"{name}_request_s"] = seconds
    out["ratio"] = out["echo_logprobs_largest_gap_ms"] / out["plain_largest_gap_ms"]
    return out


def _small_bodies(tag: str) -> tuple[dict, dict]:
    schema = {"type": "object", "properties": {f"k{tag}": {"type": "integer"}}, "required": [f"k{tag}"]}
    tool = {"type": "function", "function": {"name": f"f{tag}", "parameters": {
        "type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}
    return ({"prompt": "Give JSON:", "max_tokens": 8, "response_format": {
                "type": "json_schema", "json_schema": {"name": "s", "schema": schema}}},
            {"messages": [{"role": "user", "content": "Call it"}], "max_tokens": 8, "tools": [tool],
             "tool_choice": "required"})


def costly_schemas(base: str) -> dict[str, float]:
    """A small schema's and a one-tool request's time alone and behind two fresh 10k-property schemas."""
    out: dict[str, float] = {}
    schema_alone, tool_alone = _small_bodies("alone")
    out["schema_alone_s"] = _timed(base, schema_alone)[1]
    out["tool_alone_s"] = _timed(base, tool_alone, "/v1/chat/completions")[1]
    big = [{"prompt": "x", "max_tokens": 1, "response_format": {"type": "json_schema", "json_schema": {
        "name": "big", "schema": {"type": "object", "properties": {f"p{j}_{i}": {"type": "string"}
                                                                   for j in range(10000)}}}}} for i in range(2)]
    hogs = [threading.Thread(target=_timed, args=(base, b), daemon=True) for b in big]
    for hog in hogs:
        hog.start()
    time.sleep(1.0)  # both big compiles are running
    schema_body, tool_body = _small_bodies("loaded")
    code_s, out["schema_loaded_s"] = _timed(base, schema_body)
    code_t, out["tool_loaded_s"] = _timed(base, tool_body, "/v1/chat/completions")
    out["schema_status"], out["tool_status"] = code_s, code_t
    for hog in hogs:
        hog.join(timeout=300)
    return out


def trickling(base: str, connections: int) -> dict[str, float]:
    """/health and a completion alone, then with `connections` trickling connections open."""
    out: dict[str, float] = {}
    out["health_alone_s"] = _get(base)
    out["completion_alone_s"] = _timed(base, {"prompt": "Hi", "max_tokens": 1})[1]
    host, port = base.removeprefix("http://").split(":")
    per = connections // 4
    procs = [subprocess.Popen([sys.executable, "-c", TRICKLER, host, port, str(per)], stdout=subprocess.PIPE,
                              text=True) for _ in range(4)]
    try:
        opened = sum(int(p.stdout.readline()) for p in procs)  # type: ignore[union-attr]
        out["connections_opened"] = opened
        out["health_in_the_flood_s"] = _get(base)  # the server may still be accepting the last thousands
        time.sleep(5)  # then every connection is open and trickling
        out["health_loaded_s"] = max(_get(base) for _ in range(5))
        code, out["completion_loaded_s"] = _timed(base, {"prompt": "Hi", "max_tokens": 1})
        out["completion_status"] = code
    finally:
        for p in procs:
            p.kill()
    return out


def _get(base: str) -> float:
    start = time.monotonic()
    assert httpx.get(f"{base}/health", timeout=60).status_code == 200
    return time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=20000)
    parser.add_argument("--checks", default="echo,schemas,trickle", help="which checks to run (comma-separated)")
    args = parser.parse_args()
    checks = set(args.checks.split(","))
    rng = random.Random(7)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    results: dict[str, object] = {"cpus": os.cpu_count(), "fd_limit": soft}
    with running_server(bundled_smollm2(), max_seq_len=4096, limits=ServerLimits()) as server:
        if "echo" in checks:
            results["echo_logprobs"] = echo_logprobs(server.base_url, rng)
            print("echo+logprobs", results["echo_logprobs"], flush=True)
        if "schemas" in checks:
            results["costly_schemas"] = costly_schemas(server.base_url)
            print("costly schemas", results["costly_schemas"], flush=True)
        if "trickle" in checks:
            results["trickling"] = trickling(server.base_url, args.connections)
            print("trickling", results["trickling"], flush=True)
    out_dir = Path(os.environ.get("OUT_DIR", Path(__file__).with_name("reports")))
    report = out_dir / "hardening_cpu.json"
    if report.exists():  # a partial run keeps the other checks' last results
        results = {**json.loads(report.read_text()), **results}
    report.write_text(json.dumps(results, indent=2))
    e, c, t = results["echo_logprobs"], results["costly_schemas"], results["trickling"]  # type: ignore[assignment]
    lines = [
        "# Hostile requests against `infer serve` on the CPU, each beside its own baseline",
        "",
        f"`python benchmarks/hardening_cpu.py` on {os.cpu_count()} cores, bundled SmolLM2, max_seq_len 4096, "
        f"default server limits; fd limit {soft}.",
        "",
        "| check | baseline | under attack | criterion |",
        "|---|---:|---:|---|",
        f"| bystander's largest gap, ~2,900-token uncached prompt (plain vs echo+logprobs) | "
        f"{e['plain_largest_gap_ms']:.0f} ms | {e['echo_logprobs_largest_gap_ms']:.0f} ms ({e['ratio']:.2f}x) | <= 1.5x |",
        f"| 1-property json_schema request (alone vs behind two 10k-property schemas) | {c['schema_alone_s']:.2f} s | "
        f"{c['schema_loaded_s']:.2f} s (HTTP {c['schema_status']}) | 200, <= own + 1 s |",
        f"| one-tool request (same) | {c['tool_alone_s']:.2f} s | {c['tool_loaded_s']:.2f} s (HTTP {c['tool_status']}) "
        f"| 200, <= own + 1 s |",
        f"| /health ({t['connections_opened']:.0f} trickling connections; the first while the server still accepts "
        f"them, {t['health_in_the_flood_s']:.3f} s) | {t['health_alone_s']:.3f} s | {t['health_loaded_s']:.3f} s "
        f"(slowest of 5) | <= 1 s |",
        f"| one-token completion (same) | {t['completion_alone_s']:.3f} s | {t['completion_loaded_s']:.3f} s "
        f"(HTTP {t['completion_status']}) | <= 1 s |",
    ]
    (out_dir / "hardening_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
