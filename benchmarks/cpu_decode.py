"""CPU decode of the bundled SmolLM2-135M at the server's default settings: infer vs transformers and llama.cpp,
same run.

    .venv/bin/python benchmarks/cpu_decode.py [--tokens 64] [--runs 3] [--llama-cpp-python /tmp/llamacpp/bin/python]

Each measurement is interleaved run by run with its transformers peer, so drift on a shared machine
hits both alike:
- batch 1: decode tok/s of one chat request (first token excluded), in process (`LLM.stream`) and
  streamed from a real `infer serve` process, vs transformers' `generate`;
- batch 16: 16 different chat prompts at once, generated tokens / wall time (prefill included),
  in process (`LLM.generate`) and as 16 concurrent HTTP requests to `infer serve`, vs transformers'
  batch-16 `generate` of the same prompts, left-padded.
- with --llama-cpp-python (an interpreter with llama-cpp-python, see benchmarks/llama_cpp_peer.py): batch-1
  decode and prompt processing of the same prompt on the same GGUF with the same thread count, against ours
  (prompt processing: prompt tokens over the time to the first token).
Both run the default EngineConfig (max_seq_len 4096, max_batch_size 32, quantization auto: the GGUF's 4-bit
weights stay 4-bit), as `make serve` does. Writes benchmarks/reports/cpu_decode.{json,md}.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch
import transformers

from infer import LLM, SamplingParams
from layerzero.kernels.native.build import vector_isa

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


def ours_prompt(llm: LLM, ids: list[int]) -> float:
    """Prompt tokens over the time to the first token (prefill and one sample), the prefix cache emptied first: a
    prompt measured before would otherwise be read from it, not computed."""
    llm.engine.kv.reset_prefix_cache()
    started = time.perf_counter()
    next(iter(llm.stream(ids, greedy(1))))
    return len(ids) / (time.perf_counter() - started)


class LlamaCpp:
    """benchmarks/llama_cpp_peer.py in the interpreter that has llama-cpp-python, one JSON line per measurement."""

    def __init__(self, python: str, model: Path, threads: int) -> None:
        script = Path(__file__).with_name("llama_cpp_peer.py")
        self.proc = subprocess.Popen([python, str(script), str(model), str(threads)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.version = json.loads(self.proc.stdout.readline())["version"]

    def measure(self, ids: list[int], tokens: int) -> dict[str, float]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "tokens": tokens}) + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def weights_read_per_token(model: torch.nn.Module) -> int:
    """Bytes of weights a batch-1 decode step reads: every parameter and 4-bit buffer, but not an embedding table
    apart from the head (a lookup reads one row)."""
    embed = model.embed if model.lm_head is not model.embed else None
    params = sum(p.numel() * p.element_size() for p in model.parameters() if p is not embed)
    packed = sum(b.numel() * b.element_size() for n, b in model.named_buffers() if n.endswith(("qweight", "scales_zeros")))
    return params + packed


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


def cpu_name() -> str:
    """The CPU's model name and the vector form the native kernels build in on it."""
    isa = vector_isa()
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return f"{line.split(':', 1)[1].strip()} ({isa})"
    return f"{platform.processor() or platform.machine()} ({isa})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="new tokens per request")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (median reported)")
    parser.add_argument("--llama-cpp-python", default=None, metavar="PYTHON",
                        help="an interpreter with llama-cpp-python: adds llama.cpp batch-1 decode and prompt rows")
    parser.add_argument("--out", type=Path, default=REPORTS / "cpu_decode", help="report path; its .json and .md are written")
    args = parser.parse_args()

    llm = LLM(None)  # the defaults `make serve` runs with
    prompts = [llm.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        llm.path.parent, gguf_file=llm.path.name, dtype=torch.float32
    ).eval()
    pad_id = llm.tokenizer.pad_token_id or 0
    weight_bytes = weights_read_per_token(llm.runner.model)
    bandwidth = copy_bandwidth_gbs()
    rows: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in LABELS}
    peer = LlamaCpp(args.llama_cpp_python, llm.path, torch.get_num_threads()) if args.llama_cpp_python else None
    versus: dict[str, tuple[list[float], list[float]]] = {"decode": ([], []), "prompt": ([], [])}
    with serve_process() as server:
        base_url = server.base_url
        ours_batch1(llm, prompts[0], 8)  # warm-up: oneDNN weight packing, first-call selection
        server_batch1(base_url, prompts[0], 8)
        hf_batch1(hf, prompts[0], 4)
        if peer is not None:
            peer.measure(prompts[0], 8)
        for _ in range(args.runs):
            if peer is not None:
                theirs = peer.measure(prompts[0], args.tokens)
                versus["decode"][0].append(ours_batch1(llm, prompts[0], args.tokens))
                versus["decode"][1].append(theirs["decode_tok_s"])
                versus["prompt"][0].append(ours_prompt(llm, prompts[0]))
                versus["prompt"][1].append(theirs["prompt_tok_s"])
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
    llama_cpp = {name: {"infer_tok_s": ours, "llama_cpp_tok_s": theirs, "ratio_infer_over_llama_cpp":
                        median_ratio(ours, theirs)} for name, (ours, theirs) in versus.items() if ours}
    if peer is not None:
        peer.close()
    report = {
        "benchmark": "cpu_decode",
        "llama_cpp": llama_cpp,
        "llama_cpp_python": peer.version if peer is not None else None,
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
        "hardware": {"cpu": cpu_name(), "threads": torch.get_num_threads()},
        "software": {"python": platform.python_version(), "torch": torch.__version__,
                     "transformers": transformers.__version__},
        "engine_config": llm.config.as_dict(),
    }
    args.out.parent.mkdir(exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    md = [
        "# CPU decode — SmolLM2-135M-Instruct (GGUF Q4_1 kept 4-bit, quantization=auto), default engine settings",
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
    if llama_cpp:
        md += ["", f"llama.cpp (llama-cpp-python {report['llama_cpp_python']}) on the same GGUF, "
               f"{report['hardware']['threads']} threads, the first prompt, interleaved run by run:", "",
               "| measurement | infer tok/s | llama.cpp tok/s | infer ÷ llama.cpp |", "|---|---:|---:|---:|"]
        for name, label in (("decode", "batch 1, decode"), ("prompt", "prompt processing (prompt tokens / time to first token)")):
            r = llama_cpp[name]
            md.append(f"| {label} | {statistics.median(r['infer_tok_s']):.1f} | {statistics.median(r['llama_cpp_tok_s']):.1f} "
                      f"| {r['ratio_infer_over_llama_cpp']:.2f} |")
    md += [
        "",
        f"Batch-1 roofline: {weight_bytes / 1e6:.0f} MB of weights read per token at the measured copy bandwidth "
        f"{bandwidth:.1f} GB/s = {roofline:.1f} tok/s; infer reaches {report['infer_batch1_fraction_of_roofline']:.2f} of it.",
        "",
        f"EngineConfig: `{json.dumps(llm.config.as_dict(), default=str)}`",
        "",
        "Reproduce: `.venv/bin/python benchmarks/cpu_decode.py --llama-cpp-python PYTHON` (PYTHON: a venv with "
        "`pip install llama-cpp-python==0.3.36`, see benchmarks/llama_cpp_peer.py)",
    ]
    args.out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))


if __name__ == "__main__":
    main()
