"""Quantized weights on the GPU: Llama-3.1-8B and Llama-3.2-1B shapes with FP8-block, INT8-channel and 4-bit (groups
of 32, GGUF's layout) weights against bf16, measured in the same run (random weights quantized at load).

    python benchmarks/quantized_gpu.py [--out DIR] [--models llama-3.1-8b,llama-3.2-1b] [--formats int4,...] [--sweep]
    python benchmarks/quantized_gpu.py --smoke --out /tmp/q   # the pipeline on CPU with a tiny shape

One report, quantized_gpu_<gpu>.{json,md} in DIR (default $OUT, else benchmarks/reports/), rewritten after every item:
- device copy bandwidth (the roofline's denominator);
- per matmul of each shape (fused qkv, o, fused gate/up, down), 1 and 64 rows: bf16 `F.linear` (cuBLAS) against
  the Triton 8-bit and 4-bit kernels, median µs of a CUDA graph of calls rotating over enough weight copies that
  L2 holds none of them, and the weight bytes per second; --sweep also times a set of other launch shapes;
- end to end, CUDA graphs on, per shape and weight format: batch-1 decode tok/s (median of 3 replies of 256
  tokens), batch-64 decode tok/s and 1k-token prefill tok/s; the bytes a decode token reads (every weight
  buffer as stored, once) over the copy bandwidth is the roofline, and tok/s against bf16 the speedup. The
  formats: bf16; FP8 blocks, INT8 channels and INT4 groups quantized at load (every linear weight, the LM head
  too, as gpt-fast's int8 does); and an FP8 checkpoint written first in Qwen3-8B-FP8's layout (LM head bf16), loaded
  as stored.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import os
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

import model_shapes as ms
from gpu_decode.baselines import copy_bandwidth, device_info, gpu_slug
from device_rates import graph_us
from gpu_decode.engine import decode_batch1, decode_batched, kv_cache_gb, prefill
from gpu_decode.plan import SMOKE, Plan
from infer import LLM

REPORTS = Path(__file__).parent / "reports"
# quantization= values; "none": bf16 weights; "checkpoint": an FP8 checkpoint written first, loaded as stored
FORMATS = ("none", "fp8", "int8", "int4", "checkpoint")
FORMAT_NAMES = {"none": "bf16", "fp8": "FP8 128x128 blocks", "int8": "INT8 per channel",
                "int4": "INT4 groups of 32", "checkpoint": "FP8 checkpoint, bf16 head"}
KERNEL_FORMATS = ("fp8", "int8", "int4")
PLAN = Plan(models=("llama-3.1-8b", "llama-3.2-1b"), graph_modes=(True,), batches=(64,), prefill_lens=(1024,),
            max_seq_len=2048, max_batch_size=64, prefill_repeats=3)


def linears(cfg) -> dict[str, tuple[int, int]]:
    """(N, K) of a block's matmuls, as the model fuses them."""
    q, kv, h, i = cfg.num_attention_heads * cfg.head_dim, cfg.num_key_value_heads * cfg.head_dim, cfg.hidden_size, \
        cfg.intermediate_size
    return {"qkv": (q + 2 * kv, h), "o": (h, q), "gate_up": (2 * i, h), "down": (h, i)}


def copies(nbytes: int) -> int:
    """Weight copies to rotate over so that L2 (50 MB on an H100) never holds the next one: >= 400 MB in all."""
    return max(2, min(16, -(-400 * 2**20 // nbytes)))


def sweep_configs(fmt: str, rows: int, k: int, bk: int) -> list:
    """Launch shapes to time: GEMV tiles at 1 row, tl.dot tiles (8-bit: K tiles inside one scale block) above."""
    from layerzero.kernels.triton.linear_int4 import Int4Tiles
    from layerzero.kernels.triton.linear_w8 import TileConfig

    if fmt == "int4":  # tl.dot tiles only: the GEMV's shapes were chosen at 1 row already
        sizes = (16, 32, 64) if rows <= 64 else (64, 128)
        return [] if rows == 1 else [Int4Tiles(bm, bn, bk_, 4, stages) for bm, bn, bk_, stages
                                     in itertools.product(sizes, (32, 64, 128), (32, 64, 128), (3, 4))]
    if rows == 1:
        return [TileConfig(1, bn, sub, warps) for bn, sub, warps in itertools.product((2, 4, 8), (512, 1024, 2048, 4096),
                                                                                      (4, 8))]
    return [TileConfig(bm, bn, 128 if bk >= 128 else bk, 4, stages, split) for bm, bn, stages, split
            in itertools.product((32, 64), (32, 64, 128), (3, 4), (1, 2, 4))]


def kernel_rows(n: int, k: int, rows: int, formats: tuple[str, ...], sweep: bool) -> dict[str, Any]:
    """One matmul shape at `rows` rows: bf16 cuBLAS against the quantized Triton kernels."""
    from infer.models.quant import Int4Weight, W8Weight
    from layerzero.kernels.triton import linear_int4, linear_w8
    from layerzero.kernels.triton.launch import sm_count

    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    dense = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02 for _ in range(copies(2 * n * k))]
    out: dict[str, Any] = {"n": n, "k": k, "rows": rows}
    out["bf16_us"] = graph_us([lambda w=w: F.linear(x, w) for w in dense])
    out["bf16_gb_s"] = 2 * n * k / out["bf16_us"] / 1e3
    for fmt in formats:
        if fmt == "int4":
            weights = [Int4Weight.quantize(w) for w in dense[:copies(n * k // 2)]]

            def call(q: Int4Weight, c: Any = None) -> torch.Tensor:
                return linear_int4.linear_int4(x, q.qweight, q.scales_zeros, None, group_size=q.group_size, config=c)

            nbytes = weights[0].qweight.numel() + weights[0].scales_zeros.numel() * 4
            bk, default = 32, linear_int4.tile_config(rows, n, k, 32)
        else:
            weights = [W8Weight.quantize(w, fmt) for w in dense[:copies(n * k)]]

            def call(q: W8Weight, c: Any = None) -> torch.Tensor:
                return linear_w8.linear_w8(x, q.weight, q.scale, None, block_size=q.block_size, config=c)

            nbytes = n * k + weights[0].scale.numel() * 4
            bk = weights[0].block_size[1]
            default = linear_w8.tile_config(rows, n, k, bk, sm_count(x.device))
        us = graph_us([lambda q=q: call(q) for q in weights])
        out[fmt] = {"us": us, "gb_s": nbytes / us / 1e3, "speedup": out["bf16_us"] / us, "config": default._asdict()}
        if sweep:
            tried = []
            for cfg in sweep_configs(fmt, rows, k, bk):
                try:
                    t = graph_us([lambda q=q, c=cfg: call(q, c) for q in weights])
                except Exception as exc:  # a tile shape the compiler refuses is a data point, not a failure
                    tried.append({"config": cfg._asdict(), "error": repr(exc)[:200]})
                    continue
                tried.append({"config": cfg._asdict(), "us": t})
            out[fmt]["sweep"] = sorted(tried, key=lambda r: r.get("us", 1e9))[:8]
            if fmt == "int4":  # the alternative: dequantize the whole weight to bf16, then cuBLAS
                out[fmt]["dequantize_then_cublas_us"] = graph_us(
                    [lambda q=q: F.linear(x, q.dequantize().to(x.dtype)) for q in weights])
        del weights
    del dense
    torch.cuda.empty_cache()
    return out


def bytes_per_token(llm: LLM) -> int:
    """Bytes one decode token reads from the weights as stored: every parameter and quantized buffer once, the
    embedding as one row (unless it is also the head), rope tables not at all."""
    model = llm.engine.runner.model
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    total += sum(b.numel() * b.element_size() for name, b in model.named_buffers() if not name.startswith("ropes."))
    if not model.config.tie_word_embeddings:
        total -= model.embed.numel() * model.embed.element_size() * (1 - 1 / model.embed.shape[0])
    return int(total)


def write_fp8_checkpoint(name: str, root: Path, device: str) -> Path:
    """A real FP8-block checkpoint of a shape with random weights, as Qwen3-8B-FP8 is stored: every projection
    float8_e4m3fn with `weight_scale_inv` per 128 x 128 block, norms, embedding and LM head in bf16."""
    from safetensors.torch import save_file

    from infer.loader.model_loader import build_model
    from infer.models.quant import FP8_BLOCK, W8Weight

    base = ms.write_model_dir(name, root)
    path = root / f"{name}-fp8"
    path.mkdir(parents=True, exist_ok=True)
    for f in base.iterdir():
        if f.name != "config.json":
            (path / f.name).write_bytes(f.read_bytes())
    config = json.loads((base / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                     "weight_block_size": list(FP8_BLOCK)}
    model = build_model(ms.model_config(name), torch.bfloat16, "meta", 16)
    params = dict(model.named_parameters())
    tensors: dict[str, torch.Tensor] = {}
    for hf_name, slot in model.weight_map().items():
        shape = params[slot.param].shape
        shape = (slot.rows, *shape[1:]) if slot.rows is not None else shape
        if "norm" in hf_name:
            tensors[hf_name] = torch.ones(shape, dtype=torch.bfloat16)
            continue
        w = torch.randn(shape, device=device, dtype=torch.bfloat16) * 0.02
        if hf_name.endswith("_proj.weight"):
            q = W8Weight.quantize(w, "fp8")
            tensors[hf_name], tensors[hf_name.replace(".weight", ".weight_scale_inv")] = q.weight.cpu(), q.scale.cpu()
        else:
            tensors[hf_name] = w.cpu()
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2))
    return path


def engine_run(name: str, fmt: str, plan: Plan, copy_gb_s: float) -> dict[str, Any]:
    """One LLM (graphs on) for a shape and weight format: batch 1, batch 64 and a 1k prefill."""
    root = Path(plan.model_root)
    path = write_fp8_checkpoint(name, root, plan.device) if fmt == "checkpoint" else ms.write_model_dir(name, root)
    options = dict(load_format="auto" if fmt == "checkpoint" else "dummy", dtype=plan.dtype, device=plan.device,
                   quantization="auto" if fmt == "checkpoint" else fmt,
                   use_cuda_graphs=True if plan.device == "cuda" else None, max_batch_size=plan.max_batch_size,
                   max_seq_len=plan.max_seq_len, kv_cache_memory_gb=kv_cache_gb(name, plan))
    if plan.device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    llm = LLM(str(path), **options)
    run: dict[str, Any] = {"engine_options": options, "load_s": time.perf_counter() - start,
                           "bytes_per_token": bytes_per_token(llm)}
    if plan.device == "cuda":  # weights, KV cache and graphs; a checkpoint kept 8-bit never allocates dense weights
        run["peak_gpu_bytes_at_load"] = torch.cuda.max_memory_allocated()
    run["roofline_tok_s"] = copy_gb_s * 1e9 / run["bytes_per_token"]
    run["batch1"] = decode_batch1(llm, plan)
    run["batch1"]["roofline_fraction"] = run["batch1"]["median_tok_s"] / run["roofline_tok_s"]
    for batch in plan.batches:
        run[f"batch{batch}"] = decode_batched(llm, batch, plan)
    for tokens in plan.prefill_lens:
        run[f"prefill{tokens}"] = prefill(llm, tokens, plan)
    del llm
    gc.collect()
    if plan.device == "cuda":
        torch.cuda.empty_cache()
    return run


def markdown(report: dict[str, Any]) -> str:
    """The report's tables: per-matmul kernels, then end to end with speedups against bf16."""
    hw = report["hardware"]
    copy = report.get("copy", {}).get("gb_s", float("nan"))
    lines = [f"# Quantized weights on the GPU: {hw.get('gpu', hw.get('cpu'))}", "",
             f"{report['meta']['date']}; torch {hw['torch']}, triton {hw['triton']}; copy bandwidth {copy:.0f} GB/s. "
             f"Reproduce: `python benchmarks/quantized_gpu.py` (`bash scripts/gpu_quantized.sh` on the lent GPU).", ""]
    kernels = report.get("kernels", {})
    if kernels:
        formats = [f for f in KERNEL_FORMATS if any(f in r for r in kernels.values())]
        lines += ["## Per matmul (CUDA graph, weights rotated past L2)", "",
                  "| shape | matmul | N x K | rows | bf16 µs | " + " | ".join(f"{f} µs | {f} GB/s | {f} speedup"
                                                                        for f in formats) + " |",
                  "|---|---|---|---:|---:|" + "---:|---:|---:|" * len(formats)]
        for key, r in kernels.items():
            if "error" in r:
                lines.append(f"| {key} | error: {r['error'][:80]} |")
                continue
            model, matmul, _ = key.split("/")
            cells = [f"{r[f]['us']:.1f} | {r[f]['gb_s']:.0f} | {r[f]['speedup']:.2f}x" if f in r else "– | – | –"
                     for f in formats]
            lines.append(f"| {model} | {matmul} | {r['n']} x {r['k']} | {r['rows']} | {r['bf16_us']:.1f} | "
                         + " | ".join(cells) + " |")
        lines.append("")
    models = report.get("models", {})
    batch, prompt = report["plan"]["batches"][0], report["plan"]["prefill_lens"][0]
    if models:
        lines += ["## End to end (CUDA graphs; tok/s)", "",
                  f"| shape | weights | bytes/token | load peak GPU memory | batch-1 tok/s | vs bf16 | roofline fraction "
                  f"| batch-{batch} tok/s | vs bf16 | {prompt}-token prefill tok/s | vs bf16 |",
                  "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
        for name, runs in models.items():
            base = runs.get("none", {})
            for fmt, r in runs.items():
                if "error" in r:
                    lines.append(f"| {name} | {FORMAT_NAMES[fmt]} | error: {r['error'][:80]} |")
                    continue

                def ratio(key: str, field: str) -> str:
                    b = base.get(key, {}).get(field)
                    return f"{r[key][field] / b:.2f}x" if b else "–"

                peak = r.get("peak_gpu_bytes_at_load")
                lines.append(f"| {name} | {FORMAT_NAMES[fmt]} | {r['bytes_per_token'] / 1e9:.2f} GB | "
                             f"{'–' if peak is None else f'{peak / 2**30:.1f} GiB'} | {r['batch1']['median_tok_s']:.1f} | {ratio('batch1', 'median_tok_s')} | "
                             f"{r['batch1']['roofline_fraction']:.2f} | {r[f'batch{batch}']['tok_s']:.0f} | "
                             f"{ratio(f'batch{batch}', 'tok_s')} | {r[f'prefill{prompt}']['tok_s']:.0f} | "
                             f"{ratio(f'prefill{prompt}', 'tok_s')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPORTS)
    parser.add_argument("--models", default=None, help=f"comma-separated, from {', '.join(ms.SHAPES)}")
    parser.add_argument("--formats", default=",".join(FORMATS),
                        help=f"comma-separated weight formats to time, from {', '.join(FORMATS)} "
                             "(bf16 is always timed)")
    parser.add_argument("--rows", default="1,64", help="comma-separated row counts of the per-matmul timings")
    parser.add_argument("--tag", default="", help="appended to the report's file name (quantized_gpu_<gpu><tag>)")
    parser.add_argument("--sweep", action="store_true", help="also time other launch shapes (GEMV and tl.dot tiles)")
    parser.add_argument("--no-kernels", action="store_true", help="end to end only")
    parser.add_argument("--no-engine", action="store_true", help="per-matmul kernels only")
    parser.add_argument("--smoke", action="store_true", help="CPU, tiny shape, end to end only (checks the pipeline)")
    args = parser.parse_args()
    formats = tuple(f for f in args.formats.split(",") if f)
    if unknown := set(formats) - set(FORMATS):
        parser.error(f"--formats: unknown {sorted(unknown)}; choose from {', '.join(FORMATS)}")
    engine_formats = ("none",) + tuple(f for f in FORMATS if f in formats and f != "none")
    plan = replace(PLAN, **{k: v for k, v in SMOKE.items() if k in ("models", "device", "dtype", "prompt_len",
                                                                     "new_tokens", "repeats", "batch_warm_steps",
                                                                     "batch_timed_steps", "prefill_repeats",
                                                                     "copy_mib", "timing_reps")}) if args.smoke else PLAN
    if args.smoke:
        plan = replace(plan, batches=(8,), prefill_lens=(64,), max_seq_len=512, max_batch_size=8)
    if args.models:
        plan = replace(plan, models=tuple(args.models.split(",")))
    if plan.device == "cuda" and not torch.cuda.is_available():
        parser.error("needs a CUDA device (or --smoke)")
    info = device_info(plan)
    slug = gpu_slug(info, args.smoke)
    report: dict[str, Any] = {"meta": {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "argv": sys.argv},
                              "hardware": info, "plan": asdict(plan), "kernels": {}, "models": {}}
    args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        (args.out / f"quantized_gpu_{slug}{args.tag}.json").write_text(json.dumps(report, indent=1, default=str))
        (args.out / f"quantized_gpu_{slug}{args.tag}.md").write_text(markdown(report))

    def attempt(where: dict[str, Any], key: str, fn: Callable[[], Any]) -> None:
        try:
            where[key] = fn()
        except Exception as exc:  # one failed item is recorded; the run goes on
            where[key] = {"error": repr(exc), "traceback": traceback.format_exc()[-3000:]}
            print(f"{key} failed: {exc!r}", file=sys.stderr)
        save()
        print(f"[{time.strftime('%H:%M:%S')}] {key} done", file=sys.stderr, flush=True)

    attempt(report, "copy", lambda: copy_bandwidth(plan))
    copy_gb_s = report["copy"].get("gb_s", 1.0)
    if plan.device == "cuda" and not args.no_kernels:
        for name in plan.models:
            for matmul, (n, k) in linears(ms.model_config(name)).items():
                for rows in (int(r) for r in args.rows.split(",")):
                    attempt(report["kernels"], f"{name}/{matmul}/{rows}",
                            lambda n=n, k=k, r=rows: kernel_rows(n, k, r, tuple(f for f in KERNEL_FORMATS
                                                                                if f in formats), args.sweep))
    for name in plan.models if not args.no_engine else ():
        runs = report["models"].setdefault(name, {})
        for fmt in engine_formats:
            attempt(runs, fmt, lambda n=name, f=fmt: engine_run(n, f, plan, copy_gb_s))
    print(markdown(report))


if __name__ == "__main__":
    main()
