"""Kernel boundaries of a batch-1 decode step: a layer's chain of norm, GEMVs and activation, with and without
programmatic dependent launch (PDL), inside a CUDA graph.

    python benchmarks/pdl_chain.py --out STEM

At batch 1 a Llama-3.2-1B layer is ~10 kernels, most of them reading a few MB: each boundary costs the drain of one
kernel and the ramp of the next. With PDL (Hopper's griddepcontrol) a kernel's programs launch while its predecessor
finishes and wait for its results at their first statement (layerzero/kernels/triton/launch.py). Per layer: RMSNorm ->
QKV GEMV -> O GEMV (over the q columns) -> RMSNorm -> gate+up GEMV -> SiLU-and-mul -> down GEMV, over each layer's
own weights (past L2), a whole stack of layers per replay. Variants (VARIANTS): without PDL, cuBLAS or Triton GEMVs;
with PDL for every Triton kernel, the GEMVs all Triton, or cuBLAS for the down projection, or cuBLAS for the weights
under 64 MiB. (Prefetching into L2 before the wait, the first two weight tiles or a weight of at most 32 MiB whole,
measured slower on an H100: 958 -> 970 and, in another run, 962 -> 1004 µs per 1B stack; dropped.)
Fraction = the weights' bytes / time / copy bandwidth.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl
from device_rates import copy_bandwidth, graph_us
from report_files import write_report
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

VARIANTS = {  # name: (PDL, which projections run on cuBLAS)
    "cublas": (False, "all"), "triton": (False, "none"), "pdl": (True, "none"), "pdl_cublas_down": (True, "down"),
    "pdl_cublas_small": (True, "small"),
}
SMALL = 64 * 2**20  # layerzero's GEMV rule before PDL: cuBLAS for weights under 64 MiB
SHAPES = {"llama-3.2-1b": (16, 2048, 3072, 8192), "llama-3.1-8b": (32, 4096, 6144, 14336)}  # layers, H, qkv, I


@triton.jit
def _norm(x_ptr, w_ptr, y_ptr, N, x_sm, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < N
    w = tl.load(w_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    x = tl.load(x_ptr + row * x_sm + offs, mask=mask, other=0.0).to(tl.float32)
    r = tl.rsqrt(tl.sum(x * x) / N + 1e-5)
    tl.store(y_ptr + row * N + offs, (x * r * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _act(x_ptr, y_ptr, I, BLOCK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < I
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    g = tl.load(x_ptr + row * 2 * I + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * 2 * I + I + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * I + offs, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gemv(x_ptr, w_ptr, y_ptr, M, N, K, x_sm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
          PDL: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.arange(0, BLOCK_M)
    r_mask, c_mask = rows < M, cols < N
    if PDL:
        gdc_wait()
        gdc_launch_dependents()
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + rows[:, None] * x_sm + k[None, :], mask=r_mask[:, None], other=0.0)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * K + k[:, None], mask=c_mask[None, :], other=0.0)
        acc = tl.dot(x, w, acc)
    tl.store(y_ptr + rows[:, None] * N + cols[None, :], acc.to(y_ptr.dtype.element_ty),
             mask=r_mask[:, None] & c_mask[None, :])


class Chain:
    """One stack of layers' weights and buffers; `forward(variant)` launches the whole chain once."""

    def __init__(self, shape: str) -> None:
        self.layers, self.h, self.qkv, self.i = SHAPES[shape]
        dev, bf = "cuda", torch.bfloat16
        self.w = [{"qkv": torch.randn(self.qkv, self.h, device=dev, dtype=bf) * 0.02,
                   "o": torch.randn(self.h, self.h, device=dev, dtype=bf) * 0.02,
                   "gate_up": torch.randn(2 * self.i, self.h, device=dev, dtype=bf) * 0.02,
                   "down": torch.randn(self.h, self.i, device=dev, dtype=bf) * 0.02,
                   "n1": torch.ones(self.h, device=dev, dtype=bf), "n2": torch.ones(self.h, device=dev, dtype=bf)}
                  for _ in range(self.layers)]
        self.bytes = sum(t.numel() * 2 for layer in self.w for t in layer.values())
        self.x = torch.randn(1, self.h, device=dev, dtype=bf)
        self.buf = {"h": torch.empty(1, self.h, device=dev, dtype=bf),
                    "qkv": torch.empty(1, self.qkv, device=dev, dtype=bf),
                    "o": torch.empty(1, self.h, device=dev, dtype=bf),
                    "gu": torch.empty(1, 2 * self.i, device=dev, dtype=bf),
                    "a": torch.empty(1, self.i, device=dev, dtype=bf),
                    "y": torch.empty(1, self.h, device=dev, dtype=bf)}

    def _linear(self, variant: str, name: str, x: torch.Tensor, k: int, w: torch.Tensor, y: torch.Tensor) -> None:
        pdl, on_cublas = VARIANTS[variant]
        if on_cublas == "all" or on_cublas == name or (on_cublas == "small" and w.numel() * 2 < SMALL):
            torch.mm(x[:, :k], w.t(), out=y)
            return
        n = w.shape[0]
        block_n = 64 if n >= 65536 else 32
        block_k = 128 if k <= 4096 else 256
        _gemv[(triton.cdiv(n, block_n),)](x, w, y, 1, n, k, x.stride(0), BLOCK_M=16, BLOCK_N=block_n,
                                          BLOCK_K=block_k, PDL=pdl, num_warps=4,
                                          num_stages=4 if block_k == 256 else 3, launch_pdl=pdl)

    def forward(self, variant: str) -> torch.Tensor:
        pdl = VARIANTS[variant][0]
        b, x = self.buf, self.x
        for layer in self.w:
            _norm[(1,)](x, layer["n1"], b["h"], self.h, x.stride(0), BLOCK=triton.next_power_of_2(self.h), PDL=pdl,
                        launch_pdl=pdl)
            self._linear(variant, "qkv", b["h"], self.h, layer["qkv"], b["qkv"])
            self._linear(variant, "o", b["qkv"], self.h, layer["o"], b["o"])
            _norm[(1,)](b["o"], layer["n2"], b["h"], self.h, self.h, BLOCK=triton.next_power_of_2(self.h), PDL=pdl,
                        launch_pdl=pdl)
            self._linear(variant, "gate_up", b["h"], self.h, layer["gate_up"], b["gu"])
            _act[(triton.cdiv(self.i, 1024), 1)](b["gu"], b["a"], self.i, BLOCK=1024, PDL=pdl, launch_pdl=pdl)
            self._linear(variant, "down", b["a"], self.i, layer["down"], b["y"])
            x = b["y"]
        return x


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--shapes", nargs="+", default=sorted(SHAPES), choices=sorted(SHAPES))
    args = parser.parse_args()
    bandwidth = copy_bandwidth()
    rows: list[dict[str, Any]] = []
    for shape in args.shapes:
        chain = Chain(shape)
        outs = {}
        for variant in VARIANTS:
            try:
                outs[variant] = chain.forward(variant).float().clone()
                us = graph_us([lambda v=variant: chain.forward(v)], calls=2)
            except Exception as exc:  # a variant the toolchain cannot build is reported, not fatal
                print(f"{shape} {variant}: {exc!r}", flush=True)
                continue
            rows.append({"shape": shape, "variant": variant, "us": us, "us_per_layer": us / chain.layers,
                         "fraction": chain.bytes / (us * 1e-6) / bandwidth})
            print(rows[-1], flush=True)
        if "pdl" in outs and not torch.equal(outs["pdl"], outs["triton"]):
            raise SystemExit(f"{shape}: the PDL chain's output differs from the chain without PDL")
        del chain
        torch.cuda.empty_cache()
    lines = [f"# Kernel boundaries with programmatic dependent launch ({torch.cuda.get_device_name()})", "",
             f"`python benchmarks/pdl_chain.py`; torch {torch.__version__}, triton {triton.__version__}; batch 1, "
             f"bf16; copy bandwidth {bandwidth / 1e12:.2f} TB/s; a whole stack per CUDA graph replay, median of 10.",
             "", "| shape | variant | µs per stack | µs per layer | fraction of copy bandwidth |",
             "|---|---|---:|---:|---:|"]
    lines += [f"| {r['shape']} | {r['variant']} | {r['us']:.0f} | {r['us_per_layer']:.1f} | {r['fraction']:.2f} |"
              for r in rows]
    write_report(args.out, {"gpu": torch.cuda.get_device_name(), "copy_bandwidth": bandwidth, "rows": rows},
                 "\n".join(lines))


if __name__ == "__main__":
    main()
