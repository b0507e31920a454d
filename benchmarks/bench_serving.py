"""Serving benchmark: latency and throughput of an OpenAI-compatible server under load.

Measures, per request, from the client side over streamed responses (SSE):
  TTFT     time from sending the request to the first chunk that carries generated text
  ITL      time between successive chunks that carry generated tokens (per chunk, as vLLM's
           bench does; the report also gives mean tokens per chunk so batched chunks are visible)
  latency  time from sending the request to the end of the stream ([DONE])
  queue    server-side queue wait, only when the server reports it: a per-request
           `queue_time` (seconds) in a chunk, in `usage`, or in an `x-queue-time` header; else the
           mean from the server's `/metrics` (`<prefix>:request_queue_time_seconds` sum/count delta)
and per run: output tokens/s and requests/s over the run's wall time, P50/P95/P99 of the above.
Token counts come from the server's `usage` (stream_options.include_usage); prompt lengths
are the server's `usage.prompt_tokens`.

Workloads (built from a fixed seed, so every configuration gets the same requests):
  W1 single         1 completion, prompt 256 tokens, 256 generated
  W2 mixed          N completions (default 16), prompts uniform 32..1024, outputs uniform 64..256,
                    `ignore_eos: true` so output lengths are exact
  W3 shared prefix  N chat requests sharing one long system prompt (~1024 tokens), each with its own
                    short user message, 128 generated, `ignore_eos: true`
Modes: `burst` (all requests sent at once, optionally capped by --concurrency) and `sequential`
(one after another: the sequential serving baseline).

Two ways to run:
  --base-url URL   against a running server (ours, vLLM, SGLang, ...): runs W1 sequential,
                   W2 sequential and burst, W3 burst.
  --launch         starts `.venv/bin/infer serve` once per configuration of a sweep, waits for
                   GET /health == 200, runs its workloads, stops it:
                     continuous/fcfs: W1 seq, W2 seq, W2 burst, W3 burst
                     static/fcfs:     W2 burst
                     continuous/prefill_first, continuous/decode_round_robin: W2 burst, W3 burst
                     no-chunked-prefill/fcfs: W1 seq, W2 burst; prefix-caching/fcfs: W3 burst
                   giving sequential vs concurrent, static vs continuous, and policy comparisons.
Results: JSON + Markdown table in benchmarks/reports/serving.{json,md} (hardware, versions, each
server config, medians over --repeats, and ratios continuous/static W2 P99 latency & TTFT and
concurrent/sequential W2 throughput).

Quick check (~1 minute on a small CPU):
    .venv/bin/python benchmarks/bench_serving.py --launch --workloads W2 --num-requests 4 --max-output 16
Full sweep:
    .venv/bin/python benchmarks/bench_serving.py --launch
Against vLLM:
    .venv/bin/python benchmarks/bench_serving.py --base-url http://localhost:8000 --label vllm

Only the standard library and httpx.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib.metadata
import json
import math
import os
import platform
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
REPORTS = ROOT / "benchmarks" / "reports"
WORKLOADS = ("W1", "W2", "W3")
POLICIES = ("fcfs", "prefill_first", "decode_round_robin")

# Common English words; with a leading space almost every one is a single BPE token.
WORDS = (
    "the of and to in is was for on that with as by at from his her they this had not are but "
    "which be or have one all were there been their has more when would who will no if out so "
    "said what up its about than into them can only other time new some could these two may first "
    "then do any like my now over such our man me even most made after also did many before must "
    "through back years where much your way well down should because each just those people how "
    "too little state good very make world still own see men work long get here between both life "
    "being under never day same another know while last might us great old year off come since "
    "against go came right used take three house water small found part place river city light "
    "green paper music table window garden winter summer morning evening story number letter"
).split()


# ----------------------------------------------------------------------------- data classes

@dataclass
class RequestSpec:
    """One request of a workload: a completion (prompt) or a chat (messages)."""
    kind: str                          # "completion" | "chat"
    max_tokens: int
    target_prompt_tokens: int
    prompt: str | list[int] | None = None
    messages: list[dict[str, str]] | None = None


@dataclass
class RequestResult:
    ok: bool
    error: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    expected_output_tokens: int = 0
    token_chunks: int = 0
    ttft_s: float = math.nan
    latency_s: float = math.nan
    itls_s: list[float] = field(default_factory=list)
    queue_s: float | None = None
    start_s: float = 0.0               # relative to the run start
    end_s: float = 0.0


@dataclass
class Stats:
    p50: float = math.nan
    p95: float = math.nan
    p99: float = math.nan
    mean: float = math.nan


@dataclass
class RunSummary:
    """One (server config, workload, mode) cell: medians over repeats of each per-run statistic."""
    config: str
    workload: str
    mode: str
    repeats: int
    num_requests: int
    num_ok: int
    num_errors: int
    length_mismatches: int
    mean_prompt_tokens: float
    total_output_tokens: int
    mean_tokens_per_chunk: float
    wall_s: float
    output_tok_per_s: float
    req_per_s: float
    ttft_ms: Stats
    itl_ms: Stats
    tpot_ms: Stats
    latency_s: Stats
    queue_ms: Stats | None
    queue_source: str
    errors: list[str] = field(default_factory=list)
    requests: list[dict[str, Any]] = field(default_factory=list)   # per request, of the last repeat


@dataclass
class ServerConfig:
    name: str
    batching_mode: str | None = None
    scheduler_policy: str | None = None
    runs: list[tuple[str, str]] = field(default_factory=list)   # (workload, mode)
    argv: list[str] = field(default_factory=list)


# ----------------------------------------------------------------------------- statistics

def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method); NaN for an empty list."""
    if not values:
        return math.nan
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def stats_of(values: list[float], scale: float = 1.0) -> Stats:
    vals = [v * scale for v in values if v is not None and not math.isnan(v)]
    if not vals:
        return Stats()
    return Stats(percentile(vals, 50), percentile(vals, 95), percentile(vals, 99), statistics.fmean(vals))


def median_stats(items: list[Stats]) -> Stats:
    def med(xs: list[float]) -> float:
        xs = [x for x in xs if not math.isnan(x)]
        return statistics.median(xs) if xs else math.nan
    return Stats(*(med([getattr(s, f.name) for s in items]) for f in dataclasses.fields(Stats)))


def summarize_run(config: str, workload: str, mode: str, results: list[RequestResult],
                  wall_s: float, metrics_queue_ms: float | None) -> RunSummary:
    ok = [r for r in results if r.ok]
    itls = [x for r in ok for x in r.itls_s]
    tpots = [(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    per_request_queue = [r.queue_s for r in ok if r.queue_s is not None]
    if per_request_queue:
        queue, source = stats_of(per_request_queue, 1e3), "response"
    elif metrics_queue_ms is not None:
        queue, source = Stats(mean=metrics_queue_ms), "metrics-mean"
    else:
        queue, source = None, "none"
    out_tokens = sum(r.output_tokens for r in ok)
    chunks = sum(r.token_chunks for r in ok)
    return RunSummary(
        config=config, workload=workload, mode=mode, repeats=1,
        num_requests=len(results), num_ok=len(ok), num_errors=len(results) - len(ok),
        length_mismatches=sum(1 for r in ok if r.expected_output_tokens and r.output_tokens != r.expected_output_tokens),
        mean_prompt_tokens=statistics.fmean([r.prompt_tokens for r in ok]) if ok else math.nan,
        total_output_tokens=out_tokens,
        mean_tokens_per_chunk=out_tokens / chunks if chunks else math.nan,
        wall_s=wall_s,
        output_tok_per_s=out_tokens / wall_s if wall_s > 0 else math.nan,
        req_per_s=len(ok) / wall_s if wall_s > 0 else math.nan,
        ttft_ms=stats_of([r.ttft_s for r in ok], 1e3),
        itl_ms=stats_of(itls, 1e3),
        tpot_ms=stats_of(tpots, 1e3),
        latency_s=stats_of([r.latency_s for r in ok]),
        queue_ms=queue, queue_source=source,
        errors=sorted({r.error for r in results if not r.ok})[:5],
        requests=[request_record(r) for r in results],
    )


def request_record(r: RequestResult) -> dict[str, Any]:
    """Compact per-request line for the JSON report (times in s, relative to the run start)."""
    return {"ok": r.ok, "prompt_tokens": r.prompt_tokens, "output_tokens": r.output_tokens,
            "expected_output_tokens": r.expected_output_tokens, "start": round(r.start_s, 4),
            "ttft": round(r.ttft_s, 4), "latency": round(r.latency_s, 4), "end": round(r.end_s, 4),
            "max_itl": round(max(r.itls_s), 4) if r.itls_s else None, "chunks": r.token_chunks,
            "queue": r.queue_s, "error": r.error or None}


def merge_repeats(runs: list[RunSummary]) -> RunSummary:
    """Median of every scalar and every Stats field over repeated runs of one cell."""
    if len(runs) == 1:
        return runs[0]
    first = runs[0]
    merged: dict[str, Any] = {}
    for f in dataclasses.fields(RunSummary):
        vals = [getattr(r, f.name) for r in runs]
        if f.name in ("config", "workload", "mode", "queue_source"):
            merged[f.name] = getattr(first, f.name)
        elif f.name == "requests":
            merged[f.name] = vals[-1]
        elif f.name == "errors":
            merged[f.name] = sorted({e for v in vals for e in v})[:5]
        elif f.name == "repeats":
            merged[f.name] = len(runs)
        elif f.name == "queue_ms":
            present = [v for v in vals if v is not None]
            merged[f.name] = median_stats(present) if present else None
        elif isinstance(vals[0], Stats):
            merged[f.name] = median_stats(vals)
        else:
            clean = [v for v in vals if not (isinstance(v, float) and math.isnan(v))]
            med = statistics.median(clean) if clean else math.nan
            merged[f.name] = int(round(med)) if all(isinstance(v, int) for v in vals) else med
    return RunSummary(**merged)


# ----------------------------------------------------------------------------- workloads

class PromptBuilder:
    """Deterministic prompts of a target token length: word text (calibrated with the server's
    /tokenize when it has one) or random token ids."""

    def __init__(self, client: httpx.AsyncClient, kind: str, id_range: tuple[int, int], calibrate: bool):
        self.client, self.kind, self.id_range, self.calibrate = client, kind, id_range, calibrate
        self.tokenize_ok: bool | None = None

    async def count_tokens(self, text: str) -> int | None:
        if not self.calibrate or self.tokenize_ok is False:
            return None
        try:
            r = await self.client.post("/tokenize", json={"prompt": text, "add_special_tokens": False})
            tokens = r.json().get("tokens") if r.status_code == 200 else None
        except (httpx.HTTPError, ValueError):
            tokens = None
        self.tokenize_ok = isinstance(tokens, list)
        return len(tokens) if isinstance(tokens, list) else None

    async def text(self, rng: random.Random, n_tokens: int) -> str:
        # The pool is drawn up front, so the RNG stream does not depend on the calibration.
        pool = [rng.choice(WORDS) for _ in range(2 * n_tokens + 8)]
        n = n_tokens
        for _ in range(4):
            counted = await self.count_tokens(" ".join(pool[:n]))
            if counted is None or counted == n_tokens:
                break
            n = max(1, min(len(pool), n + (n_tokens - counted)))
        return " ".join(pool[:n])

    async def prompt(self, rng: random.Random, n_tokens: int) -> str | list[int]:
        if self.kind == "ids":
            lo, hi = self.id_range
            return [rng.randrange(lo, hi) for _ in range(n_tokens)]
        return await self.text(rng, n_tokens)


async def build_workloads(builder: PromptBuilder, names: list[str], args: argparse.Namespace) -> dict[str, list[RequestSpec]]:
    """Same seed → same requests for every configuration."""
    cap_out = args.max_output
    cap_in = args.max_prompt
    out: dict[str, list[RequestSpec]] = {}
    if "W1" in names:
        rng = random.Random(args.seed * 1000 + 1)
        n_in, n_out = min(256, cap_in), min(256, cap_out)
        out["W1"] = [RequestSpec("completion", n_out, n_in, prompt=await builder.prompt(rng, n_in))]
    if "W2" in names:
        rng = random.Random(args.seed * 1000 + 2)
        specs = []
        for _ in range(args.num_requests):
            n_in = rng.randint(min(32, cap_in), min(1024, cap_in))
            n_out = rng.randint(min(64, cap_out), min(256, cap_out))
            specs.append(RequestSpec("completion", n_out, n_in, prompt=await builder.prompt(rng, n_in)))
        out["W2"] = specs
    if "W3" in names:
        rng = random.Random(args.seed * 1000 + 3)
        n_sys = min(1024, cap_in)
        system = await builder.text(rng, n_sys)
        specs = []
        for i in range(args.num_requests):
            user = f"Question {i}: " + await builder.text(rng, 32) + "?"
            specs.append(RequestSpec("chat", min(128, cap_out), n_sys + 40, messages=[
                {"role": "system", "content": system}, {"role": "user", "content": user}]))
        out["W3"] = specs
    return out


def request_body(spec: RequestSpec, model: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    body: dict[str, Any] = {
        "model": model, "max_tokens": spec.max_tokens, "temperature": args.temperature,
        "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True, "seed": args.seed,
    }
    if spec.kind == "chat":
        return "/v1/chat/completions", body | {"messages": spec.messages}
    return "/v1/completions", body | {"prompt": spec.prompt}


# ----------------------------------------------------------------------------- one request

def chunk_carries_token(choice: dict[str, Any], chat: bool) -> bool:
    """A streamed choice carries generated tokens if it has text; an empty-text chunk counts too
    (a token whose text the detokenizer holds back) unless it is the role-only chat opener or a
    pure finish chunk."""
    if chat:
        delta = choice.get("delta") or {}
        content = delta.get("content")
        if content:
            return True
        if "role" in delta or content is None:
            return False
        return choice.get("finish_reason") is None
    text = choice.get("text")
    if text:
        return True
    return text == "" and choice.get("finish_reason") is None


def queue_time_of(obj: dict[str, Any]) -> float | None:
    for holder in (obj, obj.get("usage") or {}, obj.get("metrics") or {}):
        for key in ("queue_time", "queue_time_s", "queue_wait_s"):
            v = holder.get(key) if isinstance(holder, dict) else None
            if isinstance(v, (int, float)):
                return float(v)
    return None


async def send_one(client: httpx.AsyncClient, spec: RequestSpec, model: str,
                   args: argparse.Namespace, t_run: float) -> RequestResult:
    path, body = request_body(spec, model, args)
    chat = spec.kind == "chat"
    res = RequestResult(ok=False, expected_output_tokens=spec.max_tokens)
    t0 = time.perf_counter()
    res.start_s = t0 - t_run
    last: float | None = None
    usage: dict[str, Any] | None = None
    try:
        async with client.stream("POST", path, json=body) as resp:
            if resp.status_code != 200:
                text = (await resp.aread()).decode(errors="replace")
                res.error = f"HTTP {resp.status_code}: {text[:200]}"
                return res
            header_q = resp.headers.get("x-queue-time")
            if header_q:
                try:
                    res.queue_s = float(header_q)
                except ValueError:
                    pass
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                obj = json.loads(data)
                if "error" in obj:
                    res.error = f"stream error: {json.dumps(obj['error'])[:200]}"
                    return res
                if (q := queue_time_of(obj)) is not None:
                    res.queue_s = q
                if obj.get("usage"):
                    usage = obj["usage"]
                if any(chunk_carries_token(c, chat) for c in obj.get("choices") or []):
                    res.token_chunks += 1
                    if last is None:
                        res.ttft_s = now - t0
                    else:
                        res.itls_s.append(now - last)
                    last = now
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        res.error = f"{type(e).__name__}: {e}"[:200]
        return res
    end = time.perf_counter()
    res.latency_s, res.end_s = end - t0, end - t_run
    if usage is None:
        res.error = "no usage chunk (stream_options.include_usage ignored?)"
        res.output_tokens = res.token_chunks
        return res
    res.prompt_tokens = int(usage.get("prompt_tokens", 0))
    res.output_tokens = int(usage.get("completion_tokens", 0))
    res.ok = res.token_chunks > 0 or res.output_tokens == 0
    if not res.ok:
        res.error = "no token-carrying chunk"
    return res


# ----------------------------------------------------------------------------- one run

def parse_prometheus(text: str) -> dict[str, float]:
    """name{labels} value → summed by bare name (labels dropped)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_:][A-Za-z0-9_:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            try:
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
            except ValueError:
                pass
    return out


async def scrape_metrics(client: httpx.AsyncClient) -> dict[str, float] | None:
    try:
        r = await client.get("/metrics")
        return parse_prometheus(r.text) if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def metrics_queue_mean_ms(before: dict[str, float] | None, after: dict[str, float] | None) -> float | None:
    if not before or not after:
        return None
    for name in after:
        if name.endswith(":request_queue_time_seconds_sum"):
            count = name[: -len("_sum")] + "_count"
            dn = after.get(count, 0.0) - before.get(count, 0.0)
            if dn > 0:
                return (after[name] - before.get(name, 0.0)) / dn * 1e3
    return None


async def run_workload(client: httpx.AsyncClient, specs: list[RequestSpec], mode: str, model: str,
                       args: argparse.Namespace) -> tuple[list[RequestResult], float, float | None]:
    before = await scrape_metrics(client)
    t_run = time.perf_counter()
    if mode == "sequential":
        results = [await send_one(client, s, model, args, t_run) for s in specs]
    else:
        sem = asyncio.Semaphore(args.concurrency or len(specs))

        async def limited(s: RequestSpec) -> RequestResult:
            async with sem:
                return await send_one(client, s, model, args, t_run)
        results = list(await asyncio.gather(*(limited(s) for s in specs)))
    wall = time.perf_counter() - t_run
    after = await scrape_metrics(client)
    return results, wall, metrics_queue_mean_ms(before, after)


async def discover_model(client: httpx.AsyncClient, override: str | None) -> str:
    if override:
        return override
    try:
        r = await client.get("/v1/models")
        data = r.json().get("data") or []
        if data:
            return str(data[0]["id"])
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        pass
    return "default"


async def warm_up(client: httpx.AsyncClient, model: str, args: argparse.Namespace) -> None:
    spec = RequestSpec("completion", 4, 16, prompt=" ".join(WORDS[:16]))
    res = await send_one(client, spec, model, args, time.perf_counter())
    if not res.ok:
        print(f"  warm-up failed: {res.error}", file=sys.stderr)


async def bench_server(base_url: str, cfg: ServerConfig, args: argparse.Namespace,
                       workloads: dict[str, list[RequestSpec]] | None) -> tuple[list[RunSummary], dict[str, list[RequestSpec]], str]:
    limits = httpx.Limits(max_connections=max(64, args.num_requests * 2), max_keepalive_connections=64)
    timeout = httpx.Timeout(args.request_timeout, connect=30.0)
    async with httpx.AsyncClient(base_url=base_url, timeout=timeout, limits=limits) as client:
        model = await discover_model(client, args.model)
        if workloads is None:
            builder = PromptBuilder(client, args.prompt_kind, args.token_id_range, not args.no_calibrate)
            workloads = await build_workloads(builder, sorted({w for w, _ in cfg.runs}), args)
        if not args.no_warmup:
            await warm_up(client, model, args)
        summaries = []
        for workload, mode in cfg.runs:
            if workload not in workloads:
                continue
            reps = []
            for rep in range(args.repeats):
                results, wall, q_ms = await run_workload(client, workloads[workload], mode, model, args)
                s = summarize_run(cfg.name, workload, mode, results, wall, q_ms)
                reps.append(s)
                print(f"  {cfg.name:32s} {workload} {mode:10s} rep {rep + 1}: ok {s.num_ok}/{s.num_requests}  "
                      f"TTFT p50 {s.ttft_ms.p50:8.1f} ms  ITL p50 {s.itl_ms.p50:7.1f} ms  "
                      f"lat p99 {s.latency_s.p99:7.2f} s  {s.output_tok_per_s:7.1f} tok/s"
                      + (f"  errors: {s.errors}" if s.errors else ""), flush=True)
            summaries.append(merge_repeats(reps))
        return summaries, workloads, model


# ----------------------------------------------------------------------------- server launch

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_server(cfg: ServerConfig, port: int, args: argparse.Namespace, log_path: Path) -> subprocess.Popen:
    cmd = [str(args.infer_bin), "serve", "--port", str(port), "--log-level", "warning", *cfg.argv,
           "--max-seq-len", str(args.max_seq_len), "--max-batch-size", str(args.max_batch_size),
           *args.server_arg]
    print(f"[bench] starting: {' '.join(cmd)}  (log: {log_path})", flush=True)
    log = open(log_path, "w")
    return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT)


def wait_healthy(proc: subprocess.Popen, base_url: str, timeout_s: float, log_path: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with code {proc.returncode}:\n{tail(log_path)}")
        try:
            if httpx.get(base_url + "/health", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"server not healthy after {timeout_s:.0f}s:\n{tail(log_path)}")


def stop_server(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def sweep_configs(args: argparse.Namespace) -> list[ServerConfig]:
    def cfg(mode: str, policy: str, runs: list[tuple[str, str]], name: str = "", extra: tuple[str, ...] = ()) -> ServerConfig:
        return ServerConfig(name or f"{mode}/{policy}", mode, policy, runs,
                            ["--batching-mode", mode, "--scheduler-policy", policy, *extra])
    configs = [
        cfg("continuous", "fcfs", [("W1", "sequential"), ("W2", "sequential"), ("W2", "burst"), ("W3", "burst")]),
        cfg("static", "fcfs", [("W2", "burst")]),
        *(cfg("continuous", p, [("W2", "burst"), ("W3", "burst")]) for p in POLICIES if p != "fcfs"),
        # the engine's options against its defaults (continuous/fcfs): whole-prompt prefill, prefix caching on
        cfg("continuous", "fcfs", [("W1", "sequential"), ("W2", "burst")], "no-chunked-prefill/fcfs",
            ("--no-chunked-prefill",)),
        cfg("continuous", "fcfs", [("W3", "burst")], "prefix-caching/fcfs", ("--prefix-caching",)),
    ]
    if args.configs:
        wanted = set(args.configs.split(","))
        configs = [c for c in configs if c.name in wanted]
    for c in configs:
        c.runs = [(w, m) for w, m in c.runs if w in args.workloads and (not args.runs or (w, m) in args.runs)]
    return [c for c in configs if c.runs]


# ----------------------------------------------------------------------------- report

def hardware_info() -> dict[str, Any]:
    cpu = platform.processor() or ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {"cpu": cpu, "cpu_cores": os.cpu_count(), "machine": platform.machine(),
                            "os": platform.platform()}
    try:
        info["mem_gib"] = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (ValueError, OSError, AttributeError):
        pass
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=10).stdout.strip()
            info["gpus"] = out.splitlines()
        except (OSError, subprocess.SubprocessError):
            pass
    return info


def software_info() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("infer", "torch", "httpx", "fastapi", "uvicorn", "vllm", "sglang"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def find(summaries: list[RunSummary], config_prefix: str, workload: str, mode: str) -> RunSummary | None:
    for s in summaries:
        if s.config.startswith(config_prefix) and s.workload == workload and s.mode == mode and s.num_ok:
            return s
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or math.isnan(a) or math.isnan(b) or b == 0:
        return None
    return a / b


def compute_ratios(summaries: list[RunSummary], launched: bool) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    cont = "continuous/fcfs" if launched else ""
    c2 = find(summaries, "continuous/fcfs", "W2", "burst")
    s2 = find(summaries, "static/fcfs", "W2", "burst")
    if c2 and s2:
        out["continuous/static W2 burst P99 latency"] = ratio(c2.latency_s.p99, s2.latency_s.p99)
        out["continuous/static W2 burst P99 TTFT"] = ratio(c2.ttft_ms.p99, s2.ttft_ms.p99)
        out["continuous/static W2 burst output tok/s"] = ratio(c2.output_tok_per_s, s2.output_tok_per_s)
    burst, seq = find(summaries, cont, "W2", "burst"), find(summaries, cont, "W2", "sequential")
    if burst and seq:
        out["concurrent/sequential W2 output tok/s"] = ratio(burst.output_tok_per_s, seq.output_tok_per_s)
        out["concurrent/sequential W2 req/s"] = ratio(burst.req_per_s, seq.req_per_s)
    for policy in POLICIES[1:]:
        for w in ("W2", "W3"):
            p, f = find(summaries, f"continuous/{policy}", w, "burst"), find(summaries, "continuous/fcfs", w, "burst")
            if p and f:
                out[f"{policy}/fcfs {w} P99 TTFT"] = ratio(p.ttft_ms.p99, f.ttft_ms.p99)
                out[f"{policy}/fcfs {w} P99 latency"] = ratio(p.latency_s.p99, f.latency_s.p99)
    u2, u1 = find(summaries, "no-chunked-prefill/fcfs", "W2", "burst"), find(summaries, "no-chunked-prefill/fcfs", "W1", "sequential")
    if c2 and u2:
        out["chunked/whole-prompt prefill W2 burst P99 ITL"] = ratio(c2.itl_ms.p99, u2.itl_ms.p99)
        out["chunked/whole-prompt prefill W2 burst output tok/s"] = ratio(c2.output_tok_per_s, u2.output_tok_per_s)
    c1 = find(summaries, "continuous/fcfs", "W1", "sequential")
    if c1 and u1:
        out["chunked/whole-prompt prefill W1 output tok/s"] = ratio(c1.output_tok_per_s, u1.output_tok_per_s)
    p3, f3 = find(summaries, "prefix-caching/fcfs", "W3", "burst"), find(summaries, "continuous/fcfs", "W3", "burst")
    if p3 and f3:
        out["prefix caching on/off W3 burst P50 TTFT"] = ratio(p3.ttft_ms.p50, f3.ttft_ms.p50)
        out["prefix caching on/off W3 burst P99 TTFT"] = ratio(p3.ttft_ms.p99, f3.ttft_ms.p99)
        out["prefix caching on/off W3 burst output tok/s"] = ratio(p3.output_tok_per_s, f3.output_tok_per_s)
    return out


def fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def markdown_report(meta: dict[str, Any], summaries: list[RunSummary], ratios: dict[str, float | None]) -> str:
    hw, sw = meta["hardware"], meta["software"]
    lines = [
        "# Serving benchmark (benchmarks/bench_serving.py)", "",
        f"- date: {meta['date']}  ·  target: {meta['target']}  ·  model: `{meta['model']}`",
        f"- hardware: {hw.get('cpu')} ({hw.get('cpu_cores')} cores, {hw.get('mem_gib', '?')} GiB)"
        + (f", GPU: {'; '.join(hw['gpus'])}" if hw.get("gpus") else ""),
        f"- software: " + ", ".join(f"{k} {v}" for k, v in sw.items()),
        f"- command: `{meta['command']}`",
        f"- workloads: {meta['workload_desc']}",
        f"- repeats per cell: {meta['repeats']} (values are medians over repeats); TTFT/ITL/TPOT in ms, latency in s",
        "",
        "## Server configurations", "",
    ]
    for c in meta["configs"]:
        lines.append(f"- `{c['name']}`: `{c['command']}`")
    lines += ["", "## Results", "",
              "| config | workload | mode | ok/n | prompt tok (mean) | out tok | TTFT p50/p95/p99 | ITL p50/p95/p99 "
              "| TPOT p50 | latency p50/p95/p99 | out tok/s | req/s | tok/chunk | queue |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for s in summaries:
        q = "—" if s.queue_ms is None else (f"{fmt(s.queue_ms.p50)} ms p50" if s.queue_source == "response"
                                            else f"{fmt(s.queue_ms.mean)} ms mean (/metrics)")
        lines.append(
            f"| {s.config} | {s.workload} | {s.mode} | {s.num_ok}/{s.num_requests} | {fmt(s.mean_prompt_tokens, 0)} "
            f"| {s.total_output_tokens} | {fmt(s.ttft_ms.p50)} / {fmt(s.ttft_ms.p95)} / {fmt(s.ttft_ms.p99)} "
            f"| {fmt(s.itl_ms.p50)} / {fmt(s.itl_ms.p95)} / {fmt(s.itl_ms.p99)} | {fmt(s.tpot_ms.p50)} "
            f"| {fmt(s.latency_s.p50, 2)} / {fmt(s.latency_s.p95, 2)} / {fmt(s.latency_s.p99, 2)} "
            f"| {fmt(s.output_tok_per_s)} | {fmt(s.req_per_s, 2)} | {fmt(s.mean_tokens_per_chunk, 2)} | {q} |")
    if ratios:
        lines += ["", "## Ratios", "", "| ratio | value |", "|---|---|"]
        lines += [f"| {k} | {fmt(v, 2)} |" for k, v in ratios.items()]
    problems = [s for s in summaries if s.num_errors or s.length_mismatches]
    if problems:
        lines += ["", "## Problems", ""]
        for s in problems:
            lines.append(f"- {s.config} {s.workload} {s.mode}: {s.num_errors} errors, "
                         f"{s.length_mismatches} output-length mismatches (ignore_eos not honoured?) {s.errors}")
    lines += ["", "Shared machine: compare ratios within one run, not absolute numbers across runs.", ""]
    return "\n".join(lines)


def to_jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj):
        return to_jsonable(dataclasses.asdict(obj))
    if isinstance(obj, dict):
        return {k: to_jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_jsonable(v) for v in obj]
    if isinstance(obj, float) and math.isnan(obj):
        return None
    return obj


def write_reports(out_dir: Path, stem: str, meta: dict[str, Any], summaries: list[RunSummary],
                  ratios: dict[str, float | None]) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    jpath, mpath = out_dir / f"{stem}.json", out_dir / f"{stem}.md"
    jpath.write_text(json.dumps(to_jsonable({"meta": meta, "runs": summaries, "ratios": ratios}), indent=2) + "\n")
    mpath.write_text(markdown_report(meta, summaries, ratios))
    return jpath, mpath


# ----------------------------------------------------------------------------- main

def workload_description(args: argparse.Namespace) -> str:
    o, p = args.max_output, args.max_prompt
    return (f"W1 1 req prompt {min(256, p)} gen {min(256, o)}; "
            f"W2 {args.num_requests} req prompt U[{min(32, p)},{min(1024, p)}] gen U[{min(64, o)},{min(256, o)}]; "
            f"W3 {args.num_requests} chat req, shared system prompt {min(1024, p)} tok + 32-word user msg, gen {min(128, o)}; "
            f"ignore_eos, temperature {args.temperature}, seed {args.seed}, prompts: {args.prompt_kind}")


async def main_async(args: argparse.Namespace) -> int:
    summaries: list[RunSummary] = []
    configs_meta: list[dict[str, Any]] = []
    model = "?"
    if args.launch:
        configs = sweep_configs(args)
        if not configs:
            print("[bench] nothing to run for the selected workloads/configs", file=sys.stderr)
            return 2
        workloads = None
        log_dir = Path(tempfile.mkdtemp(prefix="bench_serving_"))
        for cfg in configs:
            port = args.port or free_port()
            base = f"http://127.0.0.1:{port}"
            log_path = log_dir / f"{cfg.name.replace('/', '_')}.log"
            proc = launch_server(cfg, port, args, log_path)
            try:
                wait_healthy(proc, base, args.startup_timeout, log_path)
                got, workloads, model = await bench_server(base, cfg, args, workloads)
                summaries += got
            except RuntimeError as e:
                print(f"[bench] {cfg.name}: {e}", file=sys.stderr)
            finally:
                stop_server(proc)
            configs_meta.append({"name": cfg.name, "batching_mode": cfg.batching_mode,
                                 "scheduler_policy": cfg.scheduler_policy, "max_seq_len": args.max_seq_len,
                                 "max_batch_size": args.max_batch_size, "extra_args": args.server_arg,
                                 "command": " ".join(["infer", "serve", *cfg.argv, "--max-seq-len",
                                                      str(args.max_seq_len), "--max-batch-size",
                                                      str(args.max_batch_size), *args.server_arg]),
                                 "log_tail": [ln for ln in tail(log_path, 50).splitlines()
                                              if not ln.startswith("Loading")][-5:]})
        target = "infer serve (launched per config)"
    else:
        cfg = ServerConfig(args.label, runs=[(w, m) for w, m in
                                             [("W1", "sequential"), ("W2", "sequential"), ("W2", "burst"), ("W3", "burst")]
                                             if w in args.workloads])
        summaries, _, model = await bench_server(args.base_url.rstrip("/"), cfg, args, None)
        configs_meta.append({"name": args.label, "command": f"external server at {args.base_url}"})
        target = args.base_url
    ratios = compute_ratios(summaries, args.launch)
    meta = {"date": time.strftime("%Y-%m-%d %H:%M:%S %z"), "target": target, "model": model,
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
            "hardware": hardware_info(), "software": software_info(), "configs": configs_meta,
            "repeats": args.repeats, "workload_desc": workload_description(args),
            "args": {k: v for k, v in vars(args).items() if k != "infer_bin"}}
    jpath, mpath = write_reports(Path(args.out_dir), args.output_stem, meta, summaries, ratios)
    print(mpath.read_text())
    print(f"[bench] wrote {jpath} and {mpath}")
    return 0 if summaries and all(s.num_errors == 0 for s in summaries) else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--base-url", help="benchmark an already running server, e.g. http://127.0.0.1:8000")
    target.add_argument("--launch", action="store_true",
                        help="start `infer serve` for each configuration of the sweep and stop it after")
    p.add_argument("--workloads", default="W1,W2,W3", help="comma-separated subset of W1,W2,W3")
    p.add_argument("--runs", default="", help="with --launch: only these WORKLOAD:MODE runs of each config, "
                   "e.g. W1:sequential,W2:burst (default: every run of the sweep)")
    p.add_argument("--num-requests", type=int, default=16, help="requests in W2 and W3")
    p.add_argument("--max-output", type=int, default=256, help="cap on generated tokens per request (scales W1-W3 down)")
    p.add_argument("--max-prompt", type=int, default=1024, help="cap on prompt tokens per request (scales W1-W3 down)")
    p.add_argument("--concurrency", type=int, default=0, help="max in-flight requests in burst mode; 0 = all at once")
    p.add_argument("--repeats", type=int, default=1, help="runs per (config, workload, mode); medians reported")
    p.add_argument("--seed", type=int, default=0, help="seed for prompt lengths/contents and for sampling")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature sent with each request")
    p.add_argument("--prompt-kind", choices=["text", "ids"], default="text",
                   help="text: words from a fixed list (length calibrated via /tokenize when available); "
                        "ids: random token ids from --token-id-range sent as `prompt: [int,...]`")
    p.add_argument("--token-id-range", default="1000:20000", help="LO:HI token ids for --prompt-kind ids")
    p.add_argument("--no-calibrate", action="store_true", help="do not use /tokenize to hit exact prompt lengths")
    p.add_argument("--no-warmup", action="store_true", help="skip the small warm-up request before each config")
    p.add_argument("--model", default=None, help="model name to send; default: first id from GET /v1/models")
    p.add_argument("--label", default="external", help="name of the server config in the report (--base-url)")
    p.add_argument("--request-timeout", type=float, default=900.0, help="seconds per request")
    launch = p.add_argument_group("--launch options")
    launch.add_argument("--configs", default="",
                        help="subset of continuous/fcfs,static/fcfs,continuous/prefill_first,continuous/decode_round_robin")
    launch.add_argument("--infer-bin", type=Path, default=ROOT / ".venv" / "bin" / "infer", help="the infer executable")
    launch.add_argument("--port", type=int, default=0, help="server port; 0 = pick a free one")
    launch.add_argument("--max-seq-len", type=int, default=2048, help="passed to infer serve")
    launch.add_argument("--max-batch-size", type=int, default=16, help="passed to infer serve")
    launch.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                        help="extra argument for infer serve (repeatable), e.g. --server-arg=--device=cuda")
    launch.add_argument("--startup-timeout", type=float, default=600.0, help="seconds to wait for /health")
    p.add_argument("--out-dir", default=str(REPORTS), help="where serving.{json,md} go")
    p.add_argument("--output-stem", default="serving", help="report file name stem")
    args = p.parse_args(argv)
    args.workloads = [w.strip() for w in args.workloads.split(",") if w.strip()]
    args.runs = [tuple(r.strip().split(":", 1)) for r in args.runs.split(",") if r.strip()]
    bad = [w for w in args.workloads if w not in WORKLOADS]
    if bad:
        p.error(f"unknown workloads {bad}; choose from {WORKLOADS}")
    lo, hi = (int(x) for x in args.token_id_range.split(":"))
    args.token_id_range = (lo, hi)
    return args


def main(argv: list[str] | None = None) -> int:
    return asyncio.run(main_async(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
