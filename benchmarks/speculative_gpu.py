"""What a verify step costs against a decode step on the GPU, and what speculation buys at a given acceptance.

    python benchmarks/speculative_gpu.py                     # Llama-3.2-1B and Llama-3.1-8B shapes, random bf16

Random weights accept nothing, so this measures the mechanics: every request drafts k tokens every step (a
proposer that always proposes), every step verifies, and step time is measured against plain decoding (CUDA
graphs) in the same run. From t_decode and t_verify(k), a per-token acceptance rate a gives
E = (1 - a^(k+1)) / (1 - a) tokens per verify step and a speedup of E * t_decode / t_verify(k).
Report: benchmarks/reports/speculative_gpu_{gpu}.{json,md} (OUT_DIR overrides the folder).
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

import model_shapes as ms
from infer import LLM, SamplingParams
from probe_overhead import gpu_tag

KS = (2, 4, 8)
BATCHES = (1, 32)
RATES = (0.5, 0.7, 0.9)


def step_ms(llm: LLM, batch: int, steps: int = 48) -> float:
    """Median ms per engine step of `batch` decoding requests (after their prefills)."""
    prompt = [(7 * i + 3) % 1000 + 1 for i in range(64)]
    params = SamplingParams(temperature=0, max_tokens=steps + 24, ignore_eos=True)
    requests = [llm.engine.add_request(prompt, params) for _ in range(batch)]
    while any(not r.output_token_ids for r in requests):
        llm.engine.step()
    for _ in range(3):
        llm.engine.step()
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        t = time.perf_counter()
        llm.engine.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    for r in requests:
        llm.engine.abort(r.request_id)
    while llm.engine.has_unfinished():
        llm.engine.step()
    return 1e3 * statistics.median(times)


def main() -> None:
    shapes = sys.argv[1:] or ["llama-3.2-1b", "llama-3.1-8b"]
    work = Path(tempfile.mkdtemp())
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    for shape in shapes:
        model = str(ms.write_model_dir(shape, work / shape))
        options = dict(load_format="dummy", max_seq_len=512, max_batch_size=max(BATCHES), kv_cache_memory_gb=4)
        plain = LLM(model, **options)
        decode = {b: step_ms(plain, b) for b in BATCHES}
        del plain
        torch.cuda.empty_cache()
        spec = LLM(model, speculative_method="ngram", num_speculative_tokens=max(KS), **options)
        proposer = spec.engine.scheduler.proposer
        rows = []
        for k in KS:
            proposer.propose = lambda tokens, limit, k=k: [11] * min(k, limit)  # always k drafts: every step verifies
            for b in BATCHES:
                verify = step_ms(spec, b)
                ratio = verify / decode[b]
                gains = {a: (1 - a ** (k + 1)) / (1 - a) / ratio for a in RATES}
                rows.append({"k": k, "batch": b, "decode_ms": decode[b], "verify_ms": verify, "verify_over_decode": ratio,
                             "speedup_at_acceptance": gains})
        del spec
        torch.cuda.empty_cache()
        result["shapes"][shape] = rows
    write(result)


def write(r: dict) -> None:
    folder = Path(os.environ.get("OUT_DIR") or Path(__file__).parent / "reports")
    folder.mkdir(parents=True, exist_ok=True)
    tag = gpu_tag(r["device"])
    (folder / f"speculative_gpu_{tag}.json").write_text(json.dumps(r, indent=2))
    lines = [f"# Speculative decoding mechanics, {r['device']}", "",
             f"Random bf16 weights, torch {r['torch']}, median step times (`python benchmarks/speculative_gpu.py`). "
             "Decode steps replay CUDA graphs; verify steps (every request drafting k tokens) run eagerly. "
             "Speedup at acceptance a: (1 - a^(k+1)) / (1 - a) tokens per verify step, times t_decode / t_verify.", ""]
    for shape, rows in r["shapes"].items():
        lines += [f"## {shape}", "", "| k | batch | decode ms | verify ms | verify / decode | "
                  + " | ".join(f"speedup at a={a}" for a in RATES) + " |", "|---|---|---|---|---|" + "---|" * len(RATES)]
        for row in rows:
            gains = " | ".join(f"{row['speedup_at_acceptance'][a]:.2f}x" for a in RATES)
            lines.append(f"| {row['k']} | {row['batch']} | {row['decode_ms']:.2f} | {row['verify_ms']:.2f} | "
                         f"{row['verify_over_decode']:.2f} | {gains} |")
        lines.append("")
    (folder / f"speculative_gpu_{tag}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
