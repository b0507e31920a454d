"""Paged prefill attention (layerzero's Triton kernel) per tile configuration, beside torch's flash SDPA on the same
causal work: which tiles keep an H100/H200 busy on a lone prompt, a chunk after a cached prefix, and a full batch.

    python benchmarks/prefill_attention_tiles.py [--out DIR]

Each case is Llama's attention shape (32 query heads, 8 KV heads) over a paged cache of 16-token blocks in random
order; µs per call: 10 calls captured in a CUDA graph (the host's launch cost left out), median of 15 replays;
TFLOP/s count the causal (query, key) pairs only (4 * pairs * heads * head_dim). SDPA runs the same queries against
contiguous K/V per sequence (no pages), one call per sequence, so it is the bar for the kernel's arithmetic, not its
paging.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from device_rates import graph_us
from layerzero.kernels.triton import varlen_attention as va
from report_files import write_report

BLOCK = 16
HEADS, KV_HEADS = 32, 8
CONFIGS = [va.TileConfig(128, 64, 8, 3), va.TileConfig(128, 64, 4, 3), va.TileConfig(64, 64, 4, 3),
           va.TileConfig(64, 64, 4, 2), va.TileConfig(64, 32, 4, 3), va.TileConfig(128, 32, 4, 3),
           va.TileConfig(64, 128, 4, 2), va.TileConfig(128, 128, 8, 2)]


@dataclass(frozen=True)
class Case:
    name: str
    head_dim: int
    queries: tuple[int, ...]  # new tokens per sequence
    contexts: tuple[int, ...]  # cached tokens per sequence after the step (queries are the last ones)


CASES = [
    Case("1k prompt, one step", 64, (1024,), (1024,)),
    Case("2nd 512-token chunk of a 1k prompt", 64, (512,), (1024,)),
    Case("4 x 512-token prompts", 64, (512,) * 4, (512,) * 4),
    Case("16 x 512-token prompts", 64, (512,) * 16, (512,) * 16),
    Case("1k prompt, one step, head_dim 128", 128, (1024,), (1024,)),
    Case("4k prompt, one step, head_dim 128", 128, (4096,), (4096,)),
]


def pairs(case: Case) -> int:
    """Visible (query, key) pairs: each query sees the keys up to its own position."""
    return sum(q * (c - q) + q * (q + 1) // 2 for q, c in zip(case.queries, case.contexts))


def run_case(case: Case) -> dict[str, float]:
    d, dev = case.head_dim, "cuda"
    blocks_per = [-(-c // BLOCK) for c in case.contexts]
    num_blocks = sum(blocks_per) + 8
    kc = torch.randn(num_blocks, BLOCK, KV_HEADS, d, device=dev, dtype=torch.bfloat16)
    vc = torch.randn_like(kc)
    order = torch.randperm(num_blocks, device=dev).to(torch.int32)
    width = max(blocks_per)
    tables = torch.zeros(len(case.contexts), width, dtype=torch.int32, device=dev)
    start = 0
    for i, n in enumerate(blocks_per):
        tables[i, :n] = order[start : start + n]
        start += n
    q = torch.randn(sum(case.queries), HEADS, d, device=dev, dtype=torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(case.queries).cumsum(0).tolist()], dtype=torch.int32, device=dev)
    ctx = torch.tensor(case.contexts, dtype=torch.int32, device=dev)
    scale = d**-0.5
    out: dict[str, float] = {}
    original = va.tile_config
    try:
        for cfg in CONFIGS:
            va.tile_config = lambda head_dim, dtype, cfg=cfg: cfg
            call = lambda: va.paged_prefill_attention(q, kc, vc, block_tables=tables, cu_seqlens_q=cu, context_lens=ctx,
                                                      max_seqlen_q=0, max_context_len=0, scale=scale,
                                                      sliding_window=None)
            try:
                out[f"{cfg.block_m}x{cfg.block_n} w{cfg.num_warps} s{cfg.num_stages}"] = graph_us([call], calls=10, replays=15)
            except Exception as exc:  # out of shared memory for this tile: say so
                print(f"{case.name}: {cfg} failed: {type(exc).__name__}")
    finally:
        va.tile_config = original
    # SDPA: per sequence, the queries as the last rows of a causal attention over contiguous keys
    ks = [torch.randn(1, KV_HEADS, c, d, device=dev, dtype=torch.bfloat16) for c in case.contexts]
    qs = [torch.randn(1, HEADS, n, d, device=dev, dtype=torch.bfloat16) for n in case.queries]

    def sdpa() -> None:
        for qi, ki in zip(qs, ks):
            if qi.shape[2] == ki.shape[2]:
                F.scaled_dot_product_attention(qi, ki, ki, is_causal=True, enable_gqa=True)
            else:  # a chunk after a prefix: an explicit bottom-right causal mask
                n, c = qi.shape[2], ki.shape[2]
                mask = torch.ones(n, c, dtype=torch.bool, device=dev).tril(c - n)
                F.scaled_dot_product_attention(qi, ki, ki, attn_mask=mask, enable_gqa=True)

    out["torch SDPA"] = graph_us([sdpa], calls=10, replays=15)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/reports"))
    args = parser.parse_args()
    lines = [f"# Paged prefill attention by tile configuration ({torch.cuda.get_device_name()})", "",
             f"`python benchmarks/prefill_attention_tiles.py`; torch {torch.__version__}; bf16, {HEADS} query heads, "
             f"{KV_HEADS} KV heads, 16-token blocks in random order; µs per call in a CUDA graph (median of 15 "
             "replays of 10 calls), TFLOP/s of the causal "
             "pairs in brackets. The first configuration was the kernel's choice before this benchmark, the fourth is "
             "its choice now.", ""]
    results = {case.name: run_case(case) for case in CASES}
    columns = list(next(iter(results.values())))
    lines += ["| case | " + " | ".join(columns) + " |", "|---|" + "---:|" * len(columns)]
    for case in CASES:
        flops = 4 * pairs(case) * HEADS * case.head_dim
        row = results[case.name]
        cells = [f"{row[c]:.0f} ({flops / row[c] / 1e6:.0f})" if c in row else "—" for c in columns]
        lines.append(f"| {case.name} | " + " | ".join(cells) + " |")
    gpu = torch.cuda.get_device_name().lower().replace("nvidia", "").split()[0]
    markdown = "\n".join(lines) + "\n"
    write_report(args.out / f"prefill_attention_tiles_{gpu}", {"results": results}, markdown)
    print(markdown)


if __name__ == "__main__":
    main()
