"""Serving at engine speed: the offline engine, then `infer serve`, on the same GPU, prompts and settings.

    python benchmarks/serve_vs_offline.py [--shape llama-3.2-1b] [--levels 1,16,64,256] [--api-server-count N]
                                          [--fresh-connections] [--data-parallel-size N] [--tensor-parallel-size N]
                                          [--client-processes N] [--requests-per-stream R]

Per concurrency level C: C requests of random token-id prompts (128-512 tokens), 256 new tokens each, greedy, EOS
ignored, random bf16 weights at the named shape (model_shapes.py: a word-level tokenizer of the model's whole
vocabulary, so any id decodes). Offline: `LLM.generate_ids` of the C prompts at once (the in-process engine). Server:
`infer serve` as a user starts it (its own engine-core process, warmed up at start), C concurrent streamed
completions through httpx from up to --client-processes processes (default 8; sse_client.py: one event loop each,
started and connected before the clock starts, so neither the client nor its start-up is measured; with
--fresh-connections each stream opens its connection in the burst, as a crowd of new clients does), every SSE chunk
read and parsed; tok/s is generated tokens over the wall time from releasing the clients to the last stream's end;
ITL is the gap between a stream's chunks, TTFT from a request's send to its first text chunk. Per level one first run
(reported, not timed into the median), then the median of --repeats runs (fresh prompts each run, so the prefix cache
never hits). Writes serve_vs_offline_<gpu>.{json,md} under OUT_DIR (default benchmarks/reports). With
--data-parallel-size N the server runs N engine cores (`-dp N`, one GPU each) against the one offline engine: the
ratio is then data parallelism's scaling through the server. With --tensor-parallel-size N both the offline engine
and the server shard the model over N GPUs (`-tp N`). The report adds each process's CPU seconds during the median
server run, by role (proc_cpu.py): which of the engine cores, the API servers and the clients was saturated. GPU run:
`bash scripts/gpu_serving.sh`. With --requests-per-stream R each of the C streams sends R requests one after another
(a closed loop: C users, each sending its next request when the last ended; C * R requests a level, the offline engine
given all C * R at once): the ramp of the first wave and the drain of the last weigh 1/R as much, so a level measures
the sustained rate rather than one burst.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

import model_shapes as ms
from proc_cpu import cpu_delta, tree_cpu

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_harness import serve_process  # noqa: E402  (the tests' `infer serve` subprocess harness)
from infer.build.placement import available_cpus, other_cpus, ranges
from infer.engine.config import EngineConfig
from infer.server.launch import api_servers_for

NEW_TOKENS = 256
ENGINE_FLAGS = {"max_seq_len": 2048, "max_batch_size": 256, "kv_cache_memory_gb": 16.0}


def prompts_for(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(128, 512))] for _ in range(count)]


def run_offline(path: Path, vocab: int, levels: list[int], repeats: int,
                tensor_parallel: int = 1, per_stream: int = 1) -> dict[int, dict[str, float]]:
    from infer import LLM, SamplingParams

    llm = LLM(str(path), load_format="dummy", tensor_parallel_size=tensor_parallel, **ENGINE_FLAGS)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    out: dict[int, dict[str, float]] = {}
    for level in levels:
        runs, ttfts = [], []
        for repeat in range(-1, repeats):  # repeat -1: the level's first run, reported beside the timed ones
            prompts = prompts_for(vocab, level * per_stream, seed=1000 * level + repeat)
            torch.cuda.synchronize()
            tok_s, ttft = _offline_run(llm, prompts, params)
            runs.append(tok_s)
            ttfts.append(ttft)
        out[level] = {"tok_s": statistics.median(runs[1:]), "runs": runs[1:], "first": runs[0],
                      "ttft_p50_ms": statistics.median(ttfts[1:])}
        print(f"offline C={level}: {out[level]['tok_s']:.0f} tok/s, TTFT p50 {out[level]['ttft_p50_ms']:.0f} ms",
              flush=True)
    llm.close()  # its tensor-parallel workers end here, freeing their GPUs for the server
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return out


def _offline_run(llm: object, prompts: list[list[int]], params: object) -> tuple[float, float]:
    """The batch through the in-process engine's step loop, as LLM.generate_ids runs it: (tok/s, the p50 of each
    request's time to its first token, in ms)."""
    engine = llm.engine  # type: ignore[attr-defined]
    started = time.perf_counter()
    ids = [engine.add_request(p, params, incremental_text=False).request_id for p in prompts]
    first: dict[str, float] = {}
    tokens = 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.token_id is not None:
                tokens += 1
                first.setdefault(out.request_id, time.perf_counter())
    seconds = time.perf_counter() - started
    ttft = sorted(first[i] - started for i in ids)
    return tokens / seconds, 1e3 * ttft[len(ttft) // 2]


def client_cpus(data_parallel: int, tensor_parallel: int) -> frozenset[int] | None:
    """The CPUs a data-parallel `infer serve` leaves to others on this host (build/placement.py): the clients run
    there, off the engine cores' own CPUs, as clients on other machines would; None where the server pins nothing."""
    if data_parallel == 1:
        return None
    return other_cpus([(f"cuda:{i * tensor_parallel}", tensor_parallel) for i in range(data_parallel)],
                      available_cpus())


def run_server_level(url: str, model: str, prompts: list[list[int]], clients: int,
                     fresh: bool = False, server_pid: int | None = None,
                     cpus: frozenset[int] | None = None, per_stream: int = 1) -> dict[str, float]:
    """len(prompts) / per_stream concurrent streams, each sending its `per_stream` prompts one after another, from
    `clients` processes of sse_client.py (on `cpus`, if given), released together once all are connected; with
    `server_pid`, the CPU seconds each of the server's processes used meanwhile (by role, proc_cpu.py)."""
    requests = [{"model": model, "prompt": p, "max_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 0,
                 "stream": True, "stream_options": {"include_usage": True}} for p in prompts]
    bodies = [requests[i:i + per_stream] for i in range(0, len(requests), per_stream)]
    work = Path(tempfile.mkdtemp(prefix="sse-"))
    procs = []
    for i in range(min(clients, len(bodies))):
        (work / f"bodies{i}.json").write_text(json.dumps(bodies[i::clients]))
        with (work / f"stderr{i}.txt").open("w") as stderr:  # the child keeps its own descriptor
            procs.append(subprocess.Popen([sys.executable, str(Path(__file__).with_name("sse_client.py")), url,
                                           str(work / f"bodies{i}.json"), str(work / f"result{i}.json"),
                                           *(["fresh"] if fresh else [])],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, text=True,
                                          preexec_fn=None if cpus is None else lambda: os.sched_setaffinity(0, cpus)))
    for proc in procs:
        if proc.stdout.readline().strip() != "ready":
            raise RuntimeError("a benchmark client failed to start")
    cpu_before = tree_cpu(server_pid) if server_pid else {}
    start = time.time()
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    for i, proc in enumerate(procs):
        if proc.wait(900):
            tail = (work / f"stderr{i}.txt").read_text()[-2000:]
            raise RuntimeError(f"a benchmark client exited with {proc.returncode}:\n{tail}")
    server_cpu = cpu_delta(cpu_before, tree_cpu(server_pid)) if server_pid else {}
    results = [json.loads((work / f"result{i}.json").read_text()) for i in range(len(procs))]
    shutil.rmtree(work)
    streams = [s for r in results for s in r["streams"]]
    end = max(s["done"] for s in streams)
    tokens = sum(s["tokens"] for s in streams)
    gaps = sorted(b - a for s in streams for a, b in zip(s["chunk_times"], s["chunk_times"][1:]))
    ttft = sorted(s["chunk_times"][0] - s["sent"] for s in streams)
    return {"tok_s": tokens / (end - start), "tokens": tokens, "wall_s": end - start,
            "cpu_s": server_cpu | {"client": sorted((round(r["cpu_s"], 2) for r in results),
                                                    reverse=True)}, "itl_p50_ms": 1e3 * gaps[len(gaps) // 2],
            "itl_p99_ms": 1e3 * gaps[int(len(gaps) * 0.99)], "ttft_p50_ms": 1e3 * ttft[len(ttft) // 2],
            "release_to_first_send_ms": 1e3 * (min(s["sent"] for s in streams) - start),
            "ttft_from_release_p50_ms": 1e3 * sorted(s["chunk_times"][0] - start for s in streams)[len(streams) // 2],
            "ttft_from_release_max_ms": 1e3 * max(s["chunk_times"][0] - start for s in streams),
            "ttft_from_release_ms_deciles": [round(1e3 * (t - start)) for t in sorted(
                s["chunk_times"][0] for s in streams)[:: max(1, len(streams) // 10)]]}


def run_server(path: Path, vocab: int, levels: list[int], repeats: int, api_servers: int,
               fresh: bool = False, data_parallel: int = 1, tensor_parallel: int = 1,
               client_processes: int = 8, serve_args: list[str] | None = None, per_stream: int = 1
               ) -> dict[int, dict]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    flags += [f"--data-parallel-size={data_parallel}", f"--tensor-parallel-size={tensor_parallel}",
              # every stream of the largest level admitted, as the offline engine admits every prompt (the default
              # 256 per engine answered 503s to a 1,024-stream level on 2 engines with 8 API servers)
              f"--max-waiting-requests={max(levels)}",
              # the clients open every connection, then hold it idle until the release: with the 5 s default a
              # 2,048-stream level failed (httpx ReadError as requests went out on kept-alive connections), at 60 s ran
              "--keep-alive-timeout-s=120", *(serve_args or [])]
    started = time.perf_counter()
    with serve_process("--model", str(path), "--load-format", "dummy", "--log-level", "warning",
                       "--api-server-count", str(api_servers), *flags, timeout=600) as server:
        startup = time.perf_counter() - started
        base = server.base_url
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        cpus = client_cpus(data_parallel, tensor_parallel)
        out: dict[int, dict] = {"startup_s": startup,  # type: ignore[dict-item]
                                "client_cpus": ranges(cpus) if cpus else None}  # type: ignore[dict-item]
        for level in levels:
            try:
                runs = [run_server_level(f"{base}/v1/completions", model,
                                         prompts_for(vocab, level * per_stream,
                                                     seed=1000 * level + repeat),
                                         clients=min(client_processes, level), fresh=fresh,
                                         server_pid=server.proc.pid, cpus=cpus, per_stream=per_stream)
                        for repeat in range(-1, repeats)]
            except RuntimeError as exc:
                raise RuntimeError(f"{exc}\n--- the server printed (last 3,000 characters):\n"
                                   f"{server.printed.text(wait_s=0)[-3000:]}") from None
            best = sorted(runs[1:], key=lambda r: r["tok_s"])[repeats // 2]
            out[level] = best | {"runs": [r["tok_s"] for r in runs[1:]], "first": runs[0]["tok_s"], "first_run": runs[0]}
            print(f"server C={level}: {best['tok_s']:.0f} tok/s, ITL p50 {best['itl_p50_ms']:.1f} ms, TTFT p50 "
                  f"{best['ttft_p50_ms']:.0f} ms, release to first send {best['release_to_first_send_ms']:.0f} ms; "
                  f"{cpu_line(best)}", flush=True)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=list(ms.SHAPES))
    parser.add_argument("--levels", default="1,16,64,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--api-server-count", type=int, default=None,
                        help="the server's API processes (default: what `infer serve` picks on this machine)")
    parser.add_argument("--fresh-connections", action="store_true",
                        help="each stream opens its connection when released (a burst of new clients)")
    parser.add_argument("--data-parallel-size", type=int, default=1,
                        help="engine cores behind the server (one GPU each), against the one offline engine")
    parser.add_argument("--client-processes", type=int, default=8,
                        help="benchmark client processes the streams are spread over (each one event loop, one CPU)")
    parser.add_argument("--serve-arg", action="append", default=[], metavar="FLAG=VALUE",
                        help="one more `infer serve` flag, e.g. --serve-arg=--keep-alive-timeout-s=60 (repeatable)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1,
                        help="GPUs each engine (offline and served) shards the model over")
    parser.add_argument("--requests-per-stream", type=int, default=1, metavar="R",
                        help="requests each stream sends one after another (a closed loop; default 1: one burst)")
    args = parser.parse_args()
    if args.requests_per_stream < 1:
        parser.error(f"--requests-per-stream must be >= 1, got {args.requests_per_stream}")
    levels = [int(x) for x in args.levels.split(",")]
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    vocab = ms.model_config(args.shape).vocab_size
    offline = run_offline(path, vocab, levels, args.repeats, args.tensor_parallel_size,
                          args.requests_per_stream)
    api_servers = api_servers_for(EngineConfig(device="cuda"), args.api_server_count)
    server = run_server(path, vocab, levels, args.repeats, api_servers, args.fresh_connections,
                        args.data_parallel_size, args.tensor_parallel_size, args.client_processes, args.serve_arg,
                        args.requests_per_stream)
    report = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "torch": torch.__version__,
              "engine": ENGINE_FLAGS, "api_server_count": api_servers, "repeats": args.repeats, "new_tokens": NEW_TOKENS,
              "fresh_connections": args.fresh_connections, "client_processes": args.client_processes,
              "requests_per_stream": args.requests_per_stream,
              "data_parallel_size": args.data_parallel_size,
              "tensor_parallel_size": args.tensor_parallel_size, "serve_args": args.serve_arg,
              "startup_s": server.pop("startup_s"), "client_cpus": server.pop("client_cpus"), "levels": {
                  level: {"offline": offline[level], "server": server[level],
                          "ratio": server[level]["tok_s"] / offline[level]["tok_s"]} for level in levels}}
    write(report)


def cpu_line(run: dict) -> str:
    """The run's wall time and each process's CPU seconds by role."""
    roles = "; ".join(f"{role} {' '.join(f'{v:.1f}' for v in values)}" for role, values in run.get("cpu_s", {}).items())
    return f"{run.get('wall_s', float('nan')):.1f} s wall; CPU s: {roles}"


def write(r: dict) -> None:
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    gpu = r["gpu"].lower().replace("nvidia", "").split()[0]
    stem = f"serve_vs_offline_{gpu}_api{r['api_server_count']}" + ("_fresh" if r.get("fresh_connections") else "")
    stem += "" if r["shape"] == "llama-3.2-1b" else f"_{r['shape']}"  # the default shape's reports keep their names
    stem += f"_dp{r['data_parallel_size']}" if r.get("data_parallel_size", 1) > 1 else ""
    stem += f"_tp{r['tensor_parallel_size']}" if r.get("tensor_parallel_size", 1) > 1 else ""
    stem += f"_clients{r['client_processes']}" if r.get("client_processes", 8) != 8 else ""
    stem += f"_r{r['requests_per_stream']}" if r.get("requests_per_stream", 1) > 1 else ""
    (out / f"{stem}.json").write_text(json.dumps(r, indent=2) + "\n")
    lines = [f"# `infer serve` vs the offline engine — {r['shape']} (random bf16 weights), {r['gpu']}", "",
             f"Same process tree, same engine settings ({', '.join(f'{k}={v}' for k, v in r['engine'].items())}); "
             f"token-id prompts of 128-512 tokens, {r['new_tokens']} new tokens each, greedy, EOS ignored; the server "
             f"with {r['api_server_count']} API server process(es)"
             f"{' and ' + str(r['data_parallel_size']) + ' engine cores (DP) against one offline engine' if r.get('data_parallel_size', 1) > 1 else ''}"
             f"{', both sharded over ' + str(r['tensor_parallel_size']) + ' GPUs (TP)' if r.get('tensor_parallel_size', 1) > 1 else ''}, every SSE chunk read by httpx clients in up to {r.get('client_processes', 8)} "
             f"processes, {'each stream opening its connection in the burst' if r.get('fresh_connections') else 'connected before the clock starts'}"
             f"{'; each stream sends ' + str(r['requests_per_stream']) + ' requests one after another (the offline engine gets them all at once)' if r.get('requests_per_stream', 1) > 1 else ''}. Medians of {r.get('repeats', 3)} runs (the upper one of an even count) after one first run per level (its tok/s in the last columns). Server start to healthy (load, CUDA graphs, warm-up): "
             f"{r['startup_s']:.1f} s. torch {r['torch']}.", "",
             "| concurrent streamed requests | offline `LLM.generate_ids` tok/s | `infer serve` tok/s | server ÷ offline "
             "| server ITL p50 / p99 | server TTFT p50 | TTFT p50 from release: offline / server | first run offline / server |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for level, row in r["levels"].items():
        s = row["server"]
        lines.append(f"| {level} | {row['offline']['tok_s']:,.0f} | {s['tok_s']:,.0f} | {row['ratio']:.2f} | "
                     f"{s['itl_p50_ms']:.1f} / {s['itl_p99_ms']:.1f} ms | {s['ttft_p50_ms']:.0f} ms | "
                     f"{row['offline'].get('ttft_p50_ms', float('nan')):.0f} / {s['ttft_from_release_p50_ms']:.0f} ms | "
                     f"{row['offline']['first']:,.0f} / {s['first']:,.0f} |")
    lines += ["", "CPU seconds each process used during the median server run (proc_cpu.py: `core` maps libtorch, "
              "`api` is every other process of the server, `client` the benchmark's sse_client.py processes"
              + (f", on CPUs {r['client_cpus']}, off the engine cores' own" if r.get("client_cpus") else "") + "):",
              ""] + [f"- C={level}: {cpu_line(row['server'])}" for level, row in r["levels"].items()
                     if row["server"].get("cpu_s")]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
