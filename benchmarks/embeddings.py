"""Embedding throughput: `infer serve`'s /v1/embeddings read by concurrent HTTP clients, beside the same engine's
offline prefill rate (LLM.embed, and prompt scoring with max_tokens=0) in the same run.

    python benchmarks/embeddings.py [--model PATH] [--requests 64] [--batch 8] [--concurrency 8]

Inputs: `--requests` random sentences of 40-200 tokens each (fresh ones for every run and path: none is found in the
prefix cache), sent `--batch` inputs per request by `--concurrency`
clients at once; the server is `infer serve` on the same model and settings (started and waited for here). Reported:
embedded tokens per second (server, offline embed) and their ratio to the offline prefill rate, medians of
`--repeats`. Writes embeddings_<device>.{json,md} under OUT_DIR (default benchmarks/reports).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import torch

from bench_serving import free_port
from infer import LLM, SamplingParams

WORDS = "the cat sat on a mat while seven quick foxes jumped over lazy dogs near old red barns".split()


def sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(30, 150))) for _ in range(n)]


async def serve_rate(base: str, texts: list[str], batch: int, concurrency: int, encoding: str) -> tuple[float, int]:
    """(seconds, prompt tokens the server counted) for every text, `batch` per request, `concurrency` at once, the
    vectors sent back as `encoding` ("float", or "base64": what the openai SDK asks for by default)."""
    chunks = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for c in chunks:
        queue.put_nowait(c)
    tokens = 0

    async def client() -> None:
        nonlocal tokens
        async with httpx.AsyncClient(base_url=base, timeout=600) as http:
            while not queue.empty():
                inputs = queue.get_nowait()
                reply = await http.post("/v1/embeddings", json={"input": inputs, "encoding_format": encoding})
                reply.raise_for_status()
                tokens += reply.json()["usage"]["prompt_tokens"]

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(concurrency)))
    return time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a checkpoint directory or GGUF (default: the bundled model)")
    parser.add_argument("--load-format", default="auto")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-seq-len", type=int, default=1024)
    args = parser.parse_args()
    options = {"max_seq_len": args.max_seq_len, "load_format": args.load_format}
    llm = LLM(args.model, **options)
    device = llm.config.resolved_device
    score = SamplingParams(max_tokens=0)
    offline_embed, offline_prefill = [], []
    llm.embed(sentences(args.batch, seed=99))  # the first prompts of new lengths pick and bind kernels
    llm.generate_ids([llm.encode(t) for t in sentences(args.batch, seed=98)], score)
    for r in range(args.repeats):
        ids = [llm.encode(t) for t in sentences(args.requests, seed=r)]
        n = sum(map(len, ids))
        start = time.perf_counter()
        llm.embed(ids)
        offline_embed.append(n / (time.perf_counter() - start))
        fresh = [llm.encode(t) for t in sentences(args.requests, seed=1000 + r)]  # not in the prefix cache
        start = time.perf_counter()
        llm.generate_ids(fresh, score)
        offline_prefill.append(sum(map(len, fresh)) / (time.perf_counter() - start))
    llm.close()  # the server below needs the device memory this engine holds
    del llm
    gc.collect()
    if device != "cpu":
        torch.cuda.empty_cache()
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    port = free_port()
    server_log = tempfile.NamedTemporaryFile("w+", suffix=".log", prefix="embeddings_server_")
    flags = ["--port", str(port), "--max-seq-len", str(args.max_seq_len), "--load-format", args.load_format]
    proc = subprocess.Popen([sys.executable, "-m", "infer.cli", "serve", *(["--model", args.model] if args.model else []),
                             *flags], stdout=server_log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                server_log.seek(0)
                raise SystemExit(f"infer serve exited with {proc.returncode}:\n{server_log.read()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("infer serve was not healthy within 300 s")
        served: dict[str, list[float]] = {"float": [], "base64": []}
        warm = sentences(args.batch * args.concurrency, seed=99)
        asyncio.run(serve_rate(base, warm, args.batch, args.concurrency, "float"))
        for r in range(args.repeats):
            for e, (encoding, rates) in enumerate(served.items()):  # fresh sentences: no prefix-cache hits
                texts = sentences(args.requests, seed=100 + 2 * r + e)
                seconds, tokens = asyncio.run(serve_rate(base, texts, args.batch, args.concurrency, encoding))
                rates.append(tokens / seconds)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    row = {"device": device, "requests": args.requests, "batch": args.batch, "concurrency": args.concurrency,
           "serve_tok_s": statistics.median(served["float"]),
           "serve_base64_tok_s": statistics.median(served["base64"]),
           "offline_embed_tok_s": statistics.median(offline_embed), "offline_prefill_tok_s": statistics.median(offline_prefill)}
    print(json.dumps(row))
    slug = "cpu" if device == "cpu" else "gpu"
    (out / f"embeddings_{slug}.json").write_text(json.dumps(row, indent=2) + "\n")
    (out / f"embeddings_{slug}.md").write_text("\n".join([
        f"# Embedding throughput ({args.model or 'bundled SmolLM2-135M'}, {device})", "",
        f"{args.requests} random sentences of ~40-200 tokens, {args.batch} inputs per /v1/embeddings request, "
        f"{args.concurrency} concurrent httpx clients against `infer serve`; offline: the same engine in process. "
        f"Medians of {args.repeats} runs after one warm-up run of each path.", "",
        "| path | tokens/s | ÷ offline prefill |", "|---|---:|---:|",
        f"| offline prefill (prompt scoring, max_tokens=0) | {row['offline_prefill_tok_s']:.0f} | 1.00 |",
        f"| offline `LLM.embed` | {row['offline_embed_tok_s']:.0f} | "
        f"{row['offline_embed_tok_s'] / row['offline_prefill_tok_s']:.2f} |",
        f"| `infer serve` /v1/embeddings, floats | {row['serve_tok_s']:.0f} | "
        f"{row['serve_tok_s'] / row['offline_prefill_tok_s']:.2f} |",
        f"| `infer serve` /v1/embeddings, base64 | {row['serve_base64_tok_s']:.0f} | "
        f"{row['serve_base64_tok_s'] / row['offline_prefill_tok_s']:.2f} |", "",
        "Reproduce: `python benchmarks/embeddings.py`.", ""]))


if __name__ == "__main__":
    main()
