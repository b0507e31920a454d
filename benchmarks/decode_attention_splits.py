"""What a batch-1 decode attention's split count costs when the capacity outgrows the context, in a CUDA graph.

    python benchmarks/decode_attention_splits.py --out STEM

The decode attention cuts each (sequence, KV head)'s keys into a split count fixed by the step's capacity (a graph's
is its bucket's), so a short context in a long capacity leaves most splits empty. Per layer, as in a model: a QKV
GEMV on the layerzero Triton path (so the attention launches as its programmatic dependent, as in the model), then
the paged attention over that layer's own cache, cycling over 8 layers' weights and caches (past L2). Shape:
Qwen3-30B-A3B's attention (32 query / 4 KV heads of 128, hidden 2048), bf16. Each row: µs per layer of GEMV +
attention, the GEMV alone, and their difference (the attention's share), for split counts from 1 to what the
capacity picks.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
from device_rates import graph_us
from report_files import write_report

from layerzero.kernels.triton import gemv, paged_attention

HEADS, KV_HEADS, HEAD_DIM, HIDDEN, BLOCK_SIZE, LAYERS = 32, 4, 128, 2048, 16, 8
CASES = [(1152, 200), (1152, 1000), (4096, 200), (4096, 3000)]  # (capacity, context)


def _layers(capacity: int) -> list[dict[str, torch.Tensor]]:
    blocks = capacity // BLOCK_SIZE
    layers = []
    for _ in range(LAYERS):
        kc = torch.randn(blocks, BLOCK_SIZE, KV_HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        layers.append({
            "w": torch.randn((HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02,
            "kc": kc, "vc": torch.randn_like(kc),
            "tables": torch.randperm(blocks, device="cuda", dtype=torch.int32)[None, :],
        })
    return layers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/reports/decode_attention_splits"),
                        help="report stem (writes STEM.md and STEM.json)")
    args = parser.parse_args()
    x = torch.randn(1, HIDDEN, device="cuda", dtype=torch.bfloat16)
    q = torch.randn(1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    rows: list[dict[str, Any]] = []
    for capacity, context in CASES:
        layers = _layers(capacity)
        ctx = torch.full((1,), context, device="cuda", dtype=torch.int32)
        picked = paged_attention.choose_splits(1, KV_HEADS, capacity, paged_attention.sm_count(q.device))
        gemv_us = graph_us([lambda lay=lay: gemv.linear_gemv(x, lay["w"]) for lay in layers], calls=48)
        for splits in sorted({1, 2, 4, 6, 9, picked // 2, picked} - {0}):
            def layer(lay: dict[str, torch.Tensor], splits: int = splits) -> None:
                gemv.linear_gemv(x, lay["w"])
                paged_attention.paged_attention(q, lay["kc"], lay["vc"], block_tables=lay["tables"], context_lens=ctx,
                                                scale=HEAD_DIM**-0.5, sliding_window=None, max_context_len=capacity,
                                                num_splits=splits)
            total = graph_us([lambda lay=lay: layer(lay) for lay in layers], calls=48)
            rows.append({"capacity": capacity, "context": context, "splits": splits, "picked": splits == picked,
                         "layer_us": round(total, 2), "gemv_us": round(gemv_us, 2),
                         "attention_us": round(total - gemv_us, 2)})
            print(rows[-1], flush=True)
    lines = [f"# Decode attention split counts at batch 1 ({torch.cuda.get_device_name()})", "",
             "`python benchmarks/decode_attention_splits.py`: " + __doc__.split("\n\n")[2].replace("\n", " "), "",
             "| capacity | context | splits | picked | GEMV + attention µs | GEMV µs | attention µs |",
             "|---:|---:|---:|:---:|---:|---:|---:|"]
    lines += [f"| {r['capacity']} | {r['context']} | {r['splits']} | {'yes' if r['picked'] else ''} | "
              f"{r['layer_us']} | {r['gemv_us']} | {r['attention_us']} |" for r in rows]
    write_report(args.out, {"rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()
