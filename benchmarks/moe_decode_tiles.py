"""The MoE decode path's two Triton kernels (layerzero's triton.fused_moe_decode) per tile, as a fraction of copy
bandwidth: which (BLOCK_N, BLOCK_K, warps) reads the routed experts fastest at the Qwen3-30B-A3B shape.

    python benchmarks/moe_decode_tiles.py [--out STEM]
    python benchmarks/moe_decode_tiles.py --fp8 --out benchmarks/reports/moe_decode_tiles_fp8_h200

Hidden 2048, 128 experts, top 8, expert intermediate 768, bf16 random weights; batch 1 and 4, routing from a random
router; µs per call: 20 calls captured in one CUDA graph cycling over 4 routings (so the experts come from HBM, not
L2), median of 10 replays. Floor = the routed experts' gate+up (first kernel) or down (second) bytes at the copy
bandwidth measured first. The tiles in use are DECODE_GATE_UP_TILE / DECODE_DOWN_TILE in
layerzero/kernels/triton/moe_decode.py; with --fp8 the same experts as float8 e4m3 in 128 x 128 blocks
(lz.fused_moe_w8's decode path), against DECODE_*_TILE_W8.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

import torch

import layerzero as lz
from device_rates import copy_bandwidth, graph_us
from infer.models.quant import W8Experts
from layerzero.kernels.triton import moe, moe_decode
from report_files import write_report

HIDDEN, EXPERTS, TOP_K, INNER = 2048, 128, 8, 768
GATE_UP = list(itertools.product((8, 16, 32), (128, 256, 512), (4, 8)))
DOWN = list(itertools.product((2, 4, 8), (64, 128, 256), (4, 8)))
GATE_UP_W8 = list(itertools.product((8, 16, 32), (128, 256, 512), (4, 8)))
DOWN_W8 = list(itertools.product((4, 8, 16), (128, 256, 512), (4, 8)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/reports/moe_decode_tiles"))
    parser.add_argument("--fp8", action="store_true", help="the experts as float8 e4m3 in 128 x 128 blocks")
    parser.add_argument("--kernels", default="gate_up,down", help="which of the two kernels to sweep")
    args = parser.parse_args()
    torch.manual_seed(0)
    bw = copy_bandwidth()
    w13 = torch.randn(EXPERTS, 2 * INNER, HIDDEN, device="cuda", dtype=torch.bfloat16) * 0.02
    w2 = torch.randn(EXPERTS, HIDDEN, INNER, device="cuda", dtype=torch.bfloat16) * 0.02
    scales, weight_bytes = None, 2
    if args.fp8:
        q13, q2 = W8Experts.quantize(w13), W8Experts.quantize(w2)
        w13, w2, weight_bytes = q13.weight, q2.weight, 1
        scales = moe.Scales(q13.scale, q2.scale, q13.block_size)
    tiles = {"gate_up": (GATE_UP_W8, moe_decode.DECODE_GATE_UP_TILE_W8) if args.fp8 else (GATE_UP, moe_decode.DECODE_GATE_UP_TILE),
             "down": (DOWN_W8, moe_decode.DECODE_DOWN_TILE_W8) if args.fp8 else (DOWN, moe_decode.DECODE_DOWN_TILE)}
    router = torch.randn(EXPERTS, HIDDEN, device="cuda", dtype=torch.bfloat16)
    rows = []
    for batch in (1, 4):
        xs = [torch.randn(batch, HIDDEN, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
        routes = [lz.moe_route(x @ router.T, TOP_K, renormalize=True) for x in xs]
        routed = sum(ids.unique().numel() for _, ids in routes) / len(routes)
        routings = [moe_decode.Routing.of_ids(ids, w) for w, ids in routes]
        h = torch.empty(batch * TOP_K, INNER, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(batch, HIDDEN, device="cuda", dtype=torch.bfloat16)
        for kernel, nbytes in (("gate_up", 2 * INNER * HIDDEN * weight_bytes), ("down", HIDDEN * INNER * weight_bytes)):
            if kernel not in args.kernels.split(","):
                continue
            floor = routed * nbytes / bw * 1e6
            candidates, in_use = tiles[kernel]
            for tile in candidates:
                if kernel == "gate_up":
                    calls = [lambda x=x, r=r: moe_decode.decode_gate_up(x, w13, h, r, "silu", *tile, scales=scales)
                             for x, r in zip(xs, routings)]
                else:
                    calls = [lambda r=r: moe_decode.decode_down(h, w2, out, r, *tile, scales=scales)
                             for r in routings]
                us = graph_us(calls)
                chosen = tile == in_use
                rows.append({"batch": batch, "kernel": kernel, "tile": tile, "us": us, "floor_us": floor,
                             "fraction": floor / us, "chosen": chosen})
                print(rows[-1], flush=True)
    gpu = torch.cuda.get_device_name()
    lines = [f"# MoE decode path tiles{', fp8 experts' if args.fp8 else ''} ({gpu})", "",
             f"`python benchmarks/moe_decode_tiles.py{' --fp8' if args.fp8 else ''}`; torch {torch.__version__}; copy bandwidth {bw / 1e12:.2f} TB/s; "
             "µs per call from a CUDA graph over 4 routings; floor = the routed experts' bytes at copy bandwidth.", "",
             "| batch | kernel | best tile (BLOCK_N, BLOCK_K, warps) | µs | fraction | chosen tile | µs | fraction |",
             "|---:|---|---|---:|---:|---|---:|---:|"]
    for batch, kernel in itertools.product((1, 4), ("gate_up", "down")):
        mine = [r for r in rows if r["batch"] == batch and r["kernel"] == kernel]
        if not mine:
            continue
        best = min(mine, key=lambda r: r["us"])
        chosen = next(r for r in mine if r["chosen"])
        lines.append(f"| {batch} | {kernel} | {best['tile']} | {best['us']:.1f} | {best['fraction']:.2f} | "
                     f"{chosen['tile']} | {chosen['us']:.1f} | {chosen['fraction']:.2f} |")
    write_report(args.out, {"gpu": gpu, "copy_bandwidth": bw, "rows": rows}, "\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
