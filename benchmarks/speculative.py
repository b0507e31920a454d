"""Speculative decoding (n-gram prompt lookup) vs plain decoding, batch 1, greedy, in the same run.

    python benchmarks/speculative.py                       # CPU, the bundled SmolLM2 (float32)
    python benchmarks/speculative.py --num-speculative-tokens 6

Task sets: "copy" prompts whose answers reuse the prompt's text (edit, extract, reformat a passage given in the
prompt; written for this benchmark), "fresh" prompts with nothing in the prompt worth copying, and "miss" (the
fresh prompts with every proposal dropped: the overhead of speculation where nothing matches). Each prompt runs with and without speculation, interleaved, `--repeats` times;
reported: decode tokens/s (median over repeats of the set's total), the speedup, whether the greedy text was
identical, the acceptance rate and mean tokens per verifying step.
Report: benchmarks/reports/speculative_cpu.{json,md} (OUT_DIR overrides the folder).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

from infer import LLM, SamplingParams

PASSAGE = (
    "The Millbrook Community Garden opened in April 2019 on a vacant lot behind the public library. It has "
    "forty-two raised beds, a tool shed, two rain barrels and a small orchard of apple and pear trees. Members "
    "pay twenty dollars a year and agree to work four hours a month on shared tasks such as weeding the paths, "
    "turning the compost and repairing the fence. The garden donates about three hundred pounds of vegetables "
    "to the Millbrook food pantry every summer. Meetings are held on the first Saturday of each month at nine "
    "in the morning, and new members are always welcome."
)
CODE = (
    "def total_price(items, tax_rate):\n"
    "    subtotal = 0\n"
    "    for item in items:\n"
    "        subtotal = subtotal + item['price'] * item['quantity']\n"
    "    tax = subtotal * tax_rate\n"
    "    return subtotal + tax\n"
)
COPY = [
    f"Here is a paragraph:\n\n{PASSAGE}\n\nRewrite the paragraph exactly, but replace 'Millbrook' with 'Oakdale'.",
    f"Here is a paragraph:\n\n{PASSAGE}\n\nCopy the first three sentences of the paragraph word for word.",
    f"Here is a Python function:\n\n{CODE}\nRewrite this function with the variable 'subtotal' renamed to 'amount'. "
    "Keep everything else the same.",
    f"Here is a paragraph:\n\n{PASSAGE}\n\nList every sentence of the paragraph as a bullet point.",
]
FRESH = [
    "Write a short poem about the sea at night.",
    "Give three tips for learning to play the guitar.",
    "Explain why the sky is blue in simple words.",
    "Describe your ideal weekend in a few sentences.",
]


def run_set(llm: LLM, prompts: list[list[int]], max_tokens: int) -> tuple[float, list[str]]:
    """(decode tokens/s over the set, texts): each prompt alone, timed from its first token."""
    params = SamplingParams(temperature=0, max_tokens=max_tokens)
    texts, decode_tokens, decode_seconds = [], 0, 0.0
    for ids in prompts:
        stamps = []
        text = ""
        for out in llm.stream(ids, params):
            if out.token_id is not None:
                stamps.append(time.perf_counter())
            text += out.text_delta
        texts.append(text)
        decode_tokens += len(stamps) - 1
        decode_seconds += stamps[-1] - stamps[0]
    return decode_tokens / decode_seconds, texts


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="default: the bundled SmolLM2")
    ap.add_argument("--num-speculative-tokens", type=int, default=4)
    ap.add_argument("--prompt-lookup-max", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    options = dict(max_seq_len=1024, max_batch_size=1)
    plain = LLM(args.model, **options)
    spec = LLM(args.model, speculative_method="ngram", num_speculative_tokens=args.num_speculative_tokens,
               prompt_lookup_max=args.prompt_lookup_max, **options)
    sets = {name: [plain.encode_chat([{"role": "user", "content": p}]) for p in prompts]
            for name, prompts in (("copy", COPY), ("fresh", FRESH))}
    run_set(plain, sets["fresh"][:1], 8)  # warm-up
    run_set(spec, sets["fresh"][:1], 8)
    result: dict[str, object] = {
        "device": platform.processor() or platform.machine(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "model": str(plain.path),
        "num_speculative_tokens": args.num_speculative_tokens, "prompt_lookup_max": args.prompt_lookup_max,
        "max_tokens": args.max_tokens, "repeats": args.repeats,
        "command": " ".join(["python benchmarks/speculative.py", *sys.argv[1:]]), "sets": {},
    }
    sets["miss"] = sets["fresh"]
    lookup = spec.engine.scheduler.proposer.propose
    for name, prompts in sets.items():
        # miss: the lookups run and their proposals are dropped, so every step decodes one token: the cost of
        # speculation being on (lookups, no step overlap) where nothing matches
        spec.engine.scheduler.proposer.propose = (lambda t, n: (lookup(t, n), [])[1]) if name == "miss" else lookup
        rates: dict[str, list[float]] = {"plain": [], "ngram": []}
        identical = True
        before = (spec.engine.scheduler.num_drafted, spec.engine.scheduler.num_accepted, spec.engine.scheduler.num_verified_rows)
        for _ in range(args.repeats):
            rate, want = run_set(plain, prompts, args.max_tokens)
            rates["plain"].append(rate)
            rate, got = run_set(spec, prompts, args.max_tokens)
            rates["ngram"].append(rate)
            identical &= got == want
        s = spec.engine.scheduler
        drafted, accepted, rows = (s.num_drafted - before[0], s.num_accepted - before[1], s.num_verified_rows - before[2])
        med = {k: statistics.median(v) for k, v in rates.items()}
        result["sets"][name] = {
            "tok_s": med, "runs": rates, "speedup": med["ngram"] / med["plain"], "identical_greedy_text": identical,
            "drafted": drafted, "accepted": accepted, "acceptance_rate": accepted / max(drafted, 1),
            "mean_tokens_per_verify_step": 1 + accepted / max(rows, 1), "verify_steps": rows,
        }
    write(result)


def write(r: dict) -> None:
    folder = Path(os.environ.get("OUT_DIR") or Path(__file__).parent / "reports")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "speculative_cpu.json").write_text(json.dumps(r, indent=2))
    lines = [f"# Speculative decoding (n-gram), {r['device']}, {r['threads']} threads", "",
             f"{Path(r['model']).name}, batch 1, greedy, k = {r['num_speculative_tokens']}, lookup 1..{r['prompt_lookup_max']}, "
             f"{r['max_tokens']} new tokens per prompt, torch {r['torch']}, medians of {r['repeats']} interleaved runs: "
             f"`{r['command']}`", "",
             "| prompts | plain tok/s | ngram tok/s | speedup | identical text | acceptance | tokens per verify step |",
             "|---|---|---|---|---|---|---|"]
    for name, s in r["sets"].items():
        lines.append(f"| {name} | {s['tok_s']['plain']:.1f} | {s['tok_s']['ngram']:.1f} | {s['speedup']:.2f}x | "
                     f"{'yes' if s['identical_greedy_text'] else 'NO'} | {100 * s['acceptance_rate']:.0f}% "
                     f"({s['accepted']}/{s['drafted']}) | {s['mean_tokens_per_verify_step']:.2f} |")
    lines += ["", "copy: answers that reuse the prompt's passage (edit, extract, reformat). fresh: open-ended prompts "
                  "(a small model still repeats itself, so lookups find matches). miss: the fresh prompts with every "
                  "lookup's proposal dropped: the cost of having speculation on where nothing matches.", ""]
    (folder / "speculative_cpu.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
