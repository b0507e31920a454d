"""Does warming a projection's weights in L2 from a second stream, while a decode step's latency-bound kernels run,
make the projection read faster? A CUDA-graph chain of batch-1 decode layers with torch's own kernels (RMSNorm,
cuBLAS projections, SDPA over a short context), timed per layer with and without a prefetch kernel forked onto a
side stream.

    python benchmarks/l2_prefetch.py [--shape qwen3-30b-a3b|llama-3.1-8b-tp2] [--out DIR]

Each layer: norm, QKV, attention (a few µs, little memory traffic), O, residual and norm, router (MoE shape), the
MLP (the MoE shape's 8 routed experts stood in for by dense GEMVs of the same bytes), residual. Variants fork the
prefetch at one or two points: `o@attn` warms this layer's O weights right after QKV (they are read after attention);
`qkv@mlp` warms the next layer's QKV after the MLP's first projection (read after the down projection and a norm).
`hot o` reuses one O matrix in every layer (the MLP's stream of 75-350 MB a layer evicts it between uses, so it
reads like `none`: no floor).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

SHAPES = {  # hidden, q heads, kv heads, head dim, MLP intermediate (dense GEMVs of the routed experts' bytes), layers
    "qwen3-30b-a3b": dict(hidden=2048, heads=32, kv_heads=4, head_dim=128, inter=8 * 768, layers=48, router=128),
    "llama-3.1-8b-tp2": dict(hidden=4096, heads=16, kv_heads=4, head_dim=128, inter=7168, layers=32, router=0),
    "llama-3.1-8b": dict(hidden=4096, heads=32, kv_heads=8, head_dim=128, inter=14336, layers=32, router=0),
}
CONTEXT = 256
LINE = 128


@triton.jit
def _prefetch_lines(base, n_lines, BLOCK: tl.constexpr):
    """prefetch.global.L2::evict_last of one 128-byte line per element (addresses as integers)."""
    line = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n_lines - 1).to(tl.int64)
    tl.inline_asm_elementwise("prefetch.global.L2::evict_last [$1]; mov.u32 $0, 0;", "=r,l", [base + line * 128],
                              dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _prefetch_bulk(base, n_chunks, CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    """cp.async.bulk.prefetch.L2 of one CHUNK-byte piece per element (the TMA unit streams it)."""
    chunk = tl.minimum(tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), n_chunks - 1).to(tl.int64)
    size = tl.full([BLOCK], CHUNK, tl.int32)
    tl.inline_asm_elementwise("cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0;", "=r,l,r",
                              [base + chunk * CHUNK, size], dtype=tl.int32, is_pure=False, pack=1)


def prefetch(w: torch.Tensor, kind: str) -> None:
    n = w.numel() * w.element_size()
    if kind == "lines":
        block = 512
        _prefetch_lines[(triton.cdiv(n // LINE, block),)](w.data_ptr(), n // LINE, BLOCK=block, num_warps=4)
    else:
        chunk, block = 4096, 128
        _prefetch_bulk[(triton.cdiv(n // chunk, block),)](w.data_ptr(), n // chunk, CHUNK=chunk, BLOCK=block,
                                                        num_warps=4)


class Layers:
    """Random bf16 weights of every layer (distinct, so no layer's weights stay in L2 for the next)."""

    def __init__(self, s: dict, hot_o: bool) -> None:
        d, h, kv, hd, inter = s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["inter"]
        g = lambda *shape: torch.randn(*shape, device="cuda", dtype=torch.bfloat16) * 0.02  # noqa: E731
        self.s = s
        self.qkv = [g((h + 2 * kv) * hd, d) for _ in range(s["layers"])]
        one_o = g(d, h * hd)
        self.o = [one_o if hot_o else g(d, h * hd) for _ in range(s["layers"])]
        self.gu = [g(2 * inter, d) for _ in range(s["layers"])]
        self.down = [g(d, inter) for _ in range(s["layers"])]
        self.router = [g(s["router"], d) for _ in range(s["layers"])] if s["router"] else None
        self.k = g(1, kv, CONTEXT, hd)
        self.v = g(1, kv, CONTEXT, hd)
        self.norm_w = torch.ones(d, device="cuda", dtype=torch.bfloat16)


def step(m: Layers, x: torch.Tensor, points: set[str], kind: str, side: torch.cuda.Stream) -> torch.Tensor:
    s = m.s
    main = torch.cuda.current_stream()
    h, kv, hd, inter = s["heads"], s["kv_heads"], s["head_dim"], s["inter"]

    def fork(w: torch.Tensor) -> None:
        side.wait_stream(main)
        with torch.cuda.stream(side):
            prefetch(w, kind)

    for i in range(s["layers"]):
        qkv = F.rms_norm(x, (s["hidden"],), m.norm_w) @ m.qkv[i].t()
        if "o@attn" in points:
            fork(m.o[i])
        q = qkv[:, : h * hd].view(1, h, 1, hd)
        a = F.scaled_dot_product_attention(q, m.k, m.v, enable_gqa=True)
        x = x + a.reshape(1, h * hd) @ m.o[i].t()
        y = F.rms_norm(x, (s["hidden"],), m.norm_w)
        if m.router is not None:
            logits = (y @ m.router[i].t()).float()
            w = torch.softmax(logits, -1).topk(8).values.sum().to(y.dtype)
            y = y * w
        gu = y @ m.gu[i].t()
        if "qkv@mlp" in points and i + 1 < s["layers"]:
            fork(m.qkv[i + 1])
        x = x + (F.silu(gu[:, :inter]) * gu[:, inter:]) @ m.down[i].t()
    if points:
        main.wait_stream(side)  # the side stream rejoins before the capture ends (it only read)
    return x


def time_variant(m: Layers, points: set[str], kind: str, replays: int = 50) -> tuple[float, torch.Tensor]:
    """Median µs a layer over `replays` replays of one captured step."""
    side = torch.cuda.Stream()
    x0 = torch.randn(1, m.s["hidden"], device="cuda", dtype=torch.bfloat16,
                     generator=torch.Generator("cuda").manual_seed(1))  # the same input for every variant
    for _ in range(2):
        step(m, x0, points, kind, side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step(m, x0, points, kind, side)
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / m.s["layers"])
    return statistics.median(times), out.clone()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="qwen3-30b-a3b", choices=list(SHAPES))
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    args = parser.parse_args()
    torch.manual_seed(0)
    s = SHAPES[args.shape]
    cold, hot = Layers(s, hot_o=False), Layers(s, hot_o=True)
    rows = []
    base_us, base_out = time_variant(cold, set(), "lines")
    rows.append(("none", "", base_us))
    rows.append(("hot o", "", time_variant(hot, set(), "lines")[0]))
    for kind in ("lines", "bulk"):
        for points in ({"o@attn"}, {"qkv@mlp"}, {"o@attn", "qkv@mlp"}):
            us, out = time_variant(cold, points, kind)
            assert torch.equal(out, base_out), "a prefetch changed the result"
            rows.append((" + ".join(sorted(points)), kind, us))
    lines = [f"# L2 prefetch from a side stream: {args.shape}, batch-1 decode layers in one CUDA graph "
             f"({torch.cuda.get_device_name()})", "",
             f"`python benchmarks/l2_prefetch.py --shape {args.shape}`; torch {torch.__version__}; medians of 50 "
             "replays.", "", "| prefetch | instruction | µs a layer | vs none |", "|---|---|---:|---:|"]
    lines += [f"| {p or '-'} | {k or '-'} | {us:.2f} | {us / base_us:.3f} |" for p, k, us in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    (out / f"l2_prefetch_{args.shape}.md").write_text(text)
    (out / f"l2_prefetch_{args.shape}.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
