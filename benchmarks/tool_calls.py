"""Forced tool calls against structured output, and the sampling fields against none: decode throughput of one batch,
in one process, interleaved runs, medians.

Rows: free text; the tool's schema as a json_schema constraint (what response_format does); a forced call to that
tool (the grammar tool_choice "required" builds: markup, name, then the schema embedded with %json); free text
with presence / frequency penalties, a logit_bias and min_tokens on every row.

    .venv/bin/python benchmarks/tool_calls.py [--batch 16] [--tokens 64] [--repeats 3]
    python3 benchmarks/tool_calls.py --model .bench/llama1b-smollm2 --load-format dummy --batch 64   # GPU (see structured_output.py)

Writes benchmarks/reports/tool_calls_<cpu|gpu>[_<model dir>].{json,md} (OUT_DIR=... writes there instead).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
from pathlib import Path

import llguidance
import torch

from infer import LLM, SamplingParams
from infer.server.tools.formats import HermesFormat
from infer.server.tools.grammar import tool_grammar
from infer.server.tools.request import FunctionTool, ToolRequest
from infer.structured import Constraint
from structured_output import MaskTimer, MixRun, run_mix

REPORTS = Path(__file__).parent / "reports"
SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 24}, "unit": {"enum": ["celsius", "fahrenheit"]},
    "days": {"type": "integer", "minimum": 1, "maximum": 14},
    "hours": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 23}, "maxItems": 4}},
    "required": ["city", "unit", "days"], "additionalProperties": False}
PROMPT = "What will the weather be in Paris over the next three days? Answer with the forecast tool's arguments as JSON."


def mixes(tokens: int, vocab: int) -> dict[str, SamplingParams]:
    tool = ToolRequest((FunctionTool("get_forecast", SCHEMA),), "required", parallel=False)
    base = dict(temperature=0, max_tokens=tokens, ignore_eos=True)
    return {
        "free text": SamplingParams(**base),
        "json_schema": SamplingParams(**base, structured=Constraint.json_schema(SCHEMA)),
        "forced tool call": SamplingParams(**base, structured=Constraint("grammar", tool_grammar(HermesFormat(), tool, False))),
        "penalties + logit_bias + min_tokens": SamplingParams(
            **base, presence_penalty=0.5, frequency_penalty=0.3, logit_bias={i: -5.0 for i in range(0, vocab, vocab // 50)},
            min_tokens=tokens // 2),
    }


def _mask(us: float | None) -> str:
    return "—" if us is None else f"{us:.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request (EOS ignored; a grammar that ends ends it)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model", default=None, help="model directory or GGUF; default: the bundled SmolLM2")
    parser.add_argument("--load-format", default="auto", choices=["auto", "dummy"])
    parser.add_argument("--kv-cache-memory-gb", type=float, default=None)
    args = parser.parse_args()
    kv = {"kv_cache_memory_gb": args.kv_cache_memory_gb} if args.kv_cache_memory_gb else {}
    llm = LLM(args.model, load_format=args.load_format, max_batch_size=max(32, args.batch), **kv)
    device = "gpu" if llm.config.resolved_device.startswith("cuda") else "cpu"
    hardware = torch.cuda.get_device_name() if device == "gpu" else (platform.processor() or platform.machine())
    prompts = [llm.encode(f"{PROMPT} (request {i})") for i in range(args.batch)]
    params = mixes(args.tokens, llm.engine.runner.vocab_size)
    for p in params.values():
        if p.structured is not None:
            llm.engine.grammars.compile(p.structured)
    llm.generate_ids(prompts[:2], SamplingParams(temperature=0, max_tokens=4))  # warm-up
    runs: dict[str, list[MixRun]] = {name: [] for name in params}
    masks: dict[str, list[float]] = {name: [] for name in params}
    for _ in range(args.repeats):
        for name, p in params.items():
            with MaskTimer() as timer:
                runs[name].append(run_mix(llm, prompts, [p] * len(prompts)))
            masks[name] += timer.seconds
    medians = {name: MixRun(*(statistics.median(v) for v in zip(*r))) for name, r in runs.items()}
    base = medians["free text"].decode_tok_s
    report = {
        "benchmark": f"tool_calls_{device}",
        "throughput": {k: v._asdict() for k, v in medians.items()},
        "decode_vs_free_text": {k: v.decode_tok_s / base for k, v in medians.items()},
        "mask_us_p50": {k: statistics.median(v) * 1e6 for k, v in masks.items() if v},
        "hardware": {"device": hardware, "threads": torch.get_num_threads()},
        "software": {"python": platform.python_version(), "torch": torch.__version__, "llguidance": llguidance.__version__},
        "engine_config": llm.config.as_dict(),
        "args": vars(args),
    }
    out_dir = Path(os.environ.get("OUT_DIR", REPORTS))
    out_dir.mkdir(exist_ok=True)
    name = f"tool_calls_{device}" if args.model is None else f"tool_calls_{device}_{llm.path.name}"
    (out_dir / f"{name}.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    md = [
        f"# Forced tool calls and sampling fields, {device.upper()} — {llm.path.name}",
        "",
        f"Hardware: {hardware}, {report['hardware']['threads']} CPU threads. Software: torch {torch.__version__}, "
        f"llguidance {llguidance.__version__}. {args.batch} requests x up to {args.tokens} tokens, greedy, median of "
        f"{args.repeats} interleaved runs in one process. Decode: from the step at which every request has its first "
        f"token (a constrained request ends when its grammar does, which counts against it). "
        f"EngineConfig: `{json.dumps(llm.config.as_dict(), default=str)}`",
        "",
        "| rows | decode tok/s | ÷ free text | end-to-end tok/s | tokens per request | mask p50 (µs) |",
        "|---|---:|---:|---:|---:|---:|",
        *[f"| {k} | {v.decode_tok_s:.1f} | {v.decode_tok_s / base:.2f} | {v.end_to_end_tok_s:.1f} | "
          f"{v.tokens_per_request:.1f} | {_mask(report['mask_us_p50'].get(k))} |" for k, v in medians.items()],
        "",
        f"Reproduce: `python benchmarks/tool_calls.py --batch {args.batch} --tokens {args.tokens} --repeats {args.repeats}"
        + (f" --model {args.model} --load-format {args.load_format}" if args.model else "") + "`",
    ]
    (out_dir / f"{name}.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
