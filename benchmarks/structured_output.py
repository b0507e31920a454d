"""Structured output with the bundled SmolLM2 (CPU, or bf16 + CUDA graphs on a GPU): JSONSchemaBench compile and mask times, generation
under every compilable schema (validated with jsonschema), and throughput at 0/50/100% constrained traffic.

    .venv/bin/python benchmarks/structured_output.py [--max-tokens 256] [--throughput-tokens 64] [--batch 16]

On a GPU, at the Llama-3.2-1B shape with random weights and the SmolLM2 tokenizer (vocabulary 49152,
not Llama's 128256: the masks need a real tokenizer), prepared here and carried to the GPU machine:

    .venv/bin/infer export-tokenizer .bench/llama1b-smollm2
    .venv/bin/python -c "import json, sys; sys.path.insert(0, 'benchmarks'); from model_shapes import LLAMA_3_2_1B; \
      json.dump(LLAMA_3_2_1B | {'vocab_size': 49152, 'bos_token_id': 1, 'eos_token_id': 2}, \
      open('.bench/llama1b-smollm2/config.json', 'w'))"
    python3 benchmarks/structured_output.py --model .bench/llama1b-smollm2 --load-format dummy --batch 64 --kv-cache-memory-gb 8

and the same at the Llama-3.1-8B shape (LLAMA_3_1_8B, into .bench/llama8b-smollm2), where the GPU, not the host, bounds a step.

Writes benchmarks/reports/structured_output_cpu.{json,md}, or structured_output_gpu_<model dir>.{json,md}
with --model (OUT_DIR=... writes there instead).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import NamedTuple

import jsonschema
import llguidance
import llguidance.torch
import torch

import infer.structured.masks as masks
from infer import LLM, SamplingParams
from infer.families.chat_template import ChatTemplateError
from infer.structured import Constraint, ConstraintError

REPORTS = Path(__file__).parent / "reports"
SCHEMAS = sorted((Path(__file__).parents[1] / "tests" / "fixtures" / "jsonschema").glob("*.json"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class MaskTimer:
    """Times the engine's mask fills: a step's parallel fill ÷ its constrained rows, once per row."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._fill_par = llguidance.torch.fill_next_token_bitmask_par

    def __enter__(self) -> "MaskTimer":
        def timed_par(executor, rows, bitmask):
            started = time.perf_counter()
            self._fill_par(executor, rows, bitmask)
            self.seconds += [(time.perf_counter() - started) / len(rows)] * len(rows)

        masks.llguidance.torch.fill_next_token_bitmask_par = timed_par
        return self

    def __exit__(self, *exc: object) -> None:
        masks.llguidance.torch.fill_next_token_bitmask_par = self._fill_par


class MixRun(NamedTuple):
    decode_tok_s: float
    end_to_end_tok_s: float
    tokens_per_request: float


def run_mix(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> MixRun:
    """Drive the engine directly so the decode phase (every request has its first token) is timed on its own."""
    engine = llm.engine
    for prompt, p in zip(prompts, params):
        engine.add_request(prompt, p)
    started, decoding_since, seen, total, decoded = time.perf_counter(), None, set(), 0, 0
    while engine.has_unfinished():
        for out in engine.step():
            if out.token_id is not None:
                total += 1
                decoded += decoding_since is not None
                seen.add(out.request_id)
        if decoding_since is None and len(seen) == len(prompts):
            decoding_since = time.perf_counter()
    ended = time.perf_counter()
    return MixRun(decoded / (ended - decoding_since), total / (ended - started), total / len(prompts))


def prompt_for(llm: LLM, schema: dict) -> list[int]:
    text = f"Reply with one JSON value valid under this schema: {json.dumps(schema)[:1500]}"
    try:
        return llm.encode_chat([{"role": "user", "content": text}])
    except ChatTemplateError:  # a random-weight model at a real shape has no chat template
        return llm.encode(text)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-tokens", type=int, default=256, help="budget per schema-following generation")
    parser.add_argument("--throughput-tokens", type=int, default=64, help="tokens per request in the mix runs")
    parser.add_argument("--batch", type=int, default=16, help="requests per mix run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per share, interleaved; the median is reported")
    parser.add_argument("--model", default=None, help="model directory or GGUF; default: the bundled SmolLM2")
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"], help="dummy: random weights")
    parser.add_argument("--kv-cache-memory-gb", type=float, default=None, help="KV cache size (default: the engine's)")
    args = parser.parse_args()
    kv = {"kv_cache_memory_gb": args.kv_cache_memory_gb} if args.kv_cache_memory_gb else {}
    llm = LLM(args.model, load_format=args.load_format, max_batch_size=max(32, args.batch), **kv)
    model_name = llm.path.name if args.model is None else f"{llm.path.name} ({args.load_format} weights)"
    device = "gpu" if llm.config.resolved_device.startswith("cuda") else "cpu"
    hardware = torch.cuda.get_device_name() if device == "gpu" else (platform.processor() or platform.machine())
    compiler = llm.engine.grammars
    compiler.ll_tokenizer  # built once per model; not part of any compile time below

    compiled, refused, compile_s = [], {}, []
    for path in SCHEMAS:
        schema = json.loads(path.read_text())["schema"]
        started = time.perf_counter()
        try:
            compiler.compile(Constraint.json_schema(schema))
            compiled.append((path.stem, schema))
        except ConstraintError as exc:
            refused[path.stem] = str(exc).splitlines()[0][:200]
        compile_s.append(time.perf_counter() - started)

    prompts = [prompt_for(llm, schema) for _, schema in compiled]
    params = [SamplingParams(temperature=0, max_tokens=args.max_tokens, structured=Constraint.json_schema(schema))
              for _, schema in compiled]
    with MaskTimer() as timer:
        started = time.perf_counter()
        outs = llm.generate_ids(prompts, params)
        generation_s = time.perf_counter() - started
    results = {}
    for (name, schema), out in zip(compiled, outs):
        valid = None
        if out.finish_reason == "stop":
            try:
                jsonschema.validate(json.loads(out.text), schema)
                valid = True
            except (ValueError, jsonschema.ValidationError):
                valid = False
        results[name] = {"finish_reason": out.finish_reason, "tokens": len(out.token_ids), "valid": valid}
    stopped = [r for r in results.values() if r["finish_reason"] == "stop"]

    mix_prompts = (prompts * (args.batch // len(prompts) + 1))[: args.batch]
    mix_schemas = ([schema for _, schema in compiled] * (args.batch // len(compiled) + 1))[: args.batch]
    runs: dict[str, list[MixRun]] = {"0%": [], "50%": [], "100%": []}
    llm.generate_ids(mix_prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    for _ in range(args.repeats):
        for share in (0.0, 0.5, 1.0):
            constrained = int(share * len(mix_prompts))
            mix = [SamplingParams(temperature=0, max_tokens=args.throughput_tokens, ignore_eos=True,
                                  structured=Constraint.json_schema(s) if i < constrained else None)
                   for i, s in enumerate(mix_schemas)]
            runs[f"{int(share * 100)}%"].append(run_mix(llm, mix_prompts, mix))
    throughput = {share: MixRun(*(statistics.median(values) for values in zip(*r))) for share, r in runs.items()}
    base = throughput["0%"]

    report = {
        "benchmark": f"structured_output_{device}",
        "schemas": len(SCHEMAS), "compiled": len(compiled), "refused": refused,
        "compile_ms_p50": statistics.median(compile_s) * 1e3, "compile_ms_p99": percentile(compile_s, 0.99) * 1e3,
        "mask_us_p50": statistics.median(timer.seconds) * 1e6, "mask_us_p99": percentile(timer.seconds, 0.99) * 1e6,
        "masks_timed": len(timer.seconds),
        "generation_seconds": generation_s, "stop_share": len(stopped) / len(results),
        "stop_valid_share": sum(bool(r["valid"]) for r in stopped) / max(len(stopped), 1),
        "per_schema": results,
        "throughput": {k: v._asdict() for k, v in throughput.items()},
        "decode_vs_unconstrained": {k: v.decode_tok_s / base.decode_tok_s for k, v in throughput.items()},
        "hardware": {"device": hardware, "threads": torch.get_num_threads()},
        "software": {"python": platform.python_version(), "torch": torch.__version__,
                     "llguidance": llguidance.__version__},
        "engine_config": llm.config.as_dict(),
    }
    out_dir = Path(os.environ.get("OUT_DIR", REPORTS))
    out_dir.mkdir(exist_ok=True)
    name = f"structured_output_{device}" if args.model is None else f"structured_output_{device}_{llm.path.name}"
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    md = [
        f"# Structured output, {device.upper()} — {model_name}, JSONSchemaBench (100 schemas)",
        "",
        f"Hardware: {hardware}, {report['hardware']['threads']} CPU threads. Software: torch "
        f"{torch.__version__}, llguidance {llguidance.__version__}. Greedy, JSON compact (whitespace bounded). "
        f"EngineConfig: `{json.dumps(llm.config.as_dict(), default=str)}`",
        "",
        "| measure | value |",
        "|---|---:|",
        f"| schemas compiled / refused (400 with llguidance's reason) | {len(compiled)} / {len(refused)} |",
        f"| grammar compile p50 / p99 (ms) | {report['compile_ms_p50']:.2f} / {report['compile_ms_p99']:.2f} |",
        f"| mask per token p50 / p99 (µs), {len(timer.seconds)} masks | {report['mask_us_p50']:.1f} / "
        f"{report['mask_us_p99']:.1f} |",
        f"| generations that finished with `stop` (the rest hit {args.max_tokens} tokens) | "
        f"{report['stop_share']:.0%} |",
        f"| `stop` outputs valid under their schema (jsonschema) | {report['stop_valid_share']:.0%} |",
        "",
        f"Throughput, {args.batch} requests x up to {args.throughput_tokens} tokens (EOS ignored; a grammar that ends "
        f"ends its request), median of {args.repeats} interleaved runs, same process. Decode: from the step at which every "
        "request has its first token to the end (the masks' cost; the batch thins as constrained requests end, which "
        "counts against them); end to end: prefill included, over fewer tokens when requests end early.",
        "",
        "| constrained share | decode tok/s | ÷ unconstrained | end-to-end tok/s | tokens per request |",
        "|---|---:|---:|---:|---:|",
        *[f"| {k} | {v.decode_tok_s:.1f} | {v.decode_tok_s / base.decode_tok_s:.2f} | {v.end_to_end_tok_s:.1f} | "
          f"{v.tokens_per_request:.1f} |" for k, v in throughput.items()],
        "",
        "Refused schemas: " + "; ".join(f"`{k}`: {v}" for k, v in refused.items()),
        "",
        f"Reproduce: `python benchmarks/structured_output.py {' '.join(sys.argv[1:])}` (GPU: `bash scripts/gpu_structured.sh`)",
    ]
    (out_dir / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
