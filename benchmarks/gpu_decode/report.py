"""The report as markdown: header, targets, graph overhead, then a section per model."""

from __future__ import annotations

import json
from typing import Any

from gpu_decode.plan import MODE_NAMES
from gpu_decode.summary import num


def _f(x: float | None, fmt: str = ".1f") -> str:
    """x formatted, or a dash when missing."""
    return "—" if x is None else format(x, fmt)


def _status(item: Any) -> str:
    """A short note for an item that did not produce numbers."""
    if isinstance(item, dict) and ("error" in item or "skipped" in item):
        text = " ".join((item.get("error") or item["skipped"]).split())  # one line for the table
        return text if len(text) <= 300 else text[:150] + " … " + text[-150:]
    return ""


def _header(report: dict[str, Any]) -> list[str]:
    """Title, hardware, software and plan."""
    hw, dev, plan, meta = report["hardware"], report["device"], report["plan"], report["meta"]
    where = (f"{hw['gpu']} ({hw['capability']}, {hw['sms']} SMs, {hw['gpu_memory_bytes'] / 2**30:.1f} GiB)"
             if "gpu" in hw else f"CPU {hw['cpu']} ({hw['cpu_count']} cores) — smoke run, numbers mean nothing")
    return [
        "# GPU decode: infer vs transformers on real model shapes (random weights)",
        "",
        f"Hardware: {where}. Copy bandwidth {_f(num(dev, 'copy', 'gb_s'), '.0f')} GB/s "
        f"({plan['copy_mib']} MiB device copy, read + write, median of {plan['timing_reps']}); "
        f"{plan['dtype']} GEMM {plan['gemm_n']}³ {_f(num(dev, 'gemm', 'tflops'), '.0f')} TFLOP/s. "
        + " ".join(_status(dev.get(k)) for k in ("copy", "gemm")).strip(),
        f"Software: torch {hw['torch']}, triton {hw['triton']}, transformers {hw['transformers']}, "
        f"CUDA {hw['cuda']}, Python {hw['python']}. Run {meta['date']}, {meta['wall_s']:.0f} s.",
        f"Plan: `{json.dumps(plan)}`",
        "",
    ]


def _targets_md(report: dict[str, Any]) -> list[str]:
    """The targets table and the startup times."""
    lines = ["## Targets (issue 5)", "", "| target | measured | met |", "|---|---:|---|"]
    for t in report["summary"]["targets"]:
        met = {True: "yes", False: "**no**", None: "not measured"}[t["met"]]
        where = f" ({t['where']})" if t["where"] else ""
        lines.append(f"| {t['target']} | {_f(t['measured'], '.2f')}{where} | {met} |")
    ready = report.get("ready", {})
    lines += ["", "Startup (child process; ready_s from its first line, process_wall_s from the parent):", ""]
    for key, item in ready.items():
        lines.append(f"- {key}: ready {_f(num(item, 'ready_s'))} s, process wall "
                     f"{_f(num(item, 'process_wall_s'))} s, LLM.load_seconds {_f(num(item, 'load_seconds'))} s, "
                     f"Triton cache files before {num(item, 'triton_cache_files_before')}, "
                     f"graph_stats `{json.dumps(item.get('graph_stats'))}` {_status(item)}")
    return lines + [""]


def _notes(runs: dict[str, Any], modes: list[str], key: str) -> str:
    """Errors or skips of one item across the engine modes."""
    return "; ".join(f"{m}: {_status(runs.get(m, {}).get(key))}" for m in modes if _status(runs.get(m, {}).get(key)))


def _decode_rows(name: str, entry: dict[str, Any], summary: dict[str, Any], plan: dict[str, Any]) -> list[str]:
    """The decode table of one model: a row per batch size."""
    runs = entry.get("runs", {})
    modes = [MODE_NAMES[m] for m in plan["graph_modes"]]
    lines = [f"| batch | {' | '.join(f'{m} tok/s' for m in modes)} | graphs ÷ eager | bound tok/s | "
             f"{modes[0]} ÷ bound | notes |", "|---:|" + "---:|" * (len(modes) + 3) + "---|"]
    for batch in (1, *entry["batches"]):
        key, leaf = (("batch1", "median_tok_s") if batch == 1 else (f"batch{batch}", "tok_s"))
        rates = [_f(num(runs, m, key, leaf)) for m in modes]
        notes = _notes(runs, modes, key)
        if batch == 1:
            bound, fraction, by = summary["roofline_tok_s"], summary.get(f"{modes[0]}_fraction_of_roofline"), "roofline"
        else:
            b = summary["batches"][str(batch)]
            bound, fraction, by = b.get("tok_s"), b.get("fraction_of_bound"), b.get("bound_by", "")
        lines.append(f"| {batch} | {' | '.join(rates)} | {_f(summary['graphs_over_eager'].get(str(batch)), '.2f')} | "
                     f"{_f(bound)} ({by}) | {_f(fraction, '.2f')} | {notes} |")
    return lines


def _model_md(name: str, entry: dict[str, Any], report: dict[str, Any]) -> list[str]:
    """One model's section: decode, transformers, prefill and engine configs."""
    plan, summary = report["plan"], report["summary"]["models"][name]
    runs, hf = entry.get("runs", {}), entry.get("transformers", {})
    lines = [f"## {name}", "",
             f"{entry['weight_bytes'] / 1e9:.3f} GB of weights read per batch-1 token; roofline "
             f"{_f(summary['roofline_tok_s'])} tok/s. Decode: {plan['prompt_len']}-token prompt; batch 1 = "
             f"{plan['new_tokens']} new tokens, median of {plan['repeats']}; batch B = {plan['batch_timed_steps']} "
             f"steps after all prefills and {plan['batch_warm_steps']} warm-up steps.", ""]
    lines += _decode_rows(name, entry, summary, plan)
    lines += ["", f"transformers generate (static cache, eager, {plan['hf_new_tokens']} new tokens, median of "
              f"{plan['hf_repeats']}): {_f(num(hf, 'median_tok_s'))} tok/s; infer ({summary['primary_mode']}) ÷ "
              f"transformers = {_f(summary['ratio_over_transformers'], '.2f')} {_status(hf)}"]
    if "transformers_compiled" in entry:
        tc = entry["transformers_compiled"]
        lines.append(f"transformers generate (static cache, auto-compiled; warm-up incl. compile "
                     f"{_f(num(tc, 'warmup_s'))} s): {_f(num(tc, 'median_tok_s'))} tok/s {_status(tc)}")
    modes = list(runs)
    lines += ["", f"| prefill tokens | {' | '.join(f'{m} tok/s' for m in modes)} | {summary['primary_mode']} TFLOP/s | "
              "÷ GEMM rate | notes |", "|---:|" + "---:|" * (len(modes) + 2) + "---|"]
    for tokens in plan["prefill_lens"]:
        key, s = f"prefill{tokens}", summary["prefill"][str(tokens)]
        rates = [_f(num(runs, m, key, "tok_s"), ".0f") for m in modes]
        lines.append(f"| {tokens} | {' | '.join(rates)} | {_f(s['tflops'])} | {_f(s['fraction_of_gemm'], '.2f')} | "
                     f"{_notes(runs, modes, key)} |")
    lines.append("")
    for mode, run in runs.items():
        config = run.get("engine_config", run.get("engine_options"))
        lines.append(f"- {mode}: EngineConfig `{json.dumps(config, default=str)}` {_status(run)}")
    return lines + [""]


def _graphs_table(report: dict[str, Any]) -> list[str]:
    """Per model and engine mode: construction time and what the CUDA graphs cost (GraphStats)."""
    lines = ["## Construction and CUDA graph overhead", "",
             "| model | mode | LLM.load_seconds | graph batch sizes | capture s | graph memory MiB |",
             "|---|---|---:|---|---:|---:|"]
    for name, entry in report.get("models", {}).items():
        for mode, run in entry.get("runs", {}).items():
            stats = run.get("graph_stats") if isinstance(run.get("graph_stats"), dict) else {}
            memory, sizes = num(stats, "memory_bytes"), list(stats.get("batch_sizes") or [])
            lines.append(f"| {name} | {mode} | {_f(num(run, 'load_seconds'))} | {sizes} | "
                         f"{_f(num(stats, 'capture_seconds'))} | {_f(memory and memory / 2**20, '.0f')} |")
    return lines + [""]


def markdown(report: dict[str, Any]) -> str:
    """The whole report as markdown."""
    lines = _header(report) + _targets_md(report) + _graphs_table(report)
    for name, entry in report.get("models", {}).items():
        lines += _model_md(name, entry, report)
    lines.append("Reproduce: `python benchmarks/gpu_decode` (or `bash scripts/gpu_decode.sh` on the lent GPU).")
    return "\n".join(lines) + "\n"
