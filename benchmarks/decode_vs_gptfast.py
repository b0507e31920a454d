"""Batch-1 decode beside gpt-fast in one run, as fractions of the bandwidth roofline, and kernels per decode step.

    python benchmarks/decode_vs_gptfast.py --peer .peers/gptfast --models llama-3.2-1b llama-3.1-8b --out DIR

Per model shape (random bf16 weights): infer's batch-1 greedy decode with CUDA graphs (first to last output of a
`--tokens`-token reply to a `--prompt-len`-token prompt, median of `--repeats`), and gpt-fast's model file
(`../shared/peers/gptfast`, copied to a git-ignored folder and carried) with its one-token decode compiled by
torch.compile(mode="reduce-overhead", fullgraph=True) and greedy argmax, timed over the same tokens after a warm-up.
The roofline is the device copy bandwidth (1 GiB device-to-device copy, read + write) over the bytes a step reads:
every weight once (the embedding row aside) and the KV cache at the mean context. Then infer's kernels per decode
step from a torch.profiler record of 20 steps (CUDA graphs replayed: the graph's kernels are listed one by one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import model_shapes as ms
from gpu_decode.baselines import gptfast_decode_rate
from gpu_decode.engine import decode_once
from gpu_decode.plan import prompt_ids
from profile_generation import union_us
from device_rates import copy_bandwidth
from report_files import write_report
from infer import LLM


def step_bytes(name: str, context: int) -> float:
    cfg = ms.model_config(name)
    return ms.weight_bytes(cfg) + ms.kv_read_bytes(cfg, context)


def ours(path: Path, args: argparse.Namespace) -> tuple[float, dict[str, float]]:
    """(batch-1 tok/s, kernels per decode step and the GPU-busy µs per step from a profile)."""
    llm = LLM(str(path), load_format="dummy", dtype="bfloat16", max_batch_size=1,
              max_seq_len=args.prompt_len + args.tokens + 64, kv_cache_memory_gb=1.0)
    ids = prompt_ids(llm.runner.vocab_size, args.prompt_len, seed=1)
    decode_once(llm, ids, args.tokens)
    rate = statistics.median(decode_once(llm, ids, args.tokens) for _ in range(args.repeats))
    counts = kernels_per_step(llm, ids)
    del llm
    torch.cuda.empty_cache()
    return rate, counts


def kernels_per_step(llm: LLM, ids: list[int], steps: int = 20) -> dict[str, float]:
    """Kernels launched and GPU-busy µs per decode step (20 steps of one request, its prefill excluded)."""
    from infer import SamplingParams

    llm.engine.add_request(ids, SamplingParams(temperature=0.0, max_tokens=steps + 8, ignore_eos=True))
    for _ in range(4):  # prefill, then the first decode steps
        llm.engine.step()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            llm.engine.step()
        torch.cuda.synchronize()
    while llm.engine.has_unfinished():
        llm.engine.step()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA and "Memcpy" not in e.name
               and "Memset" not in e.name]
    # the union of the kernels' intervals: a kernel launched as a programmatic dependent overlaps its predecessor
    busy = union_us([(e.time_range.start, e.time_range.end) for e in kernels])
    return {"kernels": len(kernels) / steps, "busy_us": busy / steps}


def gptfast(name: str, args: argparse.Namespace) -> float:
    """gpt-fast's batch-1 greedy decode tok/s: its model file, compiled one-token decode, CUDA graphs."""
    sys.path.insert(0, str(args.peer))
    from model import ModelArgs, Transformer  # type: ignore[import-not-found]  # the carried peer

    cfg = ms.model_config(name)
    total = args.prompt_len + args.tokens + 8
    margs = ModelArgs(block_size=total, n_layer=cfg.num_hidden_layers, n_head=cfg.num_attention_heads,
                      dim=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
                      n_local_heads=cfg.num_key_value_heads, vocab_size=cfg.vocab_size, rope_base=cfg.rope.theta,
                      norm_eps=cfg.rms_norm_eps)
    with torch.device("cuda"):
        model = Transformer(margs).to(torch.bfloat16).eval()
        model.setup_caches(1, total)

    def one(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        return model(x, pos)[:, -1].argmax(-1, keepdim=True)

    step = torch.compile(one, mode="reduce-overhead", fullgraph=True)
    rate = gptfast_decode_rate(one, step, prompt_ids(cfg.vocab_size, args.prompt_len, seed=1), args.tokens,
                               args.repeats, "cuda")
    del model, step
    sys.path.remove(str(args.peer))
    sys.modules.pop("model", None)
    torch.cuda.empty_cache()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["llama-3.2-1b", "llama-3.1-8b"], choices=ms.GPU_SHAPES)
    parser.add_argument("--peer", type=Path, default=Path(".peers/gptfast"), help="gpt-fast's model.py folder")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    parser.add_argument("--no-peer", action="store_true", help="infer alone (an A/B of our own settings)")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    gpu = torch.cuda.get_device_name(0)
    result: dict[str, Any] = {"gpu": gpu, "torch": torch.__version__, "copy_bandwidth": bandwidth, "rows": []}
    lines = [f"# Batch-1 decode beside gpt-fast ({gpu})", "",
             f"`python benchmarks/decode_vs_gptfast.py --models {' '.join(args.models)}"
             f"{' --no-peer' if args.no_peer else ''}`; torch {torch.__version__}; "
             f"random bf16 weights; {args.prompt_len}-token prompt, {args.tokens} tokens greedy, median of "
             f"{args.repeats}; roofline: copy bandwidth {bandwidth / 1e12:.2f} TB/s over weights + KV at the mean "
             f"context.", "",
             "| shape | roofline tok/s | infer tok/s | fraction | gpt-fast tok/s | fraction | infer / gpt-fast | "
             "kernels per step | GPU busy µs per step |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as root:
        for name in args.models:
            roofline = bandwidth / step_bytes(name, args.prompt_len + args.tokens // 2)
            rate, counts = ours(ms.write_model_dir(name, Path(root)), args)
            try:
                peer = float("nan") if args.no_peer else gptfast(name, args)
            except Exception as exc:  # noqa: BLE001 - the peer's failure is reported, ours still is
                print(f"gpt-fast on {name} failed: {type(exc).__name__}: {exc}", flush=True)
                peer = float("nan")
            result["rows"].append({"shape": name, "roofline": roofline, "infer": rate, "gptfast": peer} | counts)
            lines.append(f"| {name} | {roofline:.0f} | {rate:.1f} | {rate / roofline:.2f} | {peer:.1f} | "
                         f"{peer / roofline:.2f} | {rate / peer:.2f} | {counts['kernels']:.0f} | "
                         f"{counts['busy_us']:.0f} |")
            print(lines[-1], flush=True)
    write_report(args.out, result, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
