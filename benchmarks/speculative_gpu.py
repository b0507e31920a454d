"""What a verify step costs against a decode step on the GPU, and what speculation buys at a given acceptance.

    python benchmarks/speculative_gpu.py                     # Llama-3.2-1B and Llama-3.1-8B shapes, random bf16

Random weights accept nothing a real proposer drafts, so two measurements stand in for a real model:
- mechanics: every request drafts k tokens every step (a proposer that always proposes) and every step verifies;
  step time against plain decoding in the same run (both replay CUDA graphs). From t_decode and t_verify(k), a
  per-token acceptance rate a gives E = (1 - a^(k+1)) / (1 - a) tokens per verify step and a speedup of
  E * t_decode / t_verify(k).
- end to end at a set acceptance: an oracle proposer drafts the continuation plain greedy decoding produced (read
  from a plain run of the same prompts), each draft kept with probability a, else replaced by a wrong token, and
  the engine's output tokens/s is measured against plain decoding, with the greedy tokens compared (float32:
  see E2E_DTYPE).
Report: benchmarks/reports/speculative_gpu_{gpu}.{json,md} (OUT_DIR overrides the folder).
"""

from __future__ import annotations

import json
import os
import random
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
DRAFTER = "llama-3.2-1b"  # the draft model for the larger shapes (same vocabulary)
DRAFT_KS = (2, 4)
ORACLE_K = 4
ORACLE_RATES = (1.0, 0.8, 0.5)
PROMPT_LEN, NEW_TOKENS = 64, 96
# Random weights give near-flat logits, so in bf16 a batch's shape (b rows vs b * (k + 1)) flips greedy ties within
# a few tokens (plain batch 1 vs batch 32 too) and the oracle's drafts leave the trajectory; in float32 greedy
# decoding is the same at every shape, so the end-to-end runs use it.
E2E_DTYPE = "float32"


def prompts(batch: int) -> list[list[int]]:
    """Distinct prompts (the oracle finds a request's reference continuation by its prompt)."""
    return [[(7 * i + 13 * b + 3) % 1000 + 1 for i in range(PROMPT_LEN)] for b in range(batch)]


def step_ms(llm: LLM, batch: int, steps: int = 48) -> float:
    """Median ms per engine step of `batch` decoding requests (after their prefills)."""
    params = SamplingParams(temperature=0, max_tokens=steps + 24, ignore_eos=True)
    requests = [llm.engine.add_request(p, params) for p in prompts(batch)]
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


def timed_generate(llm: LLM, batch: int) -> tuple[float, list[list[int]]]:
    """(output tokens/s, token ids) of `batch` greedy requests from submission to the last token."""
    params = SamplingParams(temperature=0, max_tokens=NEW_TOKENS, ignore_eos=True)
    torch.cuda.synchronize()
    t = time.perf_counter()
    out = llm.generate_ids(prompts(batch), params)
    torch.cuda.synchronize()
    return batch * NEW_TOKENS / (time.perf_counter() - t), [o.token_ids for o in out]


def oracle(reference: dict[tuple[int, ...], list[int]], rate: float, k: int):
    """A proposer drafting the plain run's continuation, each draft kept with probability `rate`."""
    rng = random.Random(0)

    def propose(tokens: list[int], limit: int) -> list[int]:
        want = reference[tuple(tokens[:PROMPT_LEN])][len(tokens) - PROMPT_LEN :][: min(k, limit)]
        return [t if rng.random() < rate else (t + 1) % 1000 for t in want]

    return propose


def mechanics(model: str, options: dict) -> tuple[list[dict], dict[int, float]]:
    """Verify-step cost vs decode-step cost for each k and batch (every request drafts k every step)."""
    plain = LLM(model, **options)
    decode = {b: step_ms(plain, b) for b in BATCHES}
    del plain
    torch.cuda.empty_cache()
    spec = LLM(model, speculative_method="ngram", num_speculative_tokens=max(KS), **options)
    rows = []
    for k in KS:
        spec.engine.scheduler.proposer.propose = lambda tokens, limit, k=k: [11] * min(k, limit)
        for b in BATCHES:
            verify = step_ms(spec, b)
            ratio = verify / decode[b]
            gains = {a: (1 - a ** (k + 1)) / (1 - a) / ratio for a in RATES}
            rows.append({"k": k, "batch": b, "decode_ms": decode[b], "verify_ms": verify, "verify_over_decode": ratio,
                         "speedup_at_acceptance": gains})
    del spec
    torch.cuda.empty_cache()
    return rows, decode


def draft_mechanics(model: str, drafter: str, options: dict, decode: dict[int, float]) -> list[dict]:
    """Step time with a draft model (every request drafts k every step: drafter passes, then the verify)."""
    rows = []
    for k in DRAFT_KS:
        spec = LLM(model, speculative_method="draft", draft_model=drafter, num_speculative_tokens=k, **options)
        for b in BATCHES:
            t = step_ms(spec, b)
            rows.append({"k": k, "batch": b, "decode_ms": decode[b], "draft_and_verify_ms": t, "over_decode": t / decode[b],
                         "speedup_at_acceptance": {a: (1 - a ** (k + 1)) / (1 - a) * decode[b] / t for a in RATES}})
        del spec
        torch.cuda.empty_cache()
    return rows


def end_to_end(model: str, options: dict) -> list[dict]:
    """Output tokens/s with oracle drafts at each set rate vs plain decoding, greedy tokens compared."""
    plain = LLM(model, **options)
    reference = {b: timed_generate(plain, b)[1] for b in BATCHES}  # also the warm-up
    plain_tok_s = {b: statistics.median(timed_generate(plain, b)[0] for _ in range(3)) for b in BATCHES}
    del plain
    torch.cuda.empty_cache()
    spec = LLM(model, speculative_method="ngram", num_speculative_tokens=ORACLE_K, **options)
    s = spec.engine.scheduler
    rows = []
    for b in BATCHES:
        by_prompt = {tuple(p): ids for p, ids in zip(prompts(b), reference[b])}
        for rate in ORACLE_RATES:
            s.proposer.propose = oracle(by_prompt, rate, ORACLE_K)
            before = (s.num_drafted, s.num_accepted, s.num_verified_rows)
            runs = [timed_generate(spec, b) for _ in range(3)]
            drafted, accepted, verified = s.num_drafted - before[0], s.num_accepted - before[1], s.num_verified_rows - before[2]
            tok_s = statistics.median(r[0] for r in runs)
            rows.append({"batch": b, "k": ORACLE_K, "set_rate": rate, "acceptance": accepted / max(drafted, 1),
                         "mean_tokens_per_verify_step": 1 + accepted / max(verified, 1),
                         "plain_tok_s": plain_tok_s[b], "spec_tok_s": tok_s, "speedup": tok_s / plain_tok_s[b],
                         "identical_greedy_tokens": all(r[1] == reference[b] for r in runs)})
    del spec
    torch.cuda.empty_cache()
    return rows


def main() -> None:
    shapes = sys.argv[1:] or ["llama-3.2-1b", "llama-3.1-8b"]
    work = Path(tempfile.mkdtemp())
    result: dict[str, object] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "shapes": {}}
    dirs = {shape: str(ms.write_model_dir(shape, work / shape)) for shape in {*shapes, DRAFTER}}
    for shape in shapes:
        model = dirs[shape]
        options = dict(load_format="dummy", max_seq_len=512, max_batch_size=max(BATCHES), kv_cache_memory_gb=4)
        bf16 = {**options, "dtype": "bfloat16"}
        rows, decode = mechanics(model, bf16)
        result["shapes"][shape] = {"mechanics": rows, "end_to_end": end_to_end(model, {**options, "dtype": E2E_DTYPE})}
        if shape != DRAFTER:
            result["shapes"][shape]["draft"] = draft_mechanics(model, dirs[DRAFTER], bf16, decode)
    write(result)


def _step_table(rows: list[dict], columns: tuple[str, str], time_key: str, ratio_key: str) -> list[str]:
    """A markdown table of step times against a decode step, with the speedup each acceptance rate buys."""
    lines = [f"| k | batch | decode ms | {columns[0]} | {columns[1]} | " + " | ".join(f"speedup at a={a}" for a in RATES) + " |",
             "|---|---|---|---|---|" + "---|" * len(RATES)]
    for row in rows:
        gains = " | ".join(f"{row['speedup_at_acceptance'][a]:.2f}x" for a in RATES)
        lines.append(f"| {row['k']} | {row['batch']} | {row['decode_ms']:.2f} | {row[time_key]:.2f} | "
                     f"{row[ratio_key]:.2f} | {gains} |")
    return lines


def write(r: dict) -> None:
    folder = Path(os.environ.get("OUT_DIR") or Path(__file__).parent / "reports")
    folder.mkdir(parents=True, exist_ok=True)
    tag = gpu_tag(r["device"])
    (folder / f"speculative_gpu_{tag}.json").write_text(json.dumps(r, indent=2))
    lines = [f"# Speculative decoding on the GPU, {r['device']}", "",
             f"Random weights (mechanics in bf16), torch {r['torch']}, `python benchmarks/speculative_gpu.py`. Decode and verify steps "
             "both replay CUDA graphs (a verify step decodes k + 1 rows per sequence).", ""]
    for shape, parts in r["shapes"].items():
        lines += [f"## {shape}", "", "Mechanics (median step times; every request drafts k every step). Speedup at "
                  "acceptance a: (1 - a^(k+1)) / (1 - a) tokens per verify step, times t_decode / t_verify.", ""]
        lines += _step_table(parts["mechanics"], ("verify ms", "verify / decode"), "verify_ms", "verify_over_decode")
        if "draft" in parts:
            lines += ["", f"Draft model ({DRAFTER} shape drafting, bf16; its decode passes replay CUDA graphs): step time with "
                      "every request drafting k, against a plain decode step; speedup at acceptance a as above.", ""]
            lines += _step_table(parts["draft"], ("draft + verify ms", "/ decode"), "draft_and_verify_ms", "over_decode")
        lines += ["", f"End to end ({E2E_DTYPE}: greedy decoding of random weights is batch-shape invariant only "
                  f"there), oracle drafts (k = {ORACLE_K}, each kept with the set probability), {NEW_TOKENS} new tokens "
                  "per request, medians of 3 runs:", "",
                  "| batch | set rate | acceptance | tokens per verify step | plain tok/s | spec tok/s | speedup | identical |",
                  "|---|---|---|---|---|---|---|---|"]
        for e in parts["end_to_end"]:
            lines.append(f"| {e['batch']} | {e['set_rate']} | {100 * e['acceptance']:.0f}% | "
                         f"{e['mean_tokens_per_verify_step']:.2f} | {e['plain_tok_s']:.0f} | {e['spec_tok_s']:.0f} | "
                         f"{e['speedup']:.2f}x | {'yes' if e['identical_greedy_tokens'] else 'NO'} |")
        lines.append("")
    (folder / f"speculative_gpu_{tag}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
