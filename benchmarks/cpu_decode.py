"""CPU decode of the bundled SmolLM2-135M at the server's default settings: infer vs transformers, same run.

    .venv/bin/python benchmarks/cpu_decode.py [--tokens 64] [--runs 3]

Each measurement is interleaved run by run with its transformers peer, so drift on a shared machine
hits both alike:
- batch 1: decode tok/s of one chat request (first token excluded), in process (`LLM.stream`) and
  streamed from a real `infer serve` process, vs transformers' `generate`;
- batch 16: 16 different chat prompts at once, generated tokens / wall time (prefill included),
  in process (`LLM.generate`) and as 16 concurrent HTTP requests to `infer serve`, vs transformers'
  batch-16 `generate` of the same prompts, left-padded.
Both run the default EngineConfig (max_seq_len 4096, max_batch_size 32), as `make serve` does.
Writes benchmarks/reports/cpu_decode.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import httpx
import torch
import transformers

from infer import LLM, SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from server_harness import serve_process  # noqa: E402  (the tests' `infer serve` subprocess harness)

REPORTS = Path(__file__).parent / "reports"
SERVED = "SmolLM2-135M-Instruct"
QUESTIONS = [
    "Write a short story about a robot who learns to paint.", "Why is the sky blue?",
    "Explain photosynthesis to a child.", "What are the three states of matter?", "Give me a recipe for pancakes.",
    "Describe the water cycle.", "What is a prime number? Give examples.", "Summarize the plot of Romeo and Juliet.",
    "How do airplanes stay in the air?", "List five fruits and their colors.", "What causes the seasons on Earth?",
    "Write a haiku about autumn leaves.", "How does a computer store numbers?", "What is the capital of Japan?",
    "Explain what a noun is.", "Tell me a fun fact about octopuses.",
]


LABELS = {
    "batch1": ("batch 1, decode tok/s, in process (`LLM.stream`)", "generate, batch 1"),
    "batch1_server": ("batch 1, decode tok/s, streamed from `infer serve`", "generate, batch 1"),
    "batch16": ("16 prompts at once (`LLM.generate`), generated tok/s", "generate, batch 16, left-padded"),
    "batch16_server": ("16 concurrent HTTP requests to `infer serve`, generated tok/s",
                       "generate, batch 16, left-padded"),
}


def copy_bandwidth_gbs(mb: int = 512, reps: int = 5) -> float:
    """Median read+write bandwidth of a large tensor copy (bytes moved / s)."""
    src = torch.ones(mb * 2**20 // 4)
    dst = torch.empty_like(src)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t)
    return 2 * src.numel() * 4 / statistics.median(times) / 1e9


def greedy(tokens: int) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=tokens, ignore_eos=True)


def ours_batch1(llm: LLM, ids: list[int], tokens: int) -> float:
    stamps = [time.perf_counter() for _ in llm.stream(ids, greedy(tokens))]
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def ours_engine(llm: LLM, prompts: list[list[int]], tokens: int) -> float:
    started = time.perf_counter()
    outs = llm.generate_ids(prompts, greedy(tokens))
    return sum(len(o.token_ids) for o in outs) / (time.perf_counter() - started)


def _body(prompt: list[int], tokens: int, stream: bool = False) -> dict[str, object]:
    return {"model": SERVED, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": stream}


def server_batch1(base_url: str, ids: list[int], tokens: int) -> float:
    """Decode tok/s of one streamed request: the tokens after the first over the time from first to last chunk
    (EOS is ignored, so exactly `tokens` come; a chunk may carry two when text is held back mid-character)."""
    stamps = []
    with httpx.stream("POST", f"{base_url}/v1/completions", json=_body(ids, tokens, stream=True), timeout=600) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
    return (tokens - 1) / (stamps[-1] - stamps[0])


def server_batch(base_url: str, prompts: list[list[int]], tokens: int) -> float:
    async def run() -> float:
        async with httpx.AsyncClient(base_url=base_url, timeout=600) as http:
            bodies = [_body(p, tokens) for p in prompts]
            started = time.perf_counter()
            replies = await asyncio.gather(*[http.post("/v1/completions", json=b) for b in bodies])
            elapsed = time.perf_counter() - started
        return sum(r.json()["usage"]["completion_tokens"] for r in replies) / elapsed

    return asyncio.run(run())


def hf_batch1(model, ids: list[int], tokens: int) -> float:
    """(N-1) decode tokens over the time generate(N) takes beyond generate(1) (the prefill)."""
    x = torch.tensor([ids])
    kwargs = dict(do_sample=False, pad_token_id=0, attention_mask=torch.ones_like(x))
    with torch.no_grad():
        t = time.perf_counter()
        model.generate(x, max_new_tokens=1, **kwargs)
        prefill = time.perf_counter() - t
        t = time.perf_counter()
        model.generate(x, max_new_tokens=tokens, min_new_tokens=tokens, **kwargs)
        total = time.perf_counter() - t
    return (tokens - 1) / (total - prefill)


def hf_batch(model, prompts: list[list[int]], tokens: int, pad_id: int) -> float:
    """Batched generate of left-padded prompts: generated tokens / wall time, prefill included."""
    width = max(map(len, prompts))
    x = torch.tensor([[pad_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(x, attention_mask=mask, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False,
                             pad_token_id=pad_id)
        elapsed = time.perf_counter() - t
    return (out.shape[1] - width) * len(prompts) / elapsed


def median_ratio(ours: list[float], theirs: list[float]) -> float:
    return statistics.median(ours) / statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (median reported)")
    args = parser.parse_args()

    llm = LLM(None)  # the defaults `make serve` runs with
    prompts = [llm.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        llm.path.parent, gguf_file=llm.path.name, dtype=torch.float32
    ).eval()
    pad_id = llm.tokenizer.hf.pad_token_id or 0
    weight_bytes = sum(p.numel() * p.element_size() for p in llm.runner.model.parameters())
    bandwidth = copy_bandwidth_gbs()
    rows: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in LABELS}
    with serve_process() as base_url:
        ours_batch1(llm, prompts[0], 8)  # warm-up: oneDNN weight packing, first-call selection
        server_batch1(base_url, prompts[0], 8)
        hf_batch1(hf, prompts[0], 4)
        for _ in range(args.runs):
            hf1 = hf_batch1(hf, prompts[0], args.tokens)
            hf16 = hf_batch(hf, prompts, args.tokens, pad_id)
            measured = {"batch1": ours_batch1(llm, prompts[0], args.tokens),
                        "batch1_server": server_batch1(base_url, prompts[0], args.tokens),
                        "batch16": ours_engine(llm, prompts, args.tokens),
                        "batch16_server": server_batch(base_url, prompts, args.tokens)}
            for name, value in measured.items():
                rows[name][0].append(value)
                rows[name][1].append(hf16 if name.startswith("batch16") else hf1)
    roofline = bandwidth * 1e9 / weight_bytes
    results = {name: {"infer_tok_s": ours, "transformers_tok_s": theirs,
                      "infer_median_tok_s": statistics.median(ours),
                      "transformers_median_tok_s": statistics.median(theirs),
                      "ratio_infer_over_transformers": median_ratio(ours, theirs)}
               for name, (ours, theirs) in rows.items()}
    report = {
        "benchmark": "cpu_decode",
        "model": llm.path.name,
        "prompt_tokens": [len(p) for p in prompts],
        "new_tokens": args.tokens,
        "runs": args.runs,
        "results": results,
        "weight_bytes": weight_bytes,
        "copy_bandwidth_gb_s": bandwidth,
        "roofline_batch1_tok_s": roofline,
        "infer_batch1_fraction_of_roofline": results["batch1"]["infer_median_tok_s"] / roofline,
        "server_flags": "infer serve (defaults)",
        "hardware": {"cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()},
        "software": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "engine_config": llm.config.as_dict(),
    }
    REPORTS.mkdir(exist_ok=True)
    (REPORTS / "cpu_decode.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    md = [
        "# CPU decode — SmolLM2-135M-Instruct (GGUF Q4_1 dequantized to fp32), default engine settings",
        "",
        f"Hardware: {report['hardware']['cpu']}, {report['hardware']['threads']} threads. "
        f"Software: torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}.",
        f"16 different chat prompts ({min(map(len, prompts))}-{max(map(len, prompts))} tokens), {args.tokens} new "
        f"tokens each, greedy, EOS ignored; median of {args.runs} runs interleaved with the peer.",
        "Batch-16 rows count generated tokens over wall time with the prefill included, for both engines.",
        "",
        "| measurement | infer tok/s | transformers tok/s (peer) | infer ÷ transformers |",
        "|---|---:|---:|---:|",
    ]
    for name, r in results.items():
        ours_label, peer_label = LABELS[name]
        md.append(f"| {ours_label} | {r['infer_median_tok_s']:.1f} | {r['transformers_median_tok_s']:.1f} "
                  f"({peer_label}) | {r['ratio_infer_over_transformers']:.2f} |")
    md += [
        "",
        f"Batch-1 roofline: {weight_bytes / 1e6:.0f} MB of fp32 weights read per token at the measured copy bandwidth "
        f"{bandwidth:.1f} GB/s = {roofline:.1f} tok/s; infer reaches {report['infer_batch1_fraction_of_roofline']:.2f} of it.",
        "",
        f"EngineConfig: `{json.dumps(llm.config.as_dict(), default=str)}`",
        "",
        "Reproduce: `.venv/bin/python benchmarks/cpu_decode.py`",
    ]
    (REPORTS / "cpu_decode.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
