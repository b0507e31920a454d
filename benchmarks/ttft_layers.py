"""Where a single request's time to first token goes: the offline engine, the engine core through its client (ZMQ,
no HTTP), and `infer serve` over HTTP (streamed and not), for the same prompts on the same GPU.

    python benchmarks/ttft_layers.py [--shape llama-3.2-1b] [--prompt-tokens 300]
    python benchmarks/ttft_layers.py --model .bench/hf/smollm2-135m-fp32 --prompt-tokens 128   # real weights, CPU too

Each layer runs REPEATS single requests one after another and prints the median ms to the first token (and to the
8th). A layer that adds more than its own work (a round trip over ZMQ, an HTTP request) points at the culprit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from pathlib import Path

import httpx

import model_shapes as ms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_harness import serve_process  # noqa: E402  (the tests' `infer serve` subprocess harness)

REPEATS = 7
FLAGS = {"max_seq_len": 2048, "max_batch_size": 256, "kv_cache_memory_gb": 8.0}
LOAD: dict[str, str] = {"load_format": "dummy"}  # random weights of a shape; --model: the directory's own


def _prompts(vocab: int, n: int, tokens: int) -> list[list[int]]:
    rng = random.Random(tokens)
    return [[rng.randrange(vocab) for _ in range(tokens)] for _ in range(n)]


def offline(path: Path, prompts: list[list[int]]) -> list[tuple[float, float]]:
    from infer import LLM, SamplingParams

    llm = LLM(str(path), **LOAD, **FLAGS)
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    out = []
    for p in prompts:
        started, times = time.perf_counter(), []
        for step in llm.stream(p, params):
            if step.token_id is not None:
                times.append(time.perf_counter() - started)
        out.append((times[0], times[-1]))
    del llm
    return out


async def _through_client(path: Path, prompts: list[list[int]]) -> list[tuple[float, float]]:
    from infer.frontend.client import EngineClient
    from infer.engine.config import EngineConfig
    from infer.build.core_process import CoreProcess
    from infer.sampling.params import SamplingParams
    from infer.server.launch import served_model

    core = CoreProcess.start(EngineConfig(model=str(path), **LOAD, **FLAGS), timeout_s=600)
    try:
        served = served_model(core.info)
        client = EngineClient(core.info, served.tokenizer, 64)
        await client.start()
        out = []
        for i, p in enumerate(prompts):
            started, times = time.perf_counter(), []
            async for step in client.submit(f"r{i}", p, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)):
                if step.token_id is not None:
                    times.append(time.perf_counter() - started)
            out.append((times[0], times[-1]))
        await client.close()
        return out
    finally:
        core.stop()


def http(path: Path, prompts: list[list[int]]) -> dict[str, list[tuple[float, float]]]:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in (LOAD | FLAGS).items()]
    with serve_process("--model", str(path), "--log-level", "warning", *flags,
                       timeout=600) as server:
        base = server.base_url
        out: dict[str, list[tuple[float, float]]] = {"stream": [], "whole_1_token": [], "tokenize": []}
        with httpx.Client(timeout=120) as c:
            model = c.get(f"{base}/v1/models").json()["data"][0]["id"]
            for p in prompts:
                body = {"model": model, "prompt": p, "max_tokens": 8, "ignore_eos": True, "temperature": 0,
                        "stream": True}
                started, times = time.perf_counter(), []
                with c.stream("POST", f"{base}/v1/completions", json=body) as r:
                    for line in r.iter_lines():
                        if line.startswith("data: {"):
                            times.append(time.perf_counter() - started)
                out["stream"].append((times[0], times[-1]))
                started = time.perf_counter()
                c.post(f"{base}/v1/completions", json=body | {"stream": False, "max_tokens": 1, "prompt": p[::-1]})
                took = time.perf_counter() - started
                out["whole_1_token"].append((took, took))
                started = time.perf_counter()
                c.post(f"{base}/tokenize", json={"model": model, "prompt": "hello world"})
                took = time.perf_counter() - started
                out["tokenize"].append((took, took))
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=ms.GPU_SHAPES)
    parser.add_argument("--model", default=None, help="a model directory with its weights, in place of --shape")
    parser.add_argument("--kv-gb", type=float, default=FLAGS["kv_cache_memory_gb"])
    parser.add_argument("--prompt-tokens", type=int, default=300)
    args = parser.parse_args()
    FLAGS["kv_cache_memory_gb"] = args.kv_gb
    if args.model:
        LOAD.clear()
        path = Path(args.model)
        vocab = json.loads((path / "config.json").read_text())["vocab_size"]
    else:
        path = ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))
        vocab = ms.model_config(args.shape).vocab_size
    prompts = _prompts(vocab, REPEATS, args.prompt_tokens)
    layers = {"offline LLM.stream": offline(path, prompts),
              "EngineClient over ZMQ": asyncio.run(_through_client(path, prompts))}
    layers |= {f"HTTP {k}": v for k, v in http(path, prompts).items()}
    for name, runs in layers.items():
        first = statistics.median(r[0] for r in runs[1:]) * 1e3
        last = statistics.median(r[1] for r in runs[1:]) * 1e3
        print(f"{name:28s} first token {first:7.1f} ms   8th token {last:7.1f} ms   (median of {len(runs) - 1}, "
              f"first run {runs[0][0] * 1e3:.0f} ms)", flush=True)


if __name__ == "__main__":
    main()
