"""GPU decode, prefill and startup of infer on real model shapes (random bf16 weights), transformers as the peer.

    python benchmarks/gpu_decode.py [--models llama-3.2-1b,qwen3-1.7b,...] [--out DIR] [--budget-s 450]
    bash scripts/gpu_decode.sh                              # on the lent GPU: this, then decode profiles
    python benchmarks/gpu_decode.py --smoke --out /tmp/gd   # the whole pipeline on CPU with a tiny shape

One run, one report: gpu_decode_<gpu>.{json,md} in DIR (default $OUT, else benchmarks/reports/), rewritten
after every measurement so a timeout still leaves data. In order:
- device copy bandwidth (1 GiB device-to-device copy, read + write bytes / median time) and bf16 GEMM rate;
- time from process start to a ready LLM (a child process, Llama-3.2-1B with CUDA graphs);
- per model shape, with CUDA graphs and without: batch-1 decode tok/s (first to last output of a
  256-token greedy reply to a 128-token prompt, median of 3) against the roofline copy_bw / weight bytes;
  steady-state decode throughput at batch 16/64/256 (every power of two up to 256 for Llama-3.2-1B: each
  graph bucket) against max((weights + KV read) / copy_bw, FLOPs / GEMM rate);
  prefill tok/s of 1k and 8k-token prompts; the graphs' capture time and memory;
- transformers' generate with a static cache (eager: disable_compile) on a random model of the same config,
  decode rate (N-1) / (t(N) - t(1)); if time is left, the auto-compiled variant on Llama-3.2-1B.
Each item that fails records its error and the run goes on; items are skipped once --budget-s is spent.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import model_shapes as ms
from infer import LLM, SamplingParams
from infer.kv.sizing import kv_bytes_per_token

REPORTS = Path(__file__).parent / "reports"
BLOCK_SIZE = 16
SLACK_TOKENS = 64  # batched requests may decode this much beyond the timed steps (early prefills, pipelining)
MODE_NAMES = {True: "graphs", False: "eager", None: "default"}


@dataclass(frozen=True)
class Plan:
    """Every count and size the run uses (recorded in the report)."""

    models: tuple[str, ...] = ms.GPU_SHAPES
    device: str = "cuda"
    dtype: str = "bfloat16"
    graph_modes: tuple[bool | None, ...] = (True, False)
    prompt_len: int = 128
    new_tokens: int = 256
    repeats: int = 3
    batches: tuple[int, ...] = (16, 64, 256)
    sweep_models: tuple[str, ...] = ("llama-3.2-1b",)  # also every power-of-two batch (each graph bucket)
    batch_warm_steps: int = 8
    batch_timed_steps: int = 32
    prefill_lens: tuple[int, ...] = (1024, 8192)
    prefill_repeats: int = 3
    hf_new_tokens: int = 128
    hf_repeats: int = 3
    hf_compiled_models: tuple[str, ...] = ("llama-3.2-1b",)
    ready_model: str = "llama-3.2-1b"
    ready_again: bool = True  # a second startup at the end, with the Triton cache warm
    max_seq_len: int = 8192 + 256
    max_batch_size: int = 256
    copy_mib: int = 1024
    gemm_n: int = 8192
    timing_reps: int = 10
    budget_s: float = 450.0
    model_root: str = "/tmp/infer_bench_models"


SMOKE = dict(
    models=("tiny-llama",), device="cpu", dtype="float32", graph_modes=(None,), prompt_len=16, new_tokens=16,
    repeats=2, batches=(4, 8), sweep_models=("tiny-llama",), batch_warm_steps=2, batch_timed_steps=4,
    prefill_lens=(64, 256), prefill_repeats=2, hf_new_tokens=8, hf_repeats=2, hf_compiled_models=(),
    ready_model="tiny-llama", ready_again=False, max_seq_len=512, max_batch_size=8, copy_mib=64, gemm_n=256,
    timing_reps=3, budget_s=50.0,
)


def torch_dtype(plan: Plan) -> torch.dtype:
    return getattr(torch, plan.dtype)


def batch_context(plan: Plan) -> int:
    """Mean context length of a sequence over the timed steps of a batched decode."""
    return plan.prompt_len + plan.batch_warm_steps + plan.batch_timed_steps // 2


# bookkeeping ------------------------------------------------------------------------------------


@dataclass
class Recorder:
    """The report being built, its output paths and the time budget; saved after every item."""

    plan: Plan
    out: Path
    slug: str
    started: float = field(default_factory=time.perf_counter)
    report: dict[str, Any] = field(default_factory=dict)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return self.plan.budget_s - self.elapsed()

    def log(self, message: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')} +{self.elapsed():6.1f}s] {message}", file=sys.stderr, flush=True)

    def attempt(self, dest: dict, key: str, fn: Callable[[], Any], need_s: float = 0.0) -> Any:
        """dest[key] = fn(), or {"error": ...} / {"skipped": ...}; the report is saved either way."""
        if self.left() < need_s:
            dest[key] = {"skipped": f"time budget: {self.left():.0f} s left, needs ~{need_s:.0f} s"}
            self.log(f"skip {key}: {dest[key]['skipped']}")
        else:
            self.log(f"start {key}")
            try:
                dest[key] = fn()
            except Exception as exc:  # one failing item must not lose the others (nor what it measured so far)
                traceback.print_exc()
                partial = dest.get(key) if isinstance(dest.get(key), dict) else {}
                dest[key] = partial | {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            free_memory()
        self.save()
        return dest[key]

    def save(self) -> None:
        self.report["meta"]["wall_s"] = self.elapsed()
        self.report["summary"] = summarize(self.report)
        self.out.mkdir(parents=True, exist_ok=True)
        stem = self.out / f"gpu_decode_{self.slug}"
        stem.with_suffix(".json").write_text(json.dumps(self.report, indent=1, default=str) + "\n")
        stem.with_suffix(".md").write_text(markdown(self.report))


def free_memory() -> None:
    """Drop unreachable models and return cached blocks to the driver before the next model."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], device: str, reps: int) -> float:
    """Median seconds of fn() (CUDA events on the GPU, perf_counter on the CPU), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


# hardware ---------------------------------------------------------------------------------------


def device_info(plan: Plan) -> dict[str, Any]:
    """GPU name, SMs and memory (or the CPU), plus software versions."""
    import transformers
    import triton

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "triton": triton.__version__, "transformers": transformers.__version__,
                            "cuda": torch.version.cuda, "cpu": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count()}
    if plan.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(plan.device)
        info |= {"gpu": props.name, "sms": props.multi_processor_count, "gpu_memory_bytes": props.total_memory,
                 "capability": f"sm_{props.major}{props.minor}"}
    return info


def gpu_slug(info: dict[str, Any], smoke: bool) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100"; smoke runs -> "smoke"."""
    if smoke or "gpu" not in info:
        return "smoke"
    words = [w for w in re.sub(r"[^a-z0-9]+", " ", info["gpu"].lower()).split() if w not in ("nvidia", "tesla")]
    return words[0] if words else "gpu"


def copy_bandwidth(plan: Plan) -> dict[str, float]:
    """Read + write bytes per second of a large device-to-device copy."""
    dtype = torch_dtype(plan)
    src = torch.randn(plan.copy_mib * 2**20 // dtype.itemsize, dtype=dtype, device=plan.device)
    dst = torch.empty_like(src)
    seconds = time_fn(lambda: dst.copy_(src), plan.device, plan.timing_reps)
    return {"gb_s": 2 * src.numel() * dtype.itemsize / seconds / 1e9, "bytes_copied": src.numel() * dtype.itemsize,
            "median_s": seconds, "reps": plan.timing_reps}


def gemm_rate(plan: Plan) -> dict[str, float]:
    """TFLOP/s of an n x n x n matmul in the run's dtype."""
    n, dtype = plan.gemm_n, torch_dtype(plan)
    a, b = (torch.randn(n, n, dtype=dtype, device=plan.device) for _ in range(2))
    c = torch.empty_like(a)
    seconds = time_fn(lambda: torch.mm(a, b, out=c), plan.device, plan.timing_reps)
    return {"tflops": 2 * n**3 / seconds / 1e12, "n": n, "median_s": seconds, "reps": plan.timing_reps}


# our engine -------------------------------------------------------------------------------------


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)


def prompt_ids(vocab: int, length: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(2, vocab) for _ in range(length)]


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


def decode_once(llm: LLM, ids: list[int], tokens: int) -> float:
    """Decode tok/s of one request: (outputs - 1) over first-to-last output time."""
    request = llm.engine.add_request(ids, greedy(tokens))
    stamps = []
    while llm.engine.has_unfinished():
        for out in step(llm):
            if out.request_id == request.request_id and out.token_id is not None:
                stamps.append(time.perf_counter())
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def decode_batch1(llm: LLM, plan: Plan) -> dict[str, Any]:
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


# transformers -----------------------------------------------------------------------------------


def hf_generate_seconds(model: Any, x: torch.Tensor, tokens: int, compiled: bool, device: str) -> float:
    """Wall seconds of one greedy static-cache generate of exactly `tokens` new tokens."""
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                             cache_implementation="static", disable_compile=not compiled, pad_token_id=0)
    sync(device)
    assert out.shape[1] == x.shape[1] + tokens, out.shape
    return time.perf_counter() - start


def hf_decode(name: str, plan: Plan, compiled: bool) -> dict[str, Any]:
    """transformers' decode tok/s on a random model of the same config: (N-1) / (t(N) - t(1))."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(plan.device):
        model = AutoModelForCausalLM.from_config(ms.hf_config(name), dtype=torch_dtype(plan)).eval()
    x = torch.tensor([prompt_ids(model.config.vocab_size, plan.prompt_len)], device=plan.device)
    n = plan.hf_new_tokens
    start = time.perf_counter()
    hf_generate_seconds(model, x, n if compiled else 8, compiled, plan.device)  # compiled: its static cache's shape
    warmup = time.perf_counter() - start
    rates = []
    for _ in range(plan.hf_repeats):
        first = hf_generate_seconds(model, x, 1, compiled, plan.device)
        rates.append((n - 1) / (hf_generate_seconds(model, x, n, compiled, plan.device) - first))
    return {"tok_s": rates, "median_tok_s": statistics.median(rates), "new_tokens": n, "prompt_len": plan.prompt_len,
            "compiled": compiled, "warmup_s": warmup, "model_class": type(model).__name__,
            "attn_implementation": model.config._attn_implementation, "cache_implementation": "static"}


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


# derived numbers ----------------------------------------------------------------------------------


def _num(d: Any, *keys: str) -> float | None:
    """d[k0][k1]... when every level exists and the leaf is a number, else None."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def batch_bound(name: str, batch: int, context: int, device: dict[str, Any]) -> dict[str, Any] | None:
    """Tokens/s bound of a decode step: max(bytes / copy bandwidth, FLOPs / GEMM rate)."""
    copy, gemm = _num(device, "copy", "gb_s"), _num(device, "gemm", "tflops")
    if copy is None or gemm is None:
        return None
    cfg = ms.model_config(name)
    memory_s = (ms.weight_bytes(cfg) + batch * ms.kv_read_bytes(cfg, context)) / (copy * 1e9)
    compute_s = batch * ms.flops_per_token(cfg, context) / (gemm * 1e12)
    return {"tok_s": batch / max(memory_s, compute_s), "bound_by": "memory" if memory_s >= compute_s else "compute"}


def model_summary(name: str, entry: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """Roofline fractions, graphs ÷ eager per batch, ours ÷ transformers, prefill TFLOP/s."""
    plan, device, runs = report["plan"], report["device"], entry.get("runs", {})
    primary = MODE_NAMES[plan["graph_modes"][0]]
    roofline = _ratio(_num(device, "copy", "gb_s"), entry["weight_bytes"] / 1e9)
    out: dict[str, Any] = {"roofline_tok_s": roofline, "primary_mode": primary, "batches": {}, "prefill": {}}
    for mode in runs:
        out[f"{mode}_fraction_of_roofline"] = _ratio(_num(runs, mode, "batch1", "median_tok_s"), roofline)
    hf = _num(entry, "transformers", "median_tok_s")
    out["ratio_over_transformers"] = _ratio(_num(runs, primary, "batch1", "median_tok_s"), hf)
    out["graphs_over_eager"] = {"1": _ratio(_num(runs, "graphs", "batch1", "median_tok_s"),
                                            _num(runs, "eager", "batch1", "median_tok_s"))}
    for batch in entry["batches"]:
        key = f"batch{batch}"
        bound = batch_bound(name, batch, entry["batch_context"], device)
        fraction = _ratio(_num(runs, primary, key, "tok_s"), bound and bound["tok_s"])
        out["batches"][str(batch)] = (bound or {}) | {"fraction_of_bound": fraction}
        graphs, eager = _num(runs, "graphs", key, "tok_s"), _num(runs, "eager", key, "tok_s")
        out["graphs_over_eager"][str(batch)] = _ratio(graphs, eager)
    gemm = _num(device, "gemm", "tflops")
    for tokens in plan["prefill_lens"]:
        seconds = _num(runs, primary, f"prefill{tokens}", "median_s")
        tflops = _ratio(ms.prefill_flops(ms.model_config(name), tokens) / 1e12, seconds)
        out["prefill"][str(tokens)] = {"tflops": tflops, "fraction_of_gemm": _ratio(tflops, gemm)}
    return out


def _target(goal: str, measured: float | None, met: bool | None, where: str = "") -> dict[str, Any]:
    return {"target": goal, "measured": measured, "met": met, "where": where}


def targets(report: dict[str, Any], summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets next to what this run measured (None where not measured)."""
    rows = []
    for name in ("llama-3.2-1b", "llama-3.1-8b"):
        frac = summaries.get(name, {}).get("graphs_fraction_of_roofline")
        rows.append(_target(f"batch-1 decode >= 85% of roofline ({name}, graphs)", frac,
                            None if frac is None else frac >= 0.85))
    ratio = summaries.get("llama-3.2-1b", {}).get("ratio_over_transformers")
    rows.append(_target(">= 3.5x transformers static-cache generate (llama-3.2-1b, batch 1)", ratio,
                        None if ratio is None else ratio >= 3.5))
    wins = [(v, f"{n} batch {b}") for n, s in summaries.items() for b, v in s["graphs_over_eager"].items()]
    worst = min(((v, where) for v, where in wins if v is not None), default=None)
    rows.append(_target("CUDA graphs a net win at every measured batch (graphs ÷ eager > 1)", worst and worst[0],
                        None if worst is None else worst[0] > 1.0, worst[1] if worst else ""))
    ready = _num(report, "ready", "first", "ready_s")
    rows.append(_target("ready <= 20 s (process start -> LLM built with graphs, llama-3.2-1b)", ready,
                        None if ready is None else ready <= 20.0, report["plan"]["ready_model"]))
    return rows


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    summaries = {name: model_summary(name, entry, report) for name, entry in report.get("models", {}).items()}
    return {"models": summaries, "targets": targets(report, summaries)}


# markdown ---------------------------------------------------------------------------------------


def _f(x: float | None, fmt: str = ".1f") -> str:
    return "—" if x is None else format(x, fmt)


def _status(item: Any) -> str:
    """A short note for an item that did not produce numbers."""
    if isinstance(item, dict) and ("error" in item or "skipped" in item):
        text = " ".join((item.get("error") or item["skipped"]).split())  # one line for the table
        return text if len(text) <= 300 else text[:150] + " … " + text[-150:]
    return ""


def _header(report: dict[str, Any]) -> list[str]:
    hw, dev, plan, meta = report["hardware"], report["device"], report["plan"], report["meta"]
    where = (f"{hw['gpu']} ({hw['capability']}, {hw['sms']} SMs, {hw['gpu_memory_bytes'] / 2**30:.1f} GiB)"
             if "gpu" in hw else f"CPU {hw['cpu']} ({hw['cpu_count']} cores) — smoke run, numbers mean nothing")
    return [
        "# GPU decode: infer vs transformers on real model shapes (random weights)",
        "",
        f"Hardware: {where}. Copy bandwidth {_f(_num(dev, 'copy', 'gb_s'), '.0f')} GB/s "
        f"({plan['copy_mib']} MiB device copy, read + write, median of {plan['timing_reps']}); "
        f"{plan['dtype']} GEMM {plan['gemm_n']}³ {_f(_num(dev, 'gemm', 'tflops'), '.0f')} TFLOP/s. "
        + " ".join(_status(dev.get(k)) for k in ("copy", "gemm")).strip(),
        f"Software: torch {hw['torch']}, triton {hw['triton']}, transformers {hw['transformers']}, "
        f"CUDA {hw['cuda']}, Python {hw['python']}. Run {meta['date']}, {meta['wall_s']:.0f} s.",
        f"Plan: `{json.dumps(plan)}`",
        "",
    ]


def _targets_md(report: dict[str, Any]) -> list[str]:
    lines = ["## Targets (issue 5)", "", "| target | measured | met |", "|---|---:|---|"]
    for t in report["summary"]["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        where = f" ({t['where']})" if t["where"] else ""
        lines.append(f"| {t['target']} | {_f(t['measured'], '.2f')}{where} | {met} |")
    ready = report.get("ready", {})
    lines += ["", "Startup (child process; ready_s from its first line, process_wall_s from the parent):", ""]
    for key, item in ready.items():
        lines.append(f"- {key}: ready {_f(_num(item, 'ready_s'))} s, process wall "
                     f"{_f(_num(item, 'process_wall_s'))} s, LLM.load_seconds {_f(_num(item, 'load_seconds'))} s, "
                     f"Triton cache files before {_num(item, 'triton_cache_files_before')}, "
                     f"graph_stats `{json.dumps(item.get('graph_stats'))}` {_status(item)}")
    return lines + [""]


def _notes(runs: dict[str, Any], modes: list[str], key: str) -> str:
    """Errors or skips of one item across the engine modes."""
    return "; ".join(f"{m}: {_status(runs.get(m, {}).get(key))}" for m in modes if _status(runs.get(m, {}).get(key)))


def _decode_rows(name: str, entry: dict[str, Any], summary: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    runs = entry.get("runs", {})
    modes = [MODE_NAMES[m] for m in plan["graph_modes"]]
    lines = [f"| batch | {' | '.join(f'{m} tok/s' for m in modes)} | graphs ÷ eager | bound tok/s | "
             f"{modes[0]} ÷ bound | notes |", "|---:|" + "---:|" * (len(modes) + 3) + "---|"]
    for batch in (1, *entry["batches"]):
        key, leaf = (("batch1", "median_tok_s") if batch == 1 else (f"batch{batch}", "tok_s"))
        rates = [_f(_num(runs, m, key, leaf)) for m in modes]
        notes = _notes(runs, modes, key)
        if batch == 1:
            bound, fraction, by = summary["roofline_tok_s"], summary.get(f"{modes[0]}_fraction_of_roofline"), "roofline"
        else:
            b = summary["batches"][str(batch)]
            bound, fraction, by = b.get("tok_s"), b.get("fraction_of_bound"), b.get("bound_by", "")
        lines.append(f"| {batch} | {' | '.join(rates)} | {_f(summary['graphs_over_eager'].get(str(batch)), '.2f')} | "
                     f"{_f(bound)} ({by}) | {_f(fraction, '.2f')} | {notes} |")
    return lines


def _model_md(name: str, entry: dict[str, Any], report: dict[str, Any]) -> list[str]:
    plan, summary = report["plan"], report["summary"]["models"][name]
    runs, hf = entry.get("runs", {}), entry.get("transformers", {})
    lines = [f"## {name}", "",
             f"{entry['weight_bytes'] / 1e9:.3f} GB of weights read per batch-1 token; roofline "
             f"{_f(summary['roofline_tok_s'])} tok/s. Decode: {plan['prompt_len']}-token prompt; batch 1 = "
             f"{plan['new_tokens']} new tokens, median of {plan['repeats']}; batch B = {plan['batch_timed_steps']} "
             f"steps after all prefills and {plan['batch_warm_steps']} warm-up steps.", ""]
    lines += _decode_rows(name, entry, summary, plan)
    lines += ["", f"transformers generate (static cache, eager, {plan['hf_new_tokens']} new tokens, median of "
              f"{plan['hf_repeats']}): {_f(_num(hf, 'median_tok_s'))} tok/s; infer ({summary['primary_mode']}) ÷ "
              f"transformers = {_f(summary['ratio_over_transformers'], '.2f')} {_status(hf)}"]
    if "transformers_compiled" in entry:
        tc = entry["transformers_compiled"]
        lines.append(f"transformers generate (static cache, auto-compiled; warm-up incl. compile "
                     f"{_f(_num(tc, 'warmup_s'))} s): {_f(_num(tc, 'median_tok_s'))} tok/s {_status(tc)}")
    modes = list(runs)
    lines += ["", f"| prefill tokens | {' | '.join(f'{m} tok/s' for m in modes)} | {summary['primary_mode']} TFLOP/s | "
              "÷ GEMM rate | notes |", "|---:|" + "---:|" * (len(modes) + 2) + "---|"]
    for tokens in plan["prefill_lens"]:
        key, s = f"prefill{tokens}", summary["prefill"][str(tokens)]
        rates = [_f(_num(runs, m, key, "tok_s"), ".0f") for m in modes]
        lines.append(f"| {tokens} | {' | '.join(rates)} | {_f(s['tflops'])} | {_f(s['fraction_of_gemm'], '.2f')} | "
                     f"{_notes(runs, modes, key)} |")
    lines.append("")
    for mode, run in runs.items():
        config = run.get("engine_config", run.get("engine_options"))
        lines.append(f"- {mode}: EngineConfig `{json.dumps(config, default=str)}` {_status(run)}")
    return lines + [""]


def _graphs_table(report: dict[str, Any]) -> list[str]:
    """Per model and engine mode: construction time and what the CUDA graphs cost (GraphStats)."""
    lines = ["## Construction and CUDA graph overhead", "",
             "| model | mode | LLM.load_seconds | graph batch sizes | capture s | graph memory MiB |",
             "|---|---|---:|---|---:|---:|"]
    for name, entry in report.get("models", {}).items():
        for mode, run in entry.get("runs", {}).items():
            stats = run.get("graph_stats") if isinstance(run.get("graph_stats"), dict) else {}
            memory, sizes = _num(stats, "memory_bytes"), list(stats.get("batch_sizes") or [])
            lines.append(f"| {name} | {mode} | {_f(_num(run, 'load_seconds'))} | {sizes} | "
                         f"{_f(_num(stats, 'capture_seconds'))} | {_f(memory and memory / 2**20, '.0f')} |")
    return lines + [""]


def markdown(report: dict[str, Any]) -> str:
    lines = _header(report) + _targets_md(report) + _graphs_table(report)
    for name, entry in report.get("models", {}).items():
        lines += _model_md(name, entry, report)
    lines.append("Reproduce: `python benchmarks/gpu_decode.py` (or `bash scripts/gpu_decode.sh` on the lent GPU).")
    return "\n".join(lines) + "\n"


# driver -----------------------------------------------------------------------------------------


def bench_model(rec: Recorder, name: str) -> None:
    """Every engine mode, then transformers; each LLM or transformers model is freed before the next."""
    plan = rec.plan
    entry = rec.report["models"][name] = {
        "hf_config": ms.SHAPES[name], "weight_bytes": ms.weight_bytes(ms.model_config(name)),
        "kv_cache_memory_gb": kv_cache_gb(name, plan), "batches": model_batches(name, plan),
        "batch_context": batch_context(plan), "runs": {},
    }
    for graphs in plan.graph_modes:
        run: dict[str, Any] = {}
        entry["runs"][MODE_NAMES[graphs]] = run
        rec.attempt(entry["runs"], MODE_NAMES[graphs], lambda r=run, g=graphs: engine_suite(r, rec, name, g),
                    need_s=20)
    rec.attempt(entry, "transformers", lambda: hf_decode(name, plan, compiled=False), need_s=20)


def parse_args() -> tuple[Plan, Path, bool]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPORTS)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {', '.join(ms.SHAPES)}")
    parser.add_argument("--budget-s", type=float, default=None, help="skip remaining items after this many seconds")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shape, tiny counts (checks the pipeline)")
    args = parser.parse_args()
    overrides: dict[str, Any] = dict(SMOKE) if args.smoke else {}
    if args.models:
        overrides["models"] = tuple(args.models.split(","))
    if args.budget_s is not None:
        overrides["budget_s"] = args.budget_s
    plan = Plan(**overrides)
    unknown = [m for m in plan.models if m not in ms.SHAPES]
    if unknown:
        parser.error(f"unknown model shapes {unknown}; known: {', '.join(ms.SHAPES)}")
    if plan.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA device (or --smoke)")
    return plan, args.out, args.smoke


def main() -> None:
    plan, out, smoke = parse_args()
    torch.manual_seed(0)
    info = device_info(plan)
    rec = Recorder(plan, out, gpu_slug(info, smoke))
    rec.report = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv, "wall_s": 0.0},
                  "hardware": info, "plan": dataclasses.asdict(plan), "device": {}, "ready": {}, "models": {}}
    rec.attempt(rec.report["device"], "copy", lambda: copy_bandwidth(plan))
    rec.attempt(rec.report["device"], "gemm", lambda: gemm_rate(plan))
    rec.attempt(rec.report["ready"], "first", lambda: ready_time(rec), need_s=30)
    for name in plan.models:
        bench_model(rec, name)
    for name in plan.hf_compiled_models:
        if name in rec.report["models"]:
            rec.attempt(rec.report["models"][name], "transformers_compiled", lambda n=name: hf_decode(n, plan, True),
                        need_s=90)
    if plan.ready_again:
        rec.attempt(rec.report["ready"], "again_warm_triton_cache", lambda: ready_time(rec), need_s=30)
    rec.save()
    rec.log(f"wrote {out / f'gpu_decode_{rec.slug}.md'}")
    print(markdown(rec.report))


if __name__ == "__main__":
    main()
