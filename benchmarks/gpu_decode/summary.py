"""Numbers derived from the measurements: rooflines and bounds, ratios, and the issue's targets."""

from __future__ import annotations

from typing import Any

import model_shapes as ms
from gpu_decode.plan import MODE_NAMES


def num(d: Any, *keys: str) -> float | None:
    """d[k0][k1]... when every level exists and the leaf is a number, else None."""
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (int, float)) and not isinstance(d, bool) else None


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None when either is missing or b is 0."""
    return a / b if a is not None and b else None


def batch_bound(name: str, batch: int, context: int, device: dict[str, Any]) -> dict[str, Any] | None:
    """Tokens/s bound of a decode step: max(bytes / copy bandwidth, FLOPs / GEMM rate)."""
    copy, gemm = num(device, "copy", "gb_s"), num(device, "gemm", "tflops")
    if copy is None or gemm is None:
        return None
    cfg = ms.model_config(name)
    memory_s = (ms.weight_bytes(cfg) + batch * ms.kv_read_bytes(cfg, context)) / (copy * 1e9)
    compute_s = batch * ms.flops_per_token(cfg, context) / (gemm * 1e12)
    return {"tok_s": batch / max(memory_s, compute_s), "bound_by": "memory" if memory_s >= compute_s else "compute"}


def model_summary(name: str, entry: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """Roofline fractions, graphs ÷ eager per batch, ours ÷ transformers, prefill TFLOP/s."""
    plan, device, runs = report["plan"], report["device"], entry.get("runs", {})
    primary = MODE_NAMES[plan["graph_modes"][0]]
    roofline = _ratio(num(device, "copy", "gb_s"), entry["weight_bytes"] / 1e9)
    out: dict[str, Any] = {"roofline_tok_s": roofline, "primary_mode": primary, "batches": {}, "prefill": {}}
    for mode in runs:
        out[f"{mode}_fraction_of_roofline"] = _ratio(num(runs, mode, "batch1", "median_tok_s"), roofline)
    hf = num(entry, "transformers", "median_tok_s")
    out["ratio_over_transformers"] = _ratio(num(runs, primary, "batch1", "median_tok_s"), hf)
    out["graphs_over_eager"] = {"1": _ratio(num(runs, "graphs", "batch1", "median_tok_s"),
                                            num(runs, "eager", "batch1", "median_tok_s"))}
    for batch in entry["batches"]:
        key = f"batch{batch}"
        bound = batch_bound(name, batch, entry["batch_context"], device)
        fraction = _ratio(num(runs, primary, key, "tok_s"), bound and bound["tok_s"])
        out["batches"][str(batch)] = (bound or {}) | {"fraction_of_bound": fraction}
        graphs, eager = num(runs, "graphs", key, "tok_s"), num(runs, "eager", key, "tok_s")
        out["graphs_over_eager"][str(batch)] = _ratio(graphs, eager)
    gemm = num(device, "gemm", "tflops")
    for tokens in plan["prefill_lens"]:
        seconds = num(runs, primary, f"prefill{tokens}", "median_s")
        tflops = _ratio(ms.prefill_flops(ms.model_config(name), tokens) / 1e12, seconds)
        out["prefill"][str(tokens)] = {"tflops": tflops, "fraction_of_gemm": _ratio(tflops, gemm)}
    return out


def _target(goal: str, measured: float | None, met: bool | None, where: str = "") -> dict[str, Any]:
    """One row of the targets table."""
    return {"target": goal, "measured": measured, "met": met, "where": where}


def targets(report: dict[str, Any], summaries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets next to what this run measured (None where not measured)."""
    rows = []
    for name in ("llama-3.2-1b", "llama-3.1-8b"):
        frac = summaries.get(name, {}).get("graphs_fraction_of_roofline")
        rows.append(_target(f"batch-1 decode >= 85% of roofline ({name}, graphs)", frac,
                            None if frac is None else frac >= 0.85))
    ratio = summaries.get("llama-3.2-1b", {}).get("ratio_over_transformers")
    rows.append(_target(">= 3.5x transformers static-cache generate (llama-3.2-1b, batch 1)", ratio,
                        None if ratio is None else ratio >= 3.5))
    wins = [(v, f"{n} batch {b}") for n, s in summaries.items() for b, v in s["graphs_over_eager"].items()]
    worst = min(((v, where) for v, where in wins if v is not None), default=None)
    rows.append(_target("CUDA graphs a net win at every measured batch (graphs ÷ eager > 1)", worst and worst[0],
                        None if worst is None else worst[0] > 1.0, worst[1] if worst else ""))
    ready = num(report, "ready", "first", "ready_s")
    rows.append(_target("ready <= 20 s (process start -> LLM built with graphs, llama-3.2-1b)", ready,
                        None if ready is None else ready <= 20.0, report["plan"]["ready_model"]))
    return rows


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Per-model derived numbers and the targets, from what the report holds so far."""
    summaries = {name: model_summary(name, entry, report) for name, entry in report.get("models", {}).items()}
    return {"models": summaries, "targets": targets(report, summaries)}
