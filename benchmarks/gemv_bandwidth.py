"""Skinny GEMMs (batch 1-8 decode projections) as a fraction of copy bandwidth: cuBLAS beside a Triton GEMV sweep.

    python benchmarks/gemv_bandwidth.py --out DIR

For each projection of the Llama-3.2-1B and Llama-3.1-8B shapes (QKV, O, gate+up, down, LM head) and M in --rows:
y [M, N] = x [M, K] @ W [N, K]^T in bf16, timed inside a CUDA graph of at least 20 calls (no launch gaps), median of
10 replays. The calls cycle over copies of W that together exceed 256 MiB, so every call reads its weight from DRAM
as a decode step does (one weight reused would sit in the 50 MB L2). Bytes = the weight (N x K x 2) plus x and y;
fraction = bytes / time / the device copy bandwidth (device_rates.copy_bandwidth: 1 GiB copies, read + write).
Beside cuBLAS (torch.mm): a one-pass Triton GEMV (each program owns BLOCK_N output columns over all of K; M padded to
16 for tl.dot) over a small grid of tiles, reporting the best. It says where cuBLAS leaves bandwidth unused and
whether a plain Triton kernel takes it; layerzero's `triton.linear` (layerzero/kernels/triton/gemv.py) runs where it
measured faster.
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from device_rates import copy_bandwidth, graph_us
from report_files import write_report

SHAPES = {  # (N, K) per projection
    "llama-3.2-1b": {"qkv": (3072, 2048), "o": (2048, 2048), "gate_up": (16384, 2048), "down": (2048, 8192),
                     "lm_head": (128256, 2048)},
    "llama-3.1-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
    # one rank's shards at tensor parallelism 2: column-parallel QKV and gate+up, row-parallel O and down
    "llama-3.1-8b-tp2": {"qkv": (3072, 4096), "o": (4096, 2048), "gate_up": (14336, 4096), "down": (4096, 7168)},
    "qwen3-30b-a3b": {"qkv": (5120, 2048), "o": (2048, 4096)},  # its attention (the experts have their own kernels)
}
TILES = [dict(BLOCK_N=n, BLOCK_K=k, num_warps=w, num_stages=s)
         for n, k, w, s in itertools.product((16, 32, 64), (128, 256), (4, 8), (3, 4))]


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * K + k[None, :], mask=(rows[:, None] < M) & (k[None, :] < K), other=0.0)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * K + k[:, None], mask=(cols[None, :] < N) & (k[:, None] < K),
                    other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=(rows[:, None] < M) & (cols[None, :] < N))


def triton_gemv(x: torch.Tensor, w: torch.Tensor, y: torch.Tensor, tile: dict[str, int]) -> None:
    m, k = x.shape
    n = w.shape[0]
    _gemv[(triton.cdiv(n, tile["BLOCK_N"]),)](x, w, y, m, n, k, BLOCK_M=max(16, triton.next_power_of_2(m)),
                                              BLOCK_N=tile["BLOCK_N"],
                                              BLOCK_K=tile["BLOCK_K"], num_warps=tile["num_warps"],
                                              num_stages=tile["num_stages"])


L2_DEFEAT_BYTES = 256 * 2**20  # weight copies per projection add up to at least this (5x an H100's L2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--shapes", nargs="+", choices=sorted(SHAPES), default=sorted(SHAPES))
    parser.add_argument("--out", type=Path, required=True, help="writes OUT.md and OUT.json")
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    gpu = torch.cuda.get_device_name(0)
    lines = [f"# Skinny GEMMs vs copy bandwidth ({gpu})", "",
             f"`python benchmarks/gemv_bandwidth.py`; torch {torch.__version__}; bf16; copy bandwidth "
             f"{bandwidth / 1e12:.2f} TB/s; µs per call inside a CUDA graph of >= 20 calls over weight copies "
             "of >= 256 MiB in all, median of 10 replays.", "",
             "| shape | projection | M | weight MB | cuBLAS µs | fraction | best Triton GEMV µs | fraction | tile |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|"]
    rows: list[dict[str, Any]] = []
    for shape in args.shapes:
        for name, (n, k) in SHAPES[shape].items():
            w = torch.randn(n, k, dtype=torch.bfloat16, device="cuda") * 0.02
            copies = [w] + [w.clone() for _ in range(-(-L2_DEFEAT_BYTES // (n * k * 2)) - 1)]
            for m in args.rows:
                x = torch.randn(m, k, dtype=torch.bfloat16, device="cuda")
                y = torch.empty(m, n, dtype=torch.bfloat16, device="cuda")
                nbytes = (n * k + m * k + m * n) * 2
                cublas = graph_us([lambda c=c: torch.mm(x, c.t(), out=y) for c in copies])
                want = x.float() @ w.float().t()
                best: tuple[float, dict[str, int]] | None = None
                for tile in TILES:
                    try:
                        triton_gemv(x, w, y, tile)
                        torch.cuda.synchronize()
                        if not torch.allclose(y.float(), want, rtol=2e-2, atol=2e-2):
                            continue
                        us = graph_us([lambda c=c, t=tile: triton_gemv(x, c, y, t) for c in copies])
                    except Exception:  # noqa: BLE001 - a tile that does not compile or fit is skipped
                        continue
                    if best is None or us < best[0]:
                        best = (us, tile)
                frac = nbytes / (cublas * 1e-6) / bandwidth
                row = {"shape": shape, "projection": name, "m": m, "cublas_us": cublas, "cublas_fraction": frac}
                if best is not None:
                    row |= {"triton_us": best[0], "triton_fraction": nbytes / (best[0] * 1e-6) / bandwidth,
                            "tile": best[1]}
                rows.append(row)
                tile_text = " ".join(f"{k_}={v}" for k_, v in best[1].items()) if best else "—"
                triton_text = (f"{best[0]:.1f} | {row['triton_fraction']:.2f} | {tile_text} |" if best
                               else "— | — | — |")
                lines.append(f"| {shape} | {name} | {m} | {n * k * 2 / 1e6:.1f} | {cublas:.1f} | {frac:.2f} | "
                             + triton_text)
                print(lines[-1], flush=True)
            del w, copies
    write_report(args.out, {"gpu": gpu, "copy_bandwidth": bandwidth, "rows": rows}, "\n".join(lines))


if __name__ == "__main__":
    main()
