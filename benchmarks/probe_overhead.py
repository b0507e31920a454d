"""What probes cost: decode with 16 probes at each of 4 layers (scores read back every token) vs no probes.

    python benchmarks/probe_overhead.py                # CUDA: the Llama-3.2-1B shape, random bf16 weights, graphs on
    python benchmarks/probe_overhead.py --device cpu   # the bundled SmolLM2, float32 on the CPU

Both engines are resident at once and their timed runs interleave (A B A B ...); medians are reported.
Batch 1: inter-token latency (ITL) of one request. Batch 64 (CUDA): steady-state decode tokens/s. The probe
roofline: the bytes probes add per step (weights + scores) over the bytes a decode step reads anyway.
Report: benchmarks/reports/probe_overhead_{gpu model, e.g. h100, or cpu}.{json,md} (OUT_DIR overrides the folder).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import model_shapes as ms
from infer import LLM, SamplingParams
from device_rates import host_loop_ms
from probe_sets import Spec, write_probe_set

PROBES_PER_LAYER, PROBED_LAYERS = 16, 4


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def probe_file(folder: Path, hidden: int, layers: int) -> Path:
    """16 probes (one bank) at each of 4 evenly spread layers."""
    chosen = [round((i + 1) * layers / (PROBED_LAYERS + 1)) for i in range(PROBED_LAYERS)]
    specs = [Spec(f"L{layer}", layer, "sigmoid", count=PROBES_PER_LAYER) for layer in chosen]
    return write_probe_set(folder, hidden, specs, scale=0.01)


def itl_ms(llm: LLM, prompt: list[int], tokens: int, probes: bool, device: str) -> float:
    """Median inter-token latency of one request, ms."""
    params = SamplingParams(temperature=0, max_tokens=tokens, ignore_eos=True, probes=True if probes else None)
    request = llm.engine.add_request(prompt, params)
    stamps = []
    while llm.engine.has_unfinished():
        for out in llm.engine.step():
            assert out.error is None, out.error
            if out.request_id == request.request_id and out.token_id is not None:
                assert (out.probes is not None) == probes
                stamps.append(time.perf_counter())
    sync(device)
    return 1e3 * statistics.median(b - a for a, b in zip(stamps, stamps[1:]))


def readout_ms(llm: LLM, hidden: int, repeats: int = 2000) -> float:
    """The probed layers' read-outs of one decode row, timed alone (ms per token): on a noisy CPU the ITL
    medians cannot resolve a cost this small, so the report states it directly."""
    taps = llm.engine.runner.probes.taps()
    x = torch.randn(1, hidden)
    with torch.inference_mode():
        started = time.perf_counter()
        for _ in range(repeats):
            for tap in taps.values():
                tap(x)
    return 1e3 * (time.perf_counter() - started) / repeats


class GcPauses:
    """Seconds the cyclic garbage collector ran inside the block (through gc.callbacks)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._started = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> GcPauses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def batched_tok_s(llm: LLM, prompt: list[int], batch: int, steps: int, probes: bool, device: str,
                  stats: list[list[float]] | None = None) -> float:
    """Decode tokens/s of `batch` requests after every prefill has run; appends the run's garbage-collector
    seconds and its median and slowest step in ms to `stats`."""
    params = SamplingParams(temperature=0, max_tokens=steps + 16, ignore_eos=True, probes=True if probes else None)
    requests = [llm.engine.add_request(prompt, params) for _ in range(batch)]
    while any(not r.output_token_ids for r in requests):
        llm.engine.step()
    for _ in range(4):
        llm.engine.step()
    sync(device)
    produced, laps, started = 0, [], time.perf_counter()
    lap = started
    with GcPauses() as collector:
        for _ in range(steps):
            produced += sum(o.token_id is not None for o in llm.engine.step())
            now = time.perf_counter()
            laps.append(now - lap)
            lap = now
    seconds = time.perf_counter() - started
    if stats is not None:
        stats.append([collector.seconds, 1e3 * statistics.median(laps), 1e3 * max(laps)])
    for r in requests:
        llm.engine.abort(r.request_id)
    while llm.engine.has_unfinished():
        llm.engine.step()
    return produced / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cuda", "cpu"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=None, help="tokens per batch-1 run (default 256 CUDA, 48 CPU)")
    args = ap.parse_args()
    cuda = args.device == "cuda"
    tokens = args.tokens or (256 if cuda else 48)
    work = Path(tempfile.mkdtemp())
    if cuda:
        model, options = str(ms.write_model_dir("llama-3.2-1b", work)), dict(load_format="dummy", max_seq_len=1024,
                                                                                max_batch_size=64, kv_cache_memory_gb=8)
        cfg = ms.model_config("llama-3.2-1b")
    else:
        model, options = None, dict(max_seq_len=512, max_batch_size=4)
        cfg = None
    base = LLM(model, **options)
    cfg = cfg or base.model_config
    probed = LLM(model, probes=str(probe_file(work, cfg.hidden_size, cfg.num_hidden_layers)), **options)
    prompt = [(7 * i + 3) % cfg.vocab_size for i in range(128 if cuda else 32)]
    runs: dict[str, list[float]] = {"itl_base": [], "itl_probes": [], "itl_loaded_unasked": []}
    if cuda:
        runs |= {"b64_base": [], "b64_probes": [], "b64_base_stats": [], "b64_probes_stats": []}
    for llm in (base, probed):  # warm-up: kernels compile, graphs replay once
        itl_ms(llm, prompt, 16, llm is probed, args.device)
    for _ in range(args.repeats):
        runs["itl_base"].append(itl_ms(base, prompt, tokens, False, args.device))
        runs["itl_probes"].append(itl_ms(probed, prompt, tokens, True, args.device))
        runs["itl_loaded_unasked"].append(itl_ms(probed, prompt, tokens, False, args.device))
        if cuda:
            runs["b64_base"].append(batched_tok_s(base, prompt, 64, 128, False, args.device, runs["b64_base_stats"]))
            runs["b64_probes"].append(batched_tok_s(probed, prompt, 64, 128, True, args.device,
                                                    runs["b64_probes_stats"]))
    med = {k: statistics.median(v) for k, v in runs.items() if not k.endswith("_stats")}
    readout = None if cuda else readout_ms(probed, cfg.hidden_size)
    probe_bytes = PROBED_LAYERS * cfg.hidden_size * 16 * 4  # float32 weights, capacity 16 per layer
    result = {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or platform.machine(),
        "torch": torch.__version__, "model": "llama-3.2-1b (random bf16)" if cuda else "bundled SmolLM2-135M (fp32)",
        "probes": f"{PROBES_PER_LAYER} x {PROBED_LAYERS} layers", "engine_options": options, "tokens": tokens,
        "host_loop_ms": host_loop_ms(),
        "repeats": args.repeats, "runs": runs, "median": med,
        "command": " ".join(["python benchmarks/probe_overhead.py", *sys.argv[1:]]),
        "itl_overhead": med["itl_probes"] / med["itl_base"] - 1,
        "itl_overhead_loaded_unasked": med["itl_loaded_unasked"] / med["itl_base"] - 1,
        "probe_bytes_per_step": probe_bytes,
        "readout_ms_per_token": readout,
        "roofline_overhead": probe_bytes / ms.weight_bytes(cfg, 2 if cuda else 4),
    }
    if cuda:
        result["b64_throughput_loss"] = 1 - med["b64_probes"] / med["b64_base"]
    write(result, gpu_tag(torch.cuda.get_device_name()) if cuda else "cpu")


def gpu_tag(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'h100' (the model number; the last word if there is none)."""
    found = re.search(r"\b([A-Z]\d{1,3}[A-Z]?)\b", name)
    return (found.group(1) if found else name.split()[-1]).lower()


def write(r: dict, tag: str) -> None:
    folder = Path(os.environ.get("OUT_DIR") or Path(__file__).parent / "reports")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"probe_overhead_{tag}.json").write_text(json.dumps(r, indent=2))
    m = r["median"]
    lines = [f"# Probe overhead, {r['device']}", "",
             f"{r['model']}, {r['probes']} (scores read back every token), torch {r['torch']}, "
             f"medians of {r['repeats']} interleaved runs of {r['tokens']} tokens: `{r['command']}`; host speed "
             f"{r['host_loop_ms']:.0f} ms for 2M dict stores in Python (`device_rates.host_loop_ms`)", "",
             "| measure | no probes | probes | overhead |", "|---|---|---|---|",
             f"| batch-1 ITL (ms) | {m['itl_base']:.3f} | {m['itl_probes']:.3f} | {100 * r['itl_overhead']:+.2f}% |",
             f"| batch-1 ITL, probes loaded, not asked (ms) | {m['itl_base']:.3f} | {m['itl_loaded_unasked']:.3f} | "
             f"{100 * r['itl_overhead_loaded_unasked']:+.2f}% |"]
    if "b64_base" in m:
        lines.append(f"| batch-64 decode (tok/s) | {m['b64_base']:.0f} | {m['b64_probes']:.0f} | "
                     f"{-100 * r['b64_throughput_loss']:+.2f}% |")
        lines += ["", "Batch-64 runs in run order, with the time the garbage collector ran in each and the run's "
                      "median and slowest step (spread: fastest ÷ slowest - 1):", ""]
        for key, label in (("b64_base", "no probes"), ("b64_probes", "probes")):
            runs = r["runs"][key]
            lines.append(f"- {label}: " + ", ".join(f"{x:.0f} tok/s (GC {1e3 * g:.0f} ms, steps {p50:.2f}/{top:.2f} ms)"
                                                    for x, (g, p50, top) in zip(runs, r["runs"][f"{key}_stats"]))
                         + f"; spread {100 * (max(runs) / min(runs) - 1):.1f}%")
    if r.get("readout_ms_per_token") is not None:
        lines += ["", f"The {r['probes']} read-outs of one decode row, timed alone: {r['readout_ms_per_token']:.3f} ms per "
                      f"token, {100 * r['readout_ms_per_token'] / m['itl_base']:.2f}% of the ITL (the ITL medians above "
                      f"vary by more than that between runs on this machine)."]
    lines += ["", f"Probe roofline: {r['probe_bytes_per_step'] / 1e6:.2f} MB of probe weights per step over the weights a "
                  f"decode step reads: {100 * r['roofline_overhead']:.3f}% — what the probes would cost if memory-bound.", ""]
    (folder / f"probe_overhead_{tag}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
