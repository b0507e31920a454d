"""Serving at engine speed: the offline engine, then `infer serve`, on the same GPU, prompts and settings.

    python benchmarks/serve_vs_offline.py [--shape llama-3.2-1b] [--levels 1,16,64,256] [--api-server-count 1]

Per concurrency level C: C requests of random token-id prompts (128-512 tokens), 256 new tokens each, greedy,
EOS ignored, random bf16 weights at the named shape (model_shapes.py: a word-level tokenizer of the model's whole
vocabulary, so any id decodes). Offline: `LLM.generate_ids` of the C prompts at once (the in-process engine). Server:
`infer serve` as a user starts it (its own engine-core process, warmed up at start), C concurrent streamed
completions through httpx spread over client processes (one event loop each, so the client is not the
bottleneck), every SSE chunk read and parsed; tok/s is generated tokens over the wall time from the first request
sent to the last [DONE]; ITL is the gap between a stream's chunks. Median of --repeats runs per level (fresh
prompts each run, so the prefix cache never hits). Writes serve_vs_offline_<gpu>.{json,md} under OUT_DIR
(default benchmarks/reports). GPU run: `bash scripts/gpu_serving.sh`.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch

import model_shapes as ms

NEW_TOKENS = 256
ENGINE_FLAGS = {"max_seq_len": 2048, "max_batch_size": 256, "kv_cache_memory_gb": 16.0}


def prompts_for(vocab: int, count: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(128, 512))] for _ in range(count)]


def run_offline(path: Path, vocab: int, levels: list[int], repeats: int) -> dict[int, dict[str, float]]:
    from infer import LLM, SamplingParams

    llm = LLM(str(path), load_format="dummy", **ENGINE_FLAGS)
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    out: dict[int, dict[str, float]] = {}
    for level in levels:
        runs = []
        for repeat in range(repeats):
            prompts = prompts_for(vocab, level, seed=1000 * level + repeat)
            torch.cuda.synchronize()
            started = time.perf_counter()
            results = llm.generate_ids(prompts, params)
            seconds = time.perf_counter() - started
            runs.append(sum(len(r.token_ids) for r in results) / seconds)
        out[level] = {"tok_s": statistics.median(runs), "runs": runs}
        print(f"offline C={level}: {out[level]['tok_s']:.0f} tok/s", flush=True)
    del llm
    gc.collect()
    torch.cuda.empty_cache()
    return out


async def _stream(http: httpx.AsyncClient, url: str, body: dict) -> tuple[int, list[float]]:
    """One streamed completion: its generated tokens (usage) and the arrival time of each text chunk."""
    times: list[float] = []
    tokens = 0
    async with http.stream("POST", url, json=body) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
    return tokens, times


def _client(url: str, bodies: list[dict], start_at: float, queue: multiprocessing.Queue) -> None:
    async def main() -> list[tuple[int, list[float]]]:
        limits = httpx.Limits(max_connections=len(bodies) + 4, max_keepalive_connections=len(bodies) + 4)
        async with httpx.AsyncClient(timeout=600, limits=limits) as http:
            await asyncio.sleep(max(0.0, start_at - time.time()))
            return await asyncio.gather(*(_stream(http, url, b) for b in bodies))

    started = time.perf_counter()
    results = asyncio.run(main())
    queue.put((started, time.perf_counter(), time.time(), results))


def run_server_level(url: str, model: str, prompts: list[list[int]], clients: int) -> dict[str, float]:
    bodies = [{"model": model, "prompt": p, "max_tokens": NEW_TOKENS, "ignore_eos": True, "temperature": 0,
               "stream": True, "stream_options": {"include_usage": True}} for p in prompts]
    ctx = multiprocessing.get_context("spawn")
    queue: multiprocessing.Queue = ctx.Queue()
    shares = [bodies[i::clients] for i in range(min(clients, len(bodies)))]
    start_at = time.time() + 2.0  # every client process up and connected first
    procs = [ctx.Process(target=_client, args=(url, share, start_at, queue)) for share in shares]
    for p in procs:
        p.start()
    results = [queue.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    # wall: from the synchronized start to the last stream's end, on the wall clock every process shares
    end = max(wall_end for _, _, wall_end, _ in results)
    tokens = sum(t for *_, rs in results for t, _ in rs)
    gaps = [b - a for *_, rs in results for _, times in rs for a, b in zip(times, times[1:])]
    gaps.sort()
    return {"tok_s": tokens / (end - start_at), "tokens": tokens, "itl_p50_ms": 1e3 * gaps[len(gaps) // 2],
            "itl_p99_ms": 1e3 * gaps[int(len(gaps) * 0.99)]}


def run_server(path: Path, vocab: int, levels: list[int], repeats: int, api_servers: int) -> dict[int, dict]:
    port = 8000 + random.randrange(1000)
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in ENGINE_FLAGS.items()]
    cmd = [sys.executable, "-m", "infer.cli", "serve", "--model", str(path), "--load-format", "dummy", "--port",
           str(port), "--log-level", "warning", "--api-server-count", str(api_servers), *flags]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd)
    base = f"http://127.0.0.1:{port}"
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"infer serve exited with {proc.returncode}")
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        startup = time.perf_counter() - started
        model = httpx.get(f"{base}/v1/models").json()["data"][0]["id"]
        out: dict[int, dict] = {"startup_s": startup}  # type: ignore[dict-item]
        for level in levels:
            runs = [run_server_level(f"{base}/v1/completions", model,
                                     prompts_for(vocab, level, seed=1000 * level + repeat), clients=min(8, level))
                    for repeat in range(repeats)]
            best = sorted(runs, key=lambda r: r["tok_s"])[len(runs) // 2]
            out[level] = best | {"runs": [r["tok_s"] for r in runs]}
            print(f"server C={level}: {best['tok_s']:.0f} tok/s, ITL p50 {best['itl_p50_ms']:.1f} ms", flush=True)
        return out
    finally:
        proc.terminate()
        proc.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=ms.GPU_SHAPES)
    parser.add_argument("--levels", default="1,16,64,256")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--api-server-count", type=int, default=1)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
    vocab = ms.model_config(args.shape).vocab_size
    offline = run_offline(path, vocab, levels, args.repeats)
    server = run_server(path, vocab, levels, args.repeats, args.api_server_count)
    report = {"gpu": torch.cuda.get_device_name(), "shape": args.shape, "torch": torch.__version__,
              "engine": ENGINE_FLAGS, "api_server_count": args.api_server_count, "new_tokens": NEW_TOKENS,
              "startup_s": server.pop("startup_s"), "levels": {
                  level: {"offline": offline[level], "server": server[level],
                          "ratio": server[level]["tok_s"] / offline[level]["tok_s"]} for level in levels}}
    write(report)


def write(r: dict) -> None:
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    gpu = r["gpu"].lower().replace("nvidia", "").split()[0]
    stem = f"serve_vs_offline_{gpu}" + (f"_api{r['api_server_count']}" if r["api_server_count"] > 1 else "")
    (out / f"{stem}.json").write_text(json.dumps(r, indent=2) + "\n")
    lines = [f"# `infer serve` vs the offline engine — {r['shape']} (random bf16 weights), {r['gpu']}", "",
             f"Same process tree, same engine settings ({', '.join(f'{k}={v}' for k, v in r['engine'].items())}); "
             f"token-id prompts of 128-512 tokens, {r['new_tokens']} new tokens each, greedy, EOS ignored; the server "
             f"with {r['api_server_count']} API server process(es), every SSE chunk read by httpx clients in up to 8 "
             f"processes. Medians of 3 runs. Server start to healthy (load, CUDA graphs, warm-up): "
             f"{r['startup_s']:.1f} s. torch {r['torch']}.", "",
             "| concurrent streamed requests | offline `LLM.generate_ids` tok/s | `infer serve` tok/s | server ÷ offline "
             "| server ITL p50 / p99 |", "|---:|---:|---:|---:|---:|"]
    for level, row in r["levels"].items():
        s = row["server"]
        lines.append(f"| {level} | {row['offline']['tok_s']:,.0f} | {s['tok_s']:,.0f} | {row['ratio']:.2f} | "
                     f"{s['itl_p50_ms']:.1f} / {s['itl_p99_ms']:.1f} ms |")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
