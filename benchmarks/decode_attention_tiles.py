"""Paged decode attention (layerzero's Triton kernel) per tile, as a fraction of copy bandwidth: which tile reads
the KV cache fastest at each decode batch, beside the tile the kernel picks.

    python benchmarks/decode_attention_tiles.py [--out STEM]

Each case is Llama's attention shape (32 query heads, 8 KV heads) over a paged cache of 16-token blocks in random
order, one query token per sequence, every sequence at the same context, no splits; µs per call: 10 calls captured
in a CUDA graph, median of 10 replays, over 4 query tensors (the cache, 34-350 MB, is read from HBM). Floor = the
K and V bytes of every sequence's context at the copy bandwidth measured first.
"""

from __future__ import annotations

import argparse
import math
import random
from pathlib import Path

import torch

from device_rates import copy_bandwidth, graph_us
from layerzero.kernels.triton import paged_attention as pa
from report_files import write_report

BLOCK = 16
HEADS, KV_HEADS = 32, 8
TILES = [(64, 4), (64, 8), (32, 2), (32, 4), (16, 1), (16, 2)]  # (keys per step, warps)
CASES = [(256, 195, 64), (256, 1000, 64), (128, 195, 64), (128, 1000, 64), (64, 195, 64), (64, 1000, 64),
         (256, 195, 128), (256, 1000, 128), (128, 195, 128), (64, 195, 128)]  # (sequences, context, head_dim)


def _inputs(batch: int, context: int, head_dim: int) -> tuple[list[torch.Tensor], torch.Tensor, torch.Tensor,
                                                                torch.Tensor, torch.Tensor]:
    per = -(-context // BLOCK)
    order = list(range(batch * per))
    random.Random(0).shuffle(order)
    kc = torch.randn(batch * per, BLOCK, KV_HEADS, head_dim, device="cuda", dtype=torch.bfloat16)
    tables = torch.tensor([order[i * per:(i + 1) * per] for i in range(batch)], device="cuda", dtype=torch.int32)
    ctx = torch.full((batch,), context, device="cuda", dtype=torch.int32)
    qs = [torch.randn(batch, HEADS, head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    return qs, kc, torch.randn_like(kc), tables, ctx


def _tile_call(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, tables: torch.Tensor, ctx: torch.Tensor,
               out: torch.Tensor, block_n: int, warps: int) -> None:
    batch, _, head_dim = q.shape
    pa._PAGED_DECODE((KV_HEADS, batch, 1), q, kc, vc, tables, ctx, out, out, out, out,
                     head_dim**-0.5 * math.log2(math.e), 0, HEADS // KV_HEADS, head_dim, BLOCK, q.stride(0),
                     q.stride(1), kc.stride(0), kc.stride(1), kc.stride(2), vc.stride(0), vc.stride(1), vc.stride(2),
                     tables.stride(0), out.stride(0), out.stride(1), 1, HAS_WINDOW=False, SPLIT=False, BLOCK_G=16,
                     BLOCK_N=block_n, BLOCK_D=head_dim, PRECISION="tf32", num_warps=warps, num_stages=2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/reports/decode_attention_tiles"))
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    rows = []
    for batch, context, head_dim in CASES:
        qs, kc, vc, tables, ctx = _inputs(batch, context, head_dim)
        floor_us = batch * context * KV_HEADS * head_dim * 2 * 2 / bandwidth * 1e6
        want = pa.paged_attention(qs[0], kc, vc, block_tables=tables, context_lens=ctx, scale=head_dim**-0.5,
                                  sliding_window=None, max_context_len=context, num_splits=1)
        picked = graph_us([lambda q=q: pa.paged_attention(q, kc, vc, block_tables=tables, context_lens=ctx,
                                                          scale=head_dim**-0.5, sliding_window=None,
                                                          max_context_len=context, num_splits=1) for q in qs])
        row = {"batch": batch, "context": context, "head_dim": head_dim, "floor_us": floor_us, "picked_us": picked,
               "picked_tile": pa._tile(head_dim, torch.bfloat16, batch * KV_HEADS / pa.sm_count(qs[0].device))}
        out = torch.empty_like(qs[0])
        for block_n, warps in TILES:
            _tile_call(qs[0], kc, vc, tables, ctx, out, block_n, warps)
            torch.testing.assert_close(out, want, rtol=2e-2, atol=2e-2)
            row[f"{block_n}x{warps}_us"] = graph_us([lambda q=q: _tile_call(q, kc, vc, tables, ctx, out, block_n,
                                                                               warps) for q in qs])
        rows.append(row)
        print({k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)
        del qs, kc, vc
    head = "| sequences | context | head_dim | picked (tile) | " + " | ".join(f"{n} keys, {w} warps" for n, w in TILES)
    lines = [f"# Paged decode attention per tile ({torch.cuda.get_device_name()})", "",
             f"`python benchmarks/decode_attention_tiles.py`; torch {torch.__version__}; bf16; copy bandwidth "
             f"{bandwidth / 1e12:.2f} TB/s; µs per call and, in brackets, the floor (K and V at copy bandwidth) over "
             "that time.", "", head + " |", "|---:|---:|---:|---:|" + "---:|" * len(TILES)]
    for r in rows:
        cells = [f"{r[f'{n}x{w}_us']:.1f} ({r['floor_us'] / r[f'{n}x{w}_us']:.2f})" for n, w in TILES]
        tile = f"{r['picked_tile'][0]}x{r['picked_tile'][1]}"
        picked = f"{r['picked_us']:.1f} ({r['floor_us'] / r['picked_us']:.2f}; {tile})"
        lines.append(f"| {r['batch']} | {r['context']} | {r['head_dim']} | {picked} | " + " | ".join(cells) + " |")
    data = {"gpu": torch.cuda.get_device_name(), "bandwidth": bandwidth, "rows": rows}
    write_report(args.out, data, "\n".join(lines))


if __name__ == "__main__":
    main()
