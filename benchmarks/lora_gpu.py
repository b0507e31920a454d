"""LoRA adapters on one GPU: a Llama-3.1-8B-shaped model (random bf16 weights) with random rank-16 adapters on all
seven projections of every layer, in one run.

    python benchmarks/lora_gpu.py --out benchmarks/reports/lora_gpu_h200
    python benchmarks/lora_gpu.py --shape llama-3.2-1b --device cpu --dtype float32 --batch 4 --tokens 8 \\
        --prompt-len 16 --kv-gb 0.2 --out /tmp/lora_smoke   # CPU smoke of the harness

One LLM with --enable-lora (`--adapters` adapters registered, as many device slots, CUDA graphs) measures:
  a. batch-1 greedy decode of a `--tokens`-token reply to a `--prompt-len`-token prompt, (outputs - 1) over
     first-to-last output time, median of `--repeats` after a warm-up: the base model (no adapter), then adapter 0;
  b. decode at `--batch` requests (distinct random prompts): all on the base model, then the adapters mixed (request
     i runs adapter i mod `--adapters`); the rate counts the tokens after the step at which every request had its
     first token, over the time from that step to the last, after 4 warm-up tokens;
then the engine is freed and an LLM without LoRA measures (a) and (b) on the base model: the cost of enabling LoRA
for requests that use none. The kernels alone: lz.lora_shrink + lz.lora_expand at the qkv projection's shape, at 1
and `--batch` rows, replayed from a CUDA graph. Batch-1 bound: the device copy bandwidth over the weights a step reads
(model_shapes.weight_bytes, plus one adapter's matrices with one). Every row prints when measured; the report (OUT.json,
OUT.md) is rewritten after each.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

import layerzero as lz
import model_shapes as ms
from gpu_decode.engine import decode_once, step
from gpu_decode.plan import prompt_ids
from infer import LLM, SamplingParams
from lora_adapters import module_shapes, write_random_adapter
from report_files import write_report


def params(tokens: int, adapter: str | None) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True, lora=adapter)


def batch1(llm: LLM, args: argparse.Namespace, adapter: str | None) -> dict[str, Any]:
    ids = prompt_ids(llm.runner.vocab_size, args.prompt_len, seed=1)
    decode_once(llm, ids, 16, adapter)  # warm-up
    rates = [decode_once(llm, ids, args.tokens, adapter) for _ in range(args.repeats)]
    return {"tok_s": statistics.median(rates), "runs": rates}


def batched(llm: LLM, args: argparse.Namespace, adapters: list[str | None]) -> dict[str, Any]:
    """Steady decode tok/s of args.batch requests, request i on adapters[i % len(adapters)]."""
    prompts = [prompt_ids(llm.runner.vocab_size, args.prompt_len, seed=100 + i) for i in range(args.batch)]
    requests = [llm.engine.add_request(ids, params(args.tokens, adapters[i % len(adapters)]))
                for i, ids in enumerate(prompts)]
    waiting = {r.request_id for r in requests}
    produced, start, steps = 0, 0.0, 0
    while llm.engine.has_unfinished():
        outs = step(llm)
        now = time.perf_counter()
        if waiting or steps < 4:
            waiting -= {o.request_id for o in outs if o.token_id is not None}
            steps += not waiting
            start = now
        else:
            produced += sum(o.token_id is not None for o in outs)
    return {"tok_s": produced / (time.perf_counter() - start), "tokens": produced,
            "adapters": len({a for a in adapters if a is not None})}


def kernel_us(cfg, rows: int, slots: int, rank: int, device: str, dtype: torch.dtype) -> dict[str, Any]:
    """µs of one shrink + expand at the qkv projection's shape, each row on its own adapter slot (mod slots)."""
    from device_rates import graph_us

    n = (cfg.num_attention_heads + 2 * cfg.num_key_value_heads) * cfg.head_dim
    gen = torch.Generator(device).manual_seed(0)
    x = torch.randn(rows, cfg.hidden_size, device=device, dtype=dtype, generator=gen)
    a = torch.randn(slots, 3 * rank, cfg.hidden_size, device=device, dtype=dtype, generator=gen) * 0.02
    b = torch.randn(slots, n, 3 * rank, device=device, dtype=dtype, generator=gen) * 0.02
    y = torch.zeros(rows, n, device=device, dtype=dtype)
    ids = torch.arange(rows, device=device, dtype=torch.int64) % slots
    fn = lambda: lz.lora_expand(y, lz.lora_shrink(x, a, ids), b, ids)  # noqa: E731
    kernel = lz.which("lora_shrink", x, a, ids)["kernel_id"]
    return {"rows": rows, "us": graph_us([fn]), "kernel": kernel,
            "adapter_bytes": min(rows, slots) * (a[0].nbytes + b[0].nbytes)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="llama-3.1-8b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--rank", type=int, default=16)
    p.add_argument("--adapters", type=int, default=8)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--kv-gb", type=float, default=8.0)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    cfg = ms.model_config(args.shape)
    dtype = getattr(torch, args.dtype)
    shapes = module_shapes(cfg.hidden_size, cfg.intermediate_size, cfg.num_attention_heads, cfg.num_key_value_heads,
                           cfg.head_dim)
    adapter_bytes = cfg.num_hidden_layers * sum((o + i) * args.rank for o, i in shapes.values()) * dtype.itemsize
    data: dict[str, Any] = {"shape": args.shape, "rank": args.rank, "adapters": args.adapters, "batch": args.batch,
                            "tokens": args.tokens, "prompt_len": args.prompt_len, "adapter_bytes": adapter_bytes}
    cuda = args.device.startswith("cuda")
    if cuda:
        from device_rates import copy_bandwidth

        data["copy_bandwidth"] = copy_bandwidth()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir = ms.write_model_dir(args.shape, root)
        names = [f"a{i}" for i in range(args.adapters)]
        modules = {name: str(write_random_adapter(root / name, cfg.num_hidden_layers, shapes, args.rank, seed=i))
                   for i, name in enumerate(names)}
        common = dict(load_format="dummy", dtype=args.dtype, device=args.device, max_batch_size=args.batch,
                      max_seq_len=args.prompt_len + args.tokens + 64, kv_cache_memory_gb=args.kv_gb)
        runs = [("lora", dict(enable_lora=True, max_loras=args.adapters, max_lora_rank=args.rank,
                              lora_modules=modules)), ("no_lora", {})]
        for label, extra in runs:
            started = time.perf_counter()
            llm = LLM(str(model_dir), **common, **extra)
            data[f"{label}_ready_s"] = time.perf_counter() - started
            rows = [("batch1_base", lambda: batch1(llm, args, None)),
                    ("batched_base", lambda: batched(llm, args, [None]))]
            if label == "lora":
                rows[1:1] = [("batch1_adapter", lambda: batch1(llm, args, names[0]))]
                rows.append(("batched_mixed", lambda: batched(llm, args, list(names))))
            for key, fn in rows:
                data[f"{label}.{key}"] = fn()
                print(f"{label}.{key}: {data[f'{label}.{key}']['tok_s']:.1f} tok/s", flush=True)
                write_report(args.out, data, markdown(data))
            llm.close()
            del llm
            gc.collect()
            if cuda:
                torch.cuda.empty_cache()
    if cuda:
        data["kernels"] = [kernel_us(cfg, rows, args.adapters, args.rank, args.device, dtype) for rows in (1, args.batch)]
        for k in data["kernels"]:
            print(f"shrink + expand at qkv, {k['rows']} rows: {k['us']:.1f} us ({k['kernel']})", flush=True)
    write_report(args.out, data, markdown(data))


def markdown(d: dict[str, Any]) -> str:
    def rate(key: str) -> str:
        return f"{d[key]['tok_s']:.1f}" if key in d else "-"

    def ratio(a: str, b: str) -> str:
        return f"{d[a]['tok_s'] / d[b]['tok_s']:.3f}" if a in d and b in d else "-"

    weights = ms.weight_bytes(ms.model_config(d["shape"]))
    bw = d.get("copy_bandwidth")
    bound = (lambda extra: f"{bw / (weights + extra):.0f}") if bw else (lambda extra: "-")
    lines = [
        f"# LoRA adapters, {d['shape']} shape (random weights), rank {d['rank']} on all seven projections",
        "",
        f"`python benchmarks/lora_gpu.py --out ...`; {d['tokens']} new tokens after a {d['prompt_len']}-token prompt; "
        f"one adapter's matrices: {d['adapter_bytes'] / 2**20:.0f} MiB. Ready: with --enable-lora "
        f"{d.get('lora_ready_s', 0):.1f} s, without {d.get('no_lora_ready_s', 0):.1f} s.",
        "",
        "| run | tok/s | ratio | batch-1 bound (tok/s) |",
        "|---|---|---|---|",
        f"| batch 1, no LoRA engine | {rate('no_lora.batch1_base')} | 1 | {bound(0)} |",
        f"| batch 1, LoRA engine, base model | {rate('lora.batch1_base')} | "
        f"{ratio('lora.batch1_base', 'no_lora.batch1_base')} | {bound(0)} |",
        f"| batch 1, adapter | {rate('lora.batch1_adapter')} | {ratio('lora.batch1_adapter', 'lora.batch1_base')} "
        f"of the base on the LoRA engine, {ratio('lora.batch1_adapter', 'no_lora.batch1_base')} of no LoRA | "
        f"{bound(d['adapter_bytes'])} |",
        f"| batch {d['batch']}, no LoRA engine | {rate('no_lora.batched_base')} | 1 | |",
        f"| batch {d['batch']}, LoRA engine, base model | {rate('lora.batched_base')} | "
        f"{ratio('lora.batched_base', 'no_lora.batched_base')} | |",
        f"| batch {d['batch']}, {d['adapters']} adapters mixed | {rate('lora.batched_mixed')} | "
        f"{ratio('lora.batched_mixed', 'lora.batched_base')} of the base on the LoRA engine, "
        f"{ratio('lora.batched_mixed', 'no_lora.batched_base')} of no LoRA | |",
    ]
    for k in d.get("kernels", []):
        lines.append(f"\nlz.lora_shrink + lz.lora_expand at the qkv shape, {k['rows']} rows: {k['us']:.1f} us "
                     f"({k['kernel']}; {k['adapter_bytes'] / 2**20:.1f} MiB of adapter weights read)")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
