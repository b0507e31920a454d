"""The MLX runner against the torch runner (and, on a Mac, mlx-lm on the same weights), same run.

    .venv/bin/python benchmarks/mlx_runner.py [--model smollm2|gemma3|PATH] [--tokens 64] [--runs 3] [--mlx-lm]
                                              [--report benchmarks/reports/mlx_cpu]

Measurements, each interleaved run by run across the engines so drift on a shared machine hits all alike:
- batch 1: decode tok/s of one chat request (first token excluded) and prompt processing (prompt tokens over the
  time to the first token, the prefix cache emptied first, as mlx-lm computes every prompt anew);
- batch 16: 16 different chat prompts at once, generated tokens over wall time (prefill included).
Engines: runner=torch and runner=mlx with quantization=auto (a GGUF's 4-bit / Q8_0 weights kept), the latter also with
launch-ahead off (each step read before the next is encoded), and runner=mlx
with --quantization none --dtype float16 beside mlx-lm (`--mlx-lm`, needs `pip install mlx-lm`), which loads the
same weights dequantized to float16, written as an HF directory (safetensors through our weight-name maps, the
tokenizer through `infer export-tokenizer`). On Linux MLX runs on its CPU backend: a correctness vehicle, but the
number is worth knowing. `--report PATH` writes PATH.json and PATH.md.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
import torch

from infer import LLM
from infer.loader.gguf_loader import read_gguf_config
from infer.loader.gguf_file import bundled_gemma3_270m, bundled_smollm2
from infer.runners.mlx.weights import load_torch_model

sys.path.insert(0, str(Path(__file__).parent))
from cpu_decode import QUESTIONS, greedy, ours_batch1, ours_engine, ours_prompt  # noqa: E402

MODELS = {"smollm2": bundled_smollm2, "gemma3": bundled_gemma3_270m}


def export_hf(gguf: Path, out: Path) -> Path:
    """The GGUF's weights dequantized to float16 as an HF directory (config.json, safetensors, tokenizer) for mlx-lm:
    each HF tensor is cut from our loaded parameters through the model's weight map (Q/K rows un-permuted already)."""
    from safetensors.numpy import save_file

    from infer.cli import main as infer_cli

    loaded = load_torch_model(gguf, "auto", "none", 4096)
    params = dict(loaded.model.named_parameters())
    tensors = {}
    for name, slot in loaded.model.weight_map().items():
        value = params[slot.param].detach()
        value = value if slot.rows is None else value.narrow(0, slot.start, slot.rows)
        tensors[name] = value.to(dtype=torch.float16).numpy()
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / "model.safetensors"))
    config = read_gguf_config(gguf) | {"torch_dtype": "float16"}
    config["architectures"] = [{"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM",
                                "gemma3_text": "Gemma3ForCausalLM"}[config["model_type"]]]
    (out / "config.json").write_text(json.dumps(config))
    infer_cli(["export-tokenizer", "--model", str(gguf), str(out)])
    return out


class MlxLm:
    """mlx-lm's `stream_generate` on an HF directory: batch-1 decode and prompt-processing tok/s as it reports them."""

    def __init__(self, path: Path) -> None:
        from mlx_lm import load

        self.model, self.tokenizer = load(str(path))

    def measure(self, ids: list[int], tokens: int) -> dict[str, float]:
        from mlx_lm import stream_generate

        last = None
        for last in stream_generate(self.model, self.tokenizer, ids, max_tokens=tokens):
            pass
        assert last is not None
        return {"decode": last.generation_tps, "prompt": last.prompt_tps}


def measure(llm: LLM, prompts: list[list[int]], tokens: int) -> dict[str, float]:
    return {"decode": ours_batch1(llm, prompts[0], tokens), "prompt": ours_prompt(llm, prompts[0]),
            "batch16": ours_engine(llm, prompts, tokens)}


def run(args: argparse.Namespace) -> dict:
    path = MODELS[args.model]() if args.model in MODELS else Path(args.model)
    engines = {
        "torch": dict(runner="torch"),
        "mlx": dict(runner="mlx"),
    }
    if args.mlx_lm:
        engines["mlx_fp16"] = dict(runner="mlx", quantization="none", dtype="float16")
    llms = {name: LLM(str(path), max_seq_len=1024, **options) for name, options in engines.items()}
    llms["mlx_serial"] = LLM(str(path), max_seq_len=1024, runner="mlx")
    llms["mlx"].runner.launches_ahead = True  # step N + 1 encoded before step N is read (Metal's default)
    llms["mlx_serial"].runner.launches_ahead = False  # each step read before the next (the CPU backend's default)
    prompts = [llms["mlx"].encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    peer = MlxLm(export_hf(path, Path(tempfile.mkdtemp()) / "hf")) if args.mlx_lm else None
    for llm in llms.values():  # warm every shape once
        llm.generate_ids(prompts[:2], greedy(4))
    samples: dict[str, list[dict[str, float]]] = {name: [] for name in [*llms, *(["mlx_lm"] if peer else [])]}
    for _ in range(args.runs):
        for name, llm in llms.items():
            samples[name].append(measure(llm, prompts, args.tokens))
        if peer is not None:
            samples["mlx_lm"].append(peer.measure(prompts[0], args.tokens))
    medians = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
    profile = llms["mlx"].runner.profile.per_step_ms()  # the MLX runner's host time per step, every run above
    return {"model": str(path), "tokens": args.tokens, "runs": args.runs, "medians": medians, "samples": samples,
            "mlx_step_ms": profile,
            "hardware": f"{platform.machine()} {platform.system()}, {mx.default_device()}",
            "software": {"mlx": mx.__version__, "python": platform.python_version(), "numpy": np.__version__,
                         "torch": torch.__version__},
            "configs": {name: llm.config.as_dict() for name, llm in llms.items()}}


def markdown(report: dict) -> str:
    m = report["medians"]
    rows = [("batch 1, decode tok/s", "decode"), ("batch 1, prompt processing tok/s (uncached)", "prompt"),
            ("16 prompts at once, generated tok/s", "batch16")]
    lines = [f"# MLX runner vs torch runner — {Path(report['model']).name} (quantization=auto)", "",
             f"Hardware: {report['hardware']}. Software: {report['software']}.",
             f"{len(QUESTIONS)} chat prompts, {report['tokens']} new tokens each, greedy, EOS ignored; medians of "
             f"{report['runs']} runs interleaved across the engines.", "",
             "| measurement | mlx runner | torch runner | mlx ÷ torch |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {m['mlx'][k]:.1f} | {m['torch'][k]:.1f} | {m['mlx'][k] / m['torch'][k]:.2f} |"
              for label, k in rows]
    lines += ["", "Launch-ahead (step N + 1 encoded before step N is read) against reading each step first, MLX runner:", "",
              "| measurement | launch-ahead | serial | ahead ÷ serial |", "|---|---:|---:|---:|"]
    lines += [f"| {label} | {m['mlx'][k]:.1f} | {m['mlx_serial'][k]:.1f} | {m['mlx'][k] / m['mlx_serial'][k]:.2f} |"
              for label, k in rows if k != "prompt"]
    if "mlx_lm" in m:
        lines += ["", "Same weights dequantized to float16, batch 1:", "",
                  "| measurement | mlx runner (fp16) | mlx-lm (fp16) | ours ÷ mlx-lm |", "|---|---:|---:|---:|"]
        lines += [f"| {label} | {m['mlx_fp16'][k]:.1f} | {m['mlx_lm'][k]:.1f} | {m['mlx_fp16'][k] / m['mlx_lm'][k]:.2f} |"
                  for label, k in rows[:2]]
    step = report["mlx_step_ms"]
    lines += ["", "MLX runner, mean ms per step (all runs): " + ", ".join(f"{k} {v:.2f}" for k, v in step.items()),
              "(encode: building the lazy graph; wait: the device at the step boundary; readback: host conversion)"]
    lines += ["", f"EngineConfig (mlx): `{json.dumps(report['configs']['mlx'])}`", "",
              f"Reproduce: `.venv/bin/python benchmarks/mlx_runner.py --runs {report['runs']} --tokens {report['tokens']} --report "
              f"benchmarks/reports/mlx_cpu`"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2, gemma3 (the bundled GGUFs) or a path")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--mlx-lm", action="store_true", help="add mlx-lm on the same weights (a Mac with mlx-lm)")
    parser.add_argument("--report", default=None, metavar="PATH", help="write PATH.json and PATH.md")
    args = parser.parse_args()
    report = run(args)
    text = markdown(report)
    print(text)
    if args.report:
        Path(args.report).with_suffix(".json").write_text(json.dumps(report, indent=1))
        Path(args.report).with_suffix(".md").write_text(text)


if __name__ == "__main__":
    main()
