"""The whole Qwen3-30B-A3B-shaped mixture of experts (48 sparse layers, 128 experts, top 8; random bf16 weights, ~61 GB)
on one GPU in one run: decode at batch 1 to 256 and a 1k-token prefill against their bounds, beside gpt-fast's MoE.

    python benchmarks/moe_decode.py --peer .peers/gptfast_moe --out benchmarks/reports/moe_decode_h200
    python benchmarks/moe_decode.py --quantization fp8 --no-peer --out benchmarks/reports/moe_decode_fp8_h200
    python benchmarks/moe_decode.py --shape tiny-qwen3-moe --device cpu --dtype float32 --batches 1,4 \\
        --prefill 64 --kv-gb 0.1 --out /tmp/moe_smoke  # CPU smoke of the harness (no bounds, gpt-fast eager)

One LLM (CUDA graphs, prefix caching off, `--prefill`-token prefill chunks) measures, in order:
  a. batch-1 greedy decode: (outputs - 1) over first-to-last output time of a `--tokens`-token reply to a
     `--prompt-len`-token prompt, median of `--repeats` after a warm-up (gpu_decode.engine.decode_once);
  b. decode at each of `--batches`: B distinct random prompts, `--tokens` tokens each (EOS ignored, greedy), driven
     step by step; the rate is the tokens produced after the step at which every request had its first token, over
     the time from that step to the last (every prefill left out), after a 4-token warm-up of the same batch;
  c. prefill: one `--prefill`-token prompt to its single token (gpu_decode.engine.prefill_once), median of 3.
Decode bound: the device copy bandwidth (device_rates.copy_bandwidth) over the bytes a step must read: the weights of
attention, routers, norms, LM head, and per sparse layer the distinct experts the batch routes to, expected
E * (1 - (1 - k/E)^B) under uniform routing (k = 8 at batch 1), plus each sequence's KV at the mean context.
Prefill: the model's matmul FLOPs (model_shapes.prefill_flops: k experts per token, attention, one LM-head row) per
second, over the FLOP rate of lz.fused_moe alone on `--prefill` tokens at this shape (replayed from a CUDA graph,
random routing): the experts are 2/3 of a token's matmul FLOPs at this shape (3.6 of 5.5 GFLOP) and the grouped
GEMM (64 rows per expert) runs below the dense projections' rate, so 1.0 means the whole prefill ran as fast as its
expert GEMMs alone; `moe_share` is one such call's time per sparse layer (48) over the prefill's.
With `--quantization fp8` every projection, the LM head and the experts are float8 e4m3 in 128 x 128 blocks
(quantized at load, as `infer serve --quantization fp8` does): the bounds count one byte per weight (the block
scales add 1/4096), and the prefill's reference is lz.fused_moe_w8 on the same fp8 experts.
Then the engine is freed and gpt-fast's mixtral-moe/model.py (carried in --peer, unedited) runs at the same shape:
head_dim 128 (its ModelArgs derives 64 = dim // n_head; set back after construction, with q-wide wo and q split and
a head_dim-128 KV cache and rope), no q/k norms; its one-token decode compiled with torch.compile(mode=
"reduce-overhead", fullgraph=True), greedy argmax, timed like decode_vs_gptfast. Every row prints when measured and
the report (OUT.json, OUT.md) is rewritten after each.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

import layerzero as lz
import model_shapes as ms
from device_rates import copy_bandwidth, graph_us
from gpu_decode.baselines import gptfast_decode_rate
from gpu_decode.engine import decode_once, greedy, prefill_once, step
from gpu_decode.plan import prompt_ids
from infer import LLM
from infer.families.config import ModelConfig
from infer.models.quant import W8Experts
from report_files import write_report


def batched(llm: LLM, batch: int, tokens: int, prompt_len: int) -> float:
    """Decode tok/s of `batch` requests of distinct prompts, counted from the step that gave the last first token."""
    prompts = [prompt_ids(llm.runner.vocab_size, prompt_len, seed=10_000 * batch + i) for i in range(batch)]
    waiting = {llm.engine.add_request(ids, greedy(tokens)).request_id for ids in prompts}
    produced, start = 0, 0.0
    while llm.engine.has_unfinished():
        outs = step(llm)
        now = time.perf_counter()
        if waiting:
            waiting -= {o.request_id for o in outs if o.token_id is not None}
            start = now
        else:
            produced += sum(o.token_id is not None for o in outs)
    return produced / (time.perf_counter() - start)


def moe_flop_rate(cfg: ModelConfig, tokens: int, device: str, dtype: torch.dtype, fp8: bool = False
                  ) -> tuple[float, float]:
    """(FLOP/s, seconds) of one lz.fused_moe call (`fp8`: lz.fused_moe_w8 on fp8 experts) on `tokens` tokens at
    cfg's expert shape, randomly routed."""
    e, h, i, k = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size, cfg.num_experts_per_tok
    gen = torch.Generator(device).manual_seed(0)
    w13 = torch.randn(e, 2 * i, h, device=device, dtype=dtype, generator=gen) * 0.02
    w2 = torch.randn(e, h, i, device=device, dtype=dtype, generator=gen) * 0.02
    x = torch.randn(tokens, h, device=device, dtype=dtype, generator=gen)
    weights, ids = lz.moe_route(torch.randn(tokens, e, device=device, generator=gen), k, renormalize=True)
    if fp8:
        q13, q2 = W8Experts.quantize(w13), W8Experts.quantize(w2)
        del w13, w2
        args = (x, q13.weight, q13.scale, q2.weight, q2.scale, weights, ids)
        fn = lambda: lz.fused_moe_w8(*args, block_size=q13.block_size)  # noqa: E731
        kernel = lz.which("fused_moe_w8", *args, block_size=q13.block_size)["kernel_id"]
    else:
        fn = lambda: lz.fused_moe(x, w13, w2, weights, ids)  # noqa: E731
        kernel = lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"]
    print(f"experts on {tokens} tokens: {kernel}", flush=True)
    if device.startswith("cuda"):
        seconds = graph_us([fn]) * 1e-6
    else:
        fn()
        start = time.perf_counter()
        for _ in range(5):
            fn()
        seconds = (time.perf_counter() - start) / 5
    return 2 * tokens * k * 3 * h * i / seconds, seconds


def gptfast(cfg: ModelConfig, args: argparse.Namespace) -> float:
    """gpt-fast's MoE batch-1 greedy decode tok/s at cfg's shape (bf16; compiled with CUDA graphs on CUDA)."""
    sys.path.insert(0, str(args.peer))
    import model as peer  # type: ignore[import-not-found]  # the carried peer

    total = args.prompt_len + args.tokens + 8
    margs = peer.ModelArgs(block_size=total, n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                           dim=cfg.hidden_size, intermediate_size=cfg.moe_intermediate_size,
                           n_local_heads=cfg.num_key_value_heads, vocab_size=cfg.vocab_size, rope_base=cfg.rope.theta,
                           norm_eps=cfg.rms_norm_eps, num_experts=cfg.num_experts,
                           num_activated_experts=cfg.num_experts_per_tok)
    margs.head_dim = cfg.head_dim  # its __post_init__ set dim // n_head; Attention sizes wqkv from this
    q_width = cfg.num_attention_heads * cfg.head_dim
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: an fp32 copy of 30B weights would not fit
    try:
        with torch.device(args.device), torch.no_grad():
            model = peer.Transformer(margs).eval()
            for block in model.layers:
                block.attention.dim = q_width  # its q split and output view use `dim`
                block.attention.wo = nn.Linear(q_width, cfg.hidden_size, bias=False)
                for w in (block.block_sparse_moe.cond_ffn.w1, block.block_sparse_moe.cond_ffn.w2,
                          block.block_sparse_moe.cond_ffn.w3):
                    w.normal_(0.0, 0.02)  # torch.empty otherwise
            margs.dim = q_width  # setup_caches derives the KV head_dim and rope from dim // n_head
            model.setup_caches(1, total)
            margs.dim = cfg.hidden_size
    finally:
        torch.set_default_dtype(default)

    def one(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model(x, pos)[:, -1].argmax(-1, keepdim=True)

    cuda = args.device.startswith("cuda")
    decode = torch.compile(one, mode="reduce-overhead", fullgraph=True) if cuda else one
    rate = gptfast_decode_rate(one, decode, prompt_ids(cfg.vocab_size, args.prompt_len, seed=1), args.tokens,
                               args.repeats, args.device)
    del model, decode
    sys.path.remove(str(args.peer))
    sys.modules.pop("model", None)
    return rate


def free(device: str) -> None:
    """Collect garbage and hand cached device memory back (printing what stays allocated)."""
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        print(f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB still allocated", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=[n for n, d in ms.SHAPES.items()
                                                                      if d.get("num_experts")])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--peer", type=Path, default=Path(".peers/gptfast_moe"), help="gpt-fast's mixtral-moe folder")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--prefill", type=int, default=1024)
    parser.add_argument("--kv-gb", type=float, default=8.0)
    parser.add_argument("--max-batch-size", type=int, default=None,
                        help="the engine's max_batch_size (default: the largest of --batches)")
    parser.add_argument("--quantization", default="auto", choices=["auto", "fp8"],
                        help="fp8: projections, head and experts float8 e4m3 at load")
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    cfg, cuda, dtype = ms.model_config(args.shape), args.device.startswith("cuda"), getattr(torch, args.dtype)
    batches = [int(b) for b in args.batches.split(",")]
    bw = copy_bandwidth() if cuda else float("nan")
    gpu = torch.cuda.get_device_name(0) if cuda else "cpu"
    fp8 = args.quantization == "fp8"
    nbytes = 1 if fp8 else dtype.itemsize
    context = args.prompt_len + args.tokens // 2  # mean context over a reply
    result: dict[str, Any] = {"gpu": gpu, "torch": torch.__version__, "shape": ms.SHAPES[args.shape],
                              "copy_bandwidth": bw, "args": {k: str(v) for k, v in vars(args).items()}, "rows": []}
    lines = [f"# {args.shape} decode and prefill ({gpu})", "",
             f"`python benchmarks/moe_decode.py --shape {args.shape}`; torch {torch.__version__}; random "
             f"{args.dtype} weights{' quantized to fp8 at load' if fp8 else ''}; {args.prompt_len}-token prompts, {args.tokens} tokens greedy; copy bandwidth "
             f"{bw / 1e12:.2f} TB/s; bound = bandwidth over the weights a step reads (attention, routers, LM head, the "
             f"expected distinct experts per sparse layer) + KV at context {context}. Method: the module docstring.",
             "", "| engine | batch | experts read / layer | bound tok/s | tok/s | fraction |",
             "|---|---:|---:|---:|---:|---:|"]

    def row(kind: str, data: dict[str, Any], line: str) -> None:
        result["rows"].append({"kind": kind} | data)
        lines.append(line)
        print(line, flush=True)
        write_report(args.out, result, "\n".join(lines))

    def decode_row(engine: str, batch: int, rate: float) -> None:
        experts = ms.expected_experts(cfg, batch)
        step_bytes = (ms.active_weight_bytes(cfg, experts, nbytes)
                      + batch * ms.kv_read_bytes(cfg, context, dtype.itemsize))
        bound = batch * bw / step_bytes
        row("decode", {"engine": engine, "batch": batch, "experts_read": experts, "step_bytes": step_bytes,
                       "bound_tok_s": bound, "tok_s": rate, "fraction": rate / bound},
            f"| {engine} | {batch} | {experts:.1f} | {bound:.0f} | {rate:.1f} | {rate / bound:.3f} |")

    moe_rate, moe_s = moe_flop_rate(cfg, args.prefill, args.device, dtype, fp8)
    free(args.device)
    with tempfile.TemporaryDirectory() as root:
        llm = LLM(str(ms.write_model_dir(args.shape, Path(root))), load_format="dummy", dtype=args.dtype,
                  device=args.device, max_batch_size=args.max_batch_size or max(batches), kv_cache_memory_gb=args.kv_gb,
                  max_seq_len=max(args.prompt_len + args.tokens, args.prefill) + 128, use_prefix_caching=False,
                  prefill_chunk_size=args.prefill, quantization=args.quantization)
        print(f"loaded in {llm.load_seconds:.1f} s", flush=True)
        ids = prompt_ids(llm.runner.vocab_size, args.prompt_len, seed=1)
        decode_once(llm, ids, 16)  # warm-up
        decode_row("infer (decode_once)", 1, statistics.median(decode_once(llm, ids, args.tokens)
                                                               for _ in range(args.repeats)))
        for batch in batches:
            batched(llm, batch, 4, args.prompt_len)  # warm-up: this batch's prefill and decode shapes
            decode_row("infer", batch, batched(llm, batch, args.tokens, args.prompt_len))
        long = prompt_ids(llm.runner.vocab_size, args.prefill, seed=7)
        prefill_once(llm, long, args.device)  # warm-up
        seconds = statistics.median(prefill_once(llm, long, args.device) for _ in range(3))
        llm.close()
        del llm
    free(args.device)
    flops = ms.prefill_flops(cfg, args.prefill) / seconds
    share = sum(cfg.moe_layers) * moe_s / seconds
    lines += ["", "| prefill tokens | seconds | tok/s | model TFLOP/s | lz.fused_moe TFLOP/s | fraction | moe_share |",
              "|---:|---:|---:|---:|---:|---:|---:|"]
    row("prefill", {"tokens": args.prefill, "seconds": seconds, "tok_s": args.prefill / seconds, "flop_s": flops,
                    "fused_moe_flop_s": moe_rate, "fused_moe_s": moe_s, "fraction": flops / moe_rate,
                    "moe_share": share},
        f"| {args.prefill} | {seconds:.4f} | {args.prefill / seconds:.0f} | {flops / 1e12:.1f} | "
        f"{moe_rate / 1e12:.1f} | {flops / moe_rate:.2f} | {share:.2f} |")
    lines += ["", "| engine | batch | experts read / layer | bound tok/s | tok/s | fraction |",
              "|---|---:|---:|---:|---:|---:|"]
    if not args.no_peer:
        try:
            decode_row("gpt-fast", 1, gptfast(cfg, args))
        except Exception as exc:  # noqa: BLE001 - the peer's failure is reported, ours still is
            print(f"gpt-fast failed: {type(exc).__name__}: {exc}", flush=True)
            result["gptfast_error"] = f"{type(exc).__name__}: {exc}"
        free(args.device)
    write_report(args.out, result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
