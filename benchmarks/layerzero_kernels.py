"""CUDA timings of layerzero's Triton kernels against the PyTorch reference (and SDPA), at real model shapes.

    python benchmarks/layerzero_kernels.py [--out DIR] [--dtype bfloat16] [--models llama-3.2-1b,...]

Shapes: Llama-3.2-1B (hidden 2048, 32/8 heads, head_dim 64), Llama-3.1-8B (4096, 32/8, 128) and
Gemma-3-1B (1152, 4/1, 256, sliding window 512); decode batches 1/16/64 at contexts 1k/4k, prefill
of 1k and 8k tokens. Each (case, implementation) gets the median of triton.testing.do_bench (CUDA
events, L2 flushed between runs; launch overhead included) and, for decode-sized cases, the median
of CUDA-graph replays (kernel time alone, L2 warm). Memory-bound kernels report GB/s from the
eager timing (cold L2) and its share of the measured device copy bandwidth; prefill attention
reports TFLOP/s. Every case also records the
largest difference between the Triton output and the reference's.

Writes layerzero_kernels.{json,md} to DIR (default: $OUT when set, else benchmarks/reports/).
Needs only torch, triton and layerzero; about 2-3 minutes on an H100.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
from triton.testing import do_bench, do_bench_cudagraph

from device_rates import copy_bandwidth
from layerzero.kernels.reference import activation as act_ref
from layerzero.kernels.reference import attention as attn_ref
from layerzero.kernels.reference import kv_cache as kv_ref
from layerzero.kernels.reference import norm as norm_ref
from layerzero.kernels.reference import rope as rope_ref
from layerzero.kernels.triton import activation, kv_cache, norm, paged_attention, rope, varlen_attention

REPORTS = Path(__file__).parent / "reports"
BLOCK_SIZE = 16
DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXTS = (1024, 4096)
PREFILL_TOKENS = (1024, 8192)
ROW_TOKENS = (1, 64, 1024, 8192)  # decode batches and prefill chunks for the row-wise ops


@dataclass(frozen=True)
class Model:
    """The shapes of one model that the kernels see."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    window: int | None
    activation: str


MODELS = {
    "llama-3.2-1b": Model(2048, 32, 8, 64, 8192, None, "silu"),
    "llama-3.1-8b": Model(4096, 32, 8, 128, 14336, None, "silu"),
    "gemma-3-1b": Model(1152, 4, 1, 256, 6912, 512, "gelu_tanh"),
}


@dataclass
class Case:
    """One op at one shape: implementations to time (first is Triton, second the reference), work done."""

    op: str
    model: str
    shape: str
    impls: dict[str, Callable[[], object]]
    bytes: int = 0
    flops: int = 0
    decode: bool = False  # also timed as CUDA-graph replays
    no_graph: frozenset[str] = frozenset()  # implementations that cannot be captured (they synchronize)


@dataclass
class Result:
    op: str
    model: str
    shape: str
    impl: str
    eager_us: float | None
    graph_us: float | None
    gbps: float | None
    pct_copy: float | None
    tflops: float | None
    max_abs_diff: float | None = None
    error: str | None = None
    extra: dict = field(default_factory=dict)


def _median_us(fn: Callable[[], object], graph: bool) -> float:
    if graph:
        return do_bench_cudagraph(fn, rep=20, return_mode="median") * 1e3
    return do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def _row_cases(name: str, m: Model, dtype: torch.dtype) -> list[Case]:
    e = torch.finfo(dtype).bits // 8
    cases = []
    for t in ROW_TOKENS:
        x = torch.randn(t, m.hidden, device="cuda", dtype=dtype)
        r = torch.randn_like(x)
        w = torch.randn(m.hidden, device="cuda", dtype=dtype)
        shape = f"T={t} hidden={m.hidden}"
        cases.append(Case("rms_norm", name, shape, {
            "triton": lambda x=x, w=w: norm.rms_norm(x, w, eps=1e-6, weight_offset=0.0),
            "reference": lambda x=x, w=w: norm_ref.rms_norm(x, w, 1e-6, 0.0),
            "torch.rms_norm": lambda x=x, w=w: F.rms_norm(x, (m.hidden,), w, 1e-6),
        }, bytes=2 * x.numel() * e + m.hidden * e, decode=t <= 64))
        cases.append(Case("fused_add_rms_norm", name, shape, {
            "triton": lambda x=x, r=r, w=w: norm.fused_add_rms_norm(x, r, w, eps=1e-6, weight_offset=0.0),
            "reference": lambda x=x, r=r, w=w: norm_ref.fused_add_rms_norm(x, r, w, 1e-6, 0.0),
        }, bytes=4 * x.numel() * e + m.hidden * e, decode=t <= 64))
        gate_up = torch.randn(t, 2 * m.intermediate, device="cuda", dtype=dtype)
        if m.activation == "silu":
            impls = {"triton": lambda g=gate_up: activation.silu_and_mul(g),
                     "reference": lambda g=gate_up: act_ref.silu_and_mul(g)}
        else:
            impls = {"triton": lambda g=gate_up: activation.gelu_and_mul(g, approximate="tanh"),
                     "reference": lambda g=gate_up: act_ref.gelu_and_mul(g, "tanh")}
        cases.append(Case(f"{m.activation}_and_mul", name, f"T={t} I={m.intermediate}", impls,
                          bytes=3 * t * m.intermediate * e, decode=t <= 64))
    return cases


def _rope_and_store_cases(name: str, m: Model, dtype: torch.dtype) -> list[Case]:
    e = torch.finfo(dtype).bits // 8
    cases = []
    for t in ROW_TOKENS[1:]:
        q = torch.randn(t, m.heads, m.head_dim, device="cuda", dtype=dtype)
        angles = torch.rand(t, m.head_dim // 2, device="cuda") * 100
        cos, sin = angles.cos(), angles.sin()
        cases.append(Case("rope", name, f"T={t} H={m.heads} D={m.head_dim}", {
            "triton": lambda q=q, c=cos, s=sin: rope.rope(q, c, s, interleaved=False),
            "reference": lambda q=q, c=cos, s=sin: rope_ref.rope(q, c, s, False),
        }, bytes=2 * q.numel() * e + 2 * cos.numel() * 4, decode=t <= 64))
        slots_total = 64 * 1024
        k_cache = torch.zeros(slots_total // BLOCK_SIZE, BLOCK_SIZE, m.kv_heads, m.head_dim, device="cuda", dtype=dtype)
        v_cache = torch.zeros_like(k_cache)
        key = torch.randn(t, m.kv_heads, m.head_dim, device="cuda", dtype=dtype)
        value = torch.randn_like(key)
        slots = torch.randperm(slots_total, device="cuda")[:t]
        cases.append(Case("store_kv_cache", name, f"T={t} Hkv={m.kv_heads} D={m.head_dim}",
                          _store_impls(key, value, k_cache, v_cache, slots), bytes=4 * key.numel() * e,
                          decode=t <= 64, no_graph=frozenset({"reference"})))
    return cases


def _store_impls(key, value, k_cache, v_cache, slots) -> dict[str, Callable[[], object]]:
    """Triton, the reference (skips slots < 0 through a boolean index: a host sync), and a bare index_copy_."""
    flat_k, flat_v = k_cache.view(-1, key[0].numel()), v_cache.view(-1, key[0].numel())
    return {
        "triton": lambda: kv_cache.store_kv_cache(key, value, k_cache, v_cache, slots),
        "reference": lambda: kv_ref.store_kv_cache(key, value, k_cache, v_cache, slots),
        "index_copy_": lambda: (flat_k.index_copy_(0, slots, key.flatten(1)),
                                flat_v.index_copy_(0, slots, value.flatten(1))),
    }


def _paged_cases(name: str, m: Model, dtype: torch.dtype) -> list[Case]:
    e = torch.finfo(dtype).bits // 8
    scale = m.head_dim**-0.5
    cases = []
    for ctx_len in DECODE_CONTEXTS:
        for batch in DECODE_BATCHES:
            width = ctx_len // BLOCK_SIZE
            kc = torch.randn(batch * width, BLOCK_SIZE, m.kv_heads, m.head_dim, device="cuda", dtype=dtype)
            vc = torch.randn_like(kc)
            tables = torch.randperm(batch * width, device="cuda").view(batch, width).int()
            ctx = torch.full((batch,), ctx_len, dtype=torch.int32, device="cuda")
            q = torch.randn(batch, m.heads, m.head_dim, device="cuda", dtype=dtype)
            visible = ctx_len if m.window is None else min(ctx_len, m.window)
            # the dense peer: SDPA over the visible keys already gathered into contiguous [B, Hkv, L, D]
            slots = (tables.long()[:, :, None] * BLOCK_SIZE + torch.arange(BLOCK_SIZE, device="cuda")).view(batch, -1)
            dense_k = kc.view(-1, m.kv_heads, m.head_dim)[slots[:, ctx_len - visible:]].transpose(1, 2).contiguous()
            dense_v = vc.view(-1, m.kv_heads, m.head_dim)[slots[:, ctx_len - visible:]].transpose(1, 2).contiguous()
            q4 = q.unsqueeze(2)
            impls = {
                "triton": lambda q=q, kc=kc, vc=vc, t=tables, c=ctx, n=ctx_len: paged_attention.paged_attention(
                    q, kc, vc, block_tables=t, context_lens=c, scale=scale, sliding_window=m.window,
                    max_context_len=n),
                "reference": lambda q=q, kc=kc, vc=vc, t=tables, c=ctx, n=ctx_len: attn_ref.paged_attention(
                    q, kc, vc, t, c, scale, m.window, n),
                "sdpa_dense": lambda q4=q4, k=dense_k, v=dense_v: F.scaled_dot_product_attention(
                    q4, k, v, scale=scale, enable_gqa=m.heads != m.kv_heads),
            }
            kv_bytes = 2 * batch * visible * m.kv_heads * m.head_dim * e
            cases.append(Case("paged_attention", name, f"B={batch} ctx={ctx_len}", impls,
                              bytes=kv_bytes + 2 * q.numel() * e, decode=True))
    return cases


def _prefill_flops(tokens: int, m: Model) -> int:
    keys = sum(min(i + 1, m.window or tokens) for i in range(tokens))  # causal (and windowed) pairs
    return 4 * keys * m.heads * m.head_dim


def _varlen_cases(name: str, m: Model, dtype: torch.dtype) -> list[Case]:
    scale = m.head_dim**-0.5
    cases = []
    for tokens in PREFILL_TOKENS:
        q = torch.randn(tokens, m.heads, m.head_dim, device="cuda", dtype=dtype)
        k = torch.randn(tokens, m.kv_heads, m.head_dim, device="cuda", dtype=dtype)
        v = torch.randn_like(k)
        cu = torch.tensor([0, tokens], dtype=torch.int32, device="cuda")
        qb, kb, vb = (t.transpose(0, 1).unsqueeze(0).contiguous() for t in (q, k, v))
        if m.window is None:
            sdpa = lambda qb=qb, kb=kb, vb=vb: F.scaled_dot_product_attention(  # noqa: E731
                qb, kb, vb, is_causal=True, scale=scale, enable_gqa=m.heads != m.kv_heads)
        else:
            pos = torch.arange(tokens, device="cuda")
            mask = (pos[None, :] <= pos[:, None]) & (pos[:, None] - pos[None, :] < m.window)
            sdpa = lambda qb=qb, kb=kb, vb=vb, mask=mask: F.scaled_dot_product_attention(  # noqa: E731
                qb, kb, vb, attn_mask=mask, scale=scale, enable_gqa=m.heads != m.kv_heads)
        impls = {
            "triton": lambda q=q, k=k, v=v, cu=cu, n=tokens: varlen_attention.varlen_attention(
                q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=n, max_seqlen_k=n, causal=True,
                scale=scale, sliding_window=m.window, cu_seqlens_host=None),
            "reference": lambda q=q, k=k, v=v, n=tokens: attn_ref.varlen_attention(
                q, k, v, [0, n], [0, n], True, scale, m.window),
            "sdpa": sdpa,
        }
        cases.append(Case("varlen_attention", name, f"prefill {tokens} tokens", impls, flops=_prefill_flops(tokens, m)))
    return cases


def _first_tensor(out: object) -> torch.Tensor | None:
    if isinstance(out, torch.Tensor):
        return out
    if isinstance(out, tuple) and out and isinstance(out[0], torch.Tensor):
        return out[0]
    return None


def run_case(case: Case, copy_gbs: float) -> list[Result]:
    """Time every implementation of a case; one failing implementation is recorded, never fatal."""
    results = []
    outputs: dict[str, torch.Tensor | None] = {}
    for impl, fn in case.impls.items():
        res = Result(case.op, case.model, case.shape, impl, None, None, None, None, None)
        try:
            outputs[impl] = _first_tensor(fn())
            res.eager_us = _median_us(fn, graph=False)
            if case.decode and impl not in case.no_graph:
                res.graph_us = _median_us(fn, graph=True)
            elif case.decode:
                res.extra["graph"] = "not capturable (synchronizes)"
            if case.bytes:
                res.gbps = case.bytes / (res.eager_us * 1e-6) / 1e9
                res.pct_copy = 100.0 * res.gbps / copy_gbs
            if case.flops:
                res.tflops = case.flops / (res.eager_us * 1e-6) / 1e12
        except Exception as exc:
            res.error = f"{type(exc).__name__}: {exc}"[:300]
            traceback.print_exc()
        results.append(res)
    ours, ref = outputs.get("triton"), outputs.get("reference")
    if ours is not None and ref is not None and ours.shape == ref.shape:
        results[0].max_abs_diff = (ours.float() - ref.float()).abs().max().item()
    return results


def _fmt(x: float | None, digits: int = 1) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


def markdown(meta: dict, results: list[Result]) -> str:
    """Two tables: eager medians per case (Triton, reference, peers), then CUDA-graph medians of decode cases."""
    lines = [
        "# layerzero Triton kernels vs PyTorch reference",
        "",
        f"{meta['device']} (sm_{meta['sm']}), torch {meta['torch']}, triton {meta['triton']}, dtype {meta['dtype']}; "
        f"copy bandwidth {meta['copy_gbs']:.0f} GB/s; {meta['wall_s']:.0f} s.",
        "Medians in µs (do_bench: CUDA events, L2 flushed, launch overhead included). "
        "ratio = reference ÷ triton. GB/s and % of copy bandwidth (or TFLOP/s) are Triton's, from these timings.",
        "",
        "| op | model | shape | triton µs | reference µs | peer µs | ratio | triton GB/s (% copy) | TFLOP/s "
        "| max abs diff |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    by_case: dict[tuple[str, str, str], list[Result]] = {}
    for r in results:
        by_case.setdefault((r.op, r.model, r.shape), []).append(r)
    for (op, model, shape), rs in by_case.items():
        ours, ref, peers = rs[0], rs[1] if len(rs) > 1 else None, rs[2:]
        peer = " / ".join(f"{p.impl} {_fmt(p.eager_us)}" for p in peers) or "—"
        ratio = ref.eager_us / ours.eager_us if ref and ref.eager_us and ours.eager_us else None
        bw = f"{_fmt(ours.gbps, 0)} ({_fmt(ours.pct_copy, 0)}%)" if ours.gbps else "—"
        err = ours.error or _fmt(ours.max_abs_diff, 4)
        lines.append(f"| {op} | {model} | {shape} | {_fmt(ours.eager_us)} | {_fmt(ref.eager_us if ref else None)} | "
                     f"{peer} | {_fmt(ratio, 2)} | {bw} | {_fmt(ours.tflops, 0)} | {err} |")
    lines += ["", "## Decode-sized cases replayed in a CUDA graph (kernel time without launch overhead; L2 warm)", "",
              "| op | model | shape | triton µs | reference µs | peer µs |", "|---|---|---|---:|---:|---:|"]
    for (op, model, shape), rs in by_case.items():
        if rs[0].graph_us is None:
            continue
        ref = rs[1] if len(rs) > 1 else None
        ref_txt = _fmt(ref.graph_us) if ref and ref.graph_us else (ref.extra.get("graph", "—") if ref else "—")
        peer = " / ".join(f"{p.impl} {_fmt(p.graph_us)}" for p in rs[2:]) or "—"
        lines.append(f"| {op} | {model} | {shape} | {_fmt(rs[0].graph_us)} | {ref_txt} | {peer} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path(os.environ["OUT"]) if os.environ.get("OUT") else REPORTS)
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("layerzero_kernels.py needs a CUDA device")
    dtype = getattr(torch, args.dtype)
    torch.manual_seed(0)
    start = time.perf_counter()
    copy_gbs = copy_bandwidth() / 1e9
    results: list[Result] = []
    for name in args.models.split(","):
        m = MODELS[name]
        for build in (_row_cases, _rope_and_store_cases, _paged_cases, _varlen_cases):
            for case in build(name, m, dtype):
                results += run_case(case, copy_gbs)
                r = results[-len(case.impls)]
                print(f"{case.op:20s} {name:14s} {case.shape:26s} triton {_fmt(r.eager_us)} µs", flush=True)
            torch.cuda.empty_cache()
    major, minor = torch.cuda.get_device_capability()
    meta = dict(device=torch.cuda.get_device_name(), sm=f"{major}{minor}", torch=torch.__version__,
                triton=triton.__version__, cuda=torch.version.cuda, python=platform.python_version(),
                dtype=args.dtype, copy_gbs=copy_gbs, wall_s=time.perf_counter() - start,
                models={k: asdict(MODELS[k]) for k in args.models.split(",")}, block_size=BLOCK_SIZE)
    args.out.mkdir(parents=True, exist_ok=True)
    payload = dict(meta=meta, results=[asdict(r) for r in results])
    (args.out / "layerzero_kernels.json").write_text(json.dumps(payload, indent=1, default=str) + "\n")
    (args.out / "layerzero_kernels.md").write_text(markdown(meta, results))
    print(f"wrote {args.out / 'layerzero_kernels.md'} ({meta['wall_s']:.0f} s)")
    if any(math.isnan(r.max_abs_diff) for r in results if r.max_abs_diff is not None):
        raise SystemExit("a Triton kernel produced NaN")


if __name__ == "__main__":
    main()
