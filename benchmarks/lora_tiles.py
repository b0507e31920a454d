"""Tile sweep of the per-row LoRA kernels (triton.lora_shrink_rows / lora_expand_rows) and the slot-tile ones at the
Llama-3.1-8B projections' shapes (rank 16 stacked per fused part: qkv 48, gate_up 32, o and down 16), 1 row and 64 rows
over 8 adapter slots, each call replayed from a CUDA graph (device_rates.graph_us: µs per call).

    python benchmarks/lora_tiles.py --out benchmarks/reports/lora_tiles_h200
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from device_rates import graph_us
from report_files import write_report

SITES = {"qkv": (4096, 48, 6144), "o": (4096, 16, 4096), "gate_up": (4096, 32, 28672), "down": (14336, 16, 4096)}
SHRINK_TILES = [(512, 1024, 4), (1024, 4096, 4), (512, 16384, 4), (1024, 16384, 4), (2048, 16384, 8), (1024, 8192, 4)]
EXPAND_TILES = [(64, 4), (128, 4), (32, 2), (256, 8), (512, 8)]
SLOT_SHRINK_TILES = [(64, 64, 512, 4), (64, 128, 1024, 4), (64, 64, 256, 4), (16, 128, 512, 4), (32, 128, 512, 4)]
SLOT_EXPAND_TILES = [(64, 128, 8), (64, 128, 4), (64, 256, 4), (64, 256, 8), (32, 128, 4)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    from layerzero.kernels.triton import lora as tl_lora

    rows_list, slots, dtype = (1, 16, 64), 8, torch.bfloat16
    data: dict[str, Any] = {"shrink": [], "expand": [], "tiles": []}
    gen = torch.Generator("cuda").manual_seed(0)
    for site, (k, r, n) in SITES.items():
        a = torch.randn(slots, r, k, device="cuda", dtype=dtype, generator=gen) * 0.02
        b = torch.randn(slots, n, r, device="cuda", dtype=dtype, generator=gen) * 0.02
        for rows in rows_list:
            x = torch.randn(rows, k, device="cuda", dtype=dtype, generator=gen)
            y = torch.zeros(rows, n, device="cuda", dtype=dtype)
            ids = torch.arange(rows, device="cuda") % slots
            h = tl_lora.lora_shrink_rows(x, a, ids)
            for tile in SHRINK_TILES:
                us = graph_us([lambda tile=tile: tl_lora.lora_shrink_rows(x, a, ids, tile)])
                data["shrink"].append({"site": site, "rows": rows, "tile": tile, "us": us})
                print(f"shrink {site} rows={rows} {tile}: {us:.2f} us", flush=True)
            for tile in EXPAND_TILES:
                us = graph_us([lambda tile=tile: tl_lora.lora_expand_rows(y, h, b, ids, tile)])
                data["expand"].append({"site": site, "rows": rows, "tile": tile, "us": us})
                print(f"expand {site} rows={rows} {tile}: {us:.2f} us", flush=True)
            for tile in SLOT_SHRINK_TILES:
                us = graph_us([lambda tile=tile: tl_lora.lora_shrink(x, a, ids, tile)])
                data["tiles"].append({"kind": "shrink", "site": site, "rows": rows, "tile": tile, "us": us})
                print(f"slot-tile shrink {site} rows={rows} {tile}: {us:.2f} us", flush=True)
            for tile in SLOT_EXPAND_TILES:
                us = graph_us([lambda tile=tile: tl_lora.lora_expand(y, h, b, ids, tile)])
                data["tiles"].append({"kind": "expand", "site": site, "rows": rows, "tile": tile, "us": us})
                print(f"slot-tile expand {site} rows={rows} {tile}: {us:.2f} us", flush=True)
        write_report(args.out, data, markdown(data))
    write_report(args.out, data, markdown(data))


def markdown(d: dict[str, Any]) -> str:
    lines = ["# LoRA kernel tiles, Llama-3.1-8B projections, bf16 (µs per call from a CUDA graph)", "",
             "`python benchmarks/lora_tiles.py --out ...`", ""]
    for kind in ("shrink", "expand"):
        lines += [f"## per-row {kind}", "", "| site | rows | tile | µs |", "|---|---|---|---|"]
        lines += [f"| {e['site']} | {e['rows']} | {e['tile']} | {e['us']:.2f} |" for e in d[kind]]
        lines.append("")
    lines += ["## slot tiles", "", "| kernel | site | rows | tile | µs |", "|---|---|---|---|---|"]
    lines += [f"| {e['kind']} | {e['site']} | {e['rows']} | {e['tile']} | {e['us']:.2f} |" for e in d["tiles"]]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
