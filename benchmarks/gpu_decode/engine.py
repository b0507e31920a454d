"""Our engine: batch-1 and batched decode, prefill, and startup time in a child process."""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import model_shapes as ms
from gpu_decode.plan import BLOCK_SIZE, SLACK_TOKENS, Plan, batch_context, prompt_ids, sync, torch_dtype
from gpu_decode.recorder import Recorder
from infer import LLM, SamplingParams
from infer.kv.sizing import kv_bytes_per_token


def greedy(tokens: int) -> SamplingParams:
    """Greedy sampling of exactly `tokens` tokens (EOS ignored)."""
    return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)


def kv_cache_gb(name: str, plan: Plan) -> float:
    """KV memory for max_batch_size sequences of the batched run, or one max_seq_len prompt, plus 10%."""
    per_seq = plan.prompt_len + plan.batch_warm_steps + plan.batch_timed_steps + SLACK_TOKENS
    blocks = max(plan.max_batch_size * -(-per_seq // BLOCK_SIZE), -(-plan.max_seq_len // BLOCK_SIZE) + 1)
    return 1.1 * blocks * BLOCK_SIZE * kv_bytes_per_token(ms.model_config(name), torch_dtype(plan)) / 2**30


def model_batches(name: str, plan: Plan) -> tuple[int, ...]:
    """The batch sizes measured above 1: plan.batches, plus every power of two for the sweep models."""
    sweep = {1 << i for i in range(1, plan.max_batch_size.bit_length())} if name in plan.sweep_models else set()
    return tuple(sorted({*plan.batches, *sweep} - {1}))


def engine_options(name: str, graphs: bool | None, plan: Plan) -> dict[str, Any]:
    """LLM keyword arguments for one model shape and graph mode (random weights)."""
    return dict(load_format="dummy", dtype=plan.dtype, device=plan.device, use_cuda_graphs=graphs,
                max_batch_size=plan.max_batch_size, max_seq_len=plan.max_seq_len,
                kv_cache_memory_gb=kv_cache_gb(name, plan), block_size=BLOCK_SIZE)


def graph_stats(llm: LLM) -> dict[str, Any] | None:
    """The runner's CUDA-graph stats (batch sizes, capture seconds, memory bytes), None without graphs."""
    stats = getattr(llm.runner, "graph_stats", None)
    if stats is None:
        return None
    return dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else {"repr": repr(stats)}


def step(llm: LLM) -> list:
    """One engine step; a failed request fails the measurement."""
    outs = llm.engine.step()
    errors = [o.error for o in outs if o.error]
    if errors:
        raise RuntimeError(f"engine step failed: {errors[0]}")
    return outs


def abort_all(llm: LLM, requests: list) -> None:
    """End the requests now instead of decoding to max_tokens; their blocks are freed at the next step."""
    for request in requests:
        llm.engine.abort(request.request_id)
    while llm.engine.has_unfinished():
        step(llm)


def decode_once(llm: LLM, ids: list[int], tokens: int, lora: str | None = None) -> float:
    """Decode tok/s of one request (on LoRA adapter `lora`): (outputs - 1) over first-to-last output time."""
    request = llm.engine.add_request(ids, dataclasses.replace(greedy(tokens), lora=lora))
    stamps = []
    while llm.engine.has_unfinished():
        for out in step(llm):
            if out.request_id == request.request_id and out.token_id is not None:
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def decode_batch1(llm: LLM, plan: Plan) -> dict[str, Any]:
    """Batch-1 decode tok/s, median of plan.repeats after a warm-up."""
    ids = prompt_ids(llm.runner.vocab_size, plan.prompt_len)
    decode_once(llm, ids, 16)  # warm-up
    rates = [decode_once(llm, ids, plan.new_tokens) for _ in range(plan.repeats)]
    return {"tok_s": rates, "median_tok_s": statistics.median(rates), "prompt_len": plan.prompt_len,
            "new_tokens": plan.new_tokens}


def decode_batched(llm: LLM, batch: int, plan: Plan) -> dict[str, Any]:
    """Steady-state decode tokens/s of `batch` equal requests, timed after every prefill has run."""
    ids = prompt_ids(llm.runner.vocab_size, plan.prompt_len, seed=batch)
    tokens = plan.batch_warm_steps + plan.batch_timed_steps + SLACK_TOKENS
    requests = [llm.engine.add_request(ids, greedy(tokens)) for _ in range(batch)]
    while any(not r.output_token_ids for r in requests):
        step(llm)
    for _ in range(plan.batch_warm_steps):
        step(llm)
    sync(plan.device)
    produced, start = 0, time.perf_counter()
    for _ in range(plan.batch_timed_steps):
        produced += sum(o.token_id is not None for o in step(llm))
    seconds = time.perf_counter() - start
    abort_all(llm, requests)
    return {"tok_s": produced / seconds, "step_ms": 1e3 * seconds / plan.batch_timed_steps,
            "tokens": produced, "steps": plan.batch_timed_steps, "batch": batch,
            "context_mean": batch_context(plan)}


def prefill_once(llm: LLM, ids: list[int], device: str) -> float:
    """Seconds from adding a request to its single sampled token."""
    start = time.perf_counter()
    llm.engine.add_request(ids, greedy(1))
    while llm.engine.has_unfinished():
        step(llm)
    sync(device)
    return time.perf_counter() - start


def prefill(llm: LLM, tokens: int, plan: Plan) -> dict[str, Any]:
    """Prefill tok/s of one `tokens`-long prompt, median of plan.prefill_repeats after a warm-up."""
    ids = prompt_ids(llm.runner.vocab_size, tokens, seed=tokens)
    prefill_once(llm, ids, plan.device)  # warm-up (kernel autotuning)
    seconds = [prefill_once(llm, ids, plan.device) for _ in range(plan.prefill_repeats)]
    median = statistics.median(seconds)
    return {"tokens": tokens, "seconds": seconds, "median_s": median, "tok_s": tokens / median}


def guarded(llm: LLM, fn: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """fn, but a failure first fails every request left in the engine so the next item starts clean."""

    def run() -> dict[str, Any]:
        try:
            return fn()
        except Exception:
            llm.engine.fail_all("benchmark item failed")
            raise

    return run


def engine_suite(run: dict[str, Any], rec: Recorder, name: str, graphs: bool | None) -> dict[str, Any]:
    """Build one LLM and measure batch 1, the batches and prefill; fills `run` as it goes."""
    plan = rec.plan
    run["engine_options"] = engine_options(name, graphs, plan)
    llm = LLM(str(ms.write_model_dir(name, Path(plan.model_root))), **run["engine_options"])
    run |= {"load_seconds": llm.load_seconds, "graph_stats": graph_stats(llm), "engine_config": llm.config.as_dict()}
    if plan.device.startswith("cuda"):
        run["gpu_memory_allocated_bytes"] = torch.cuda.memory_allocated(plan.device)
    rec.save()
    rec.attempt(run, "batch1", guarded(llm, lambda: decode_batch1(llm, plan)), need_s=10)
    for batch in model_batches(name, plan):
        rec.attempt(run, f"batch{batch}", guarded(llm, lambda b=batch: decode_batched(llm, b, plan)), need_s=10)
    for tokens in plan.prefill_lens:  # prefill never replays graphs: both modes should agree
        rec.attempt(run, f"prefill{tokens}", guarded(llm, lambda t=tokens: prefill(llm, t, plan)), need_s=10)
    return run


# startup ----------------------------------------------------------------------------------------

READY_CHILD = """
import time
t0 = time.perf_counter()
import dataclasses, json, sys
from infer import LLM
llm = LLM(sys.argv[1], **json.loads(sys.argv[2]))
ready = time.perf_counter() - t0
stats = getattr(llm.runner, "graph_stats", None)
stats = dataclasses.asdict(stats) if dataclasses.is_dataclass(stats) else stats
print("READY " + json.dumps({"ready_s": ready, "load_seconds": llm.load_seconds, "graph_stats": stats}))
"""


def triton_cache_files() -> int:
    """Files in Triton's kernel cache: 0 means this startup compiles every kernel."""
    root = Path(os.environ.get("TRITON_CACHE_DIR", Path.home() / ".triton" / "cache"))
    return sum(1 for p in root.rglob("*") if p.is_file()) if root.exists() else 0


def ready_time(rec: Recorder) -> dict[str, Any]:
    """A fresh process builds the LLM (graphs on where CUDA); its own start-to-ready time and the parent's wall."""
    plan = rec.plan
    graphs = True if plan.device.startswith("cuda") else None
    options = engine_options(plan.ready_model, graphs, plan)
    path = ms.write_model_dir(plan.ready_model, Path(plan.model_root))
    cache_files = triton_cache_files()
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", READY_CHILD, str(path), json.dumps(options)], capture_output=True,
                          text=True, timeout=max(30.0, rec.left()))
    wall = time.perf_counter() - start
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("READY ")), None)
    if line is None:
        raise RuntimeError(f"child exited {proc.returncode}: {proc.stderr[-1500:]}")
    return json.loads(line[6:]) | {"process_wall_s": wall, "model": plan.ready_model, "engine_options": options,
                                   "triton_cache_files_before": cache_files}
