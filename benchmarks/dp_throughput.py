"""Offline throughput of data parallelism: LLM(data_parallel_size=N) against one engine (DP=1), same workload.

    python benchmarks/dp_throughput.py --shape llama-3.2-1b --dp 2 --report dp_throughput_gpu.md
    python benchmarks/dp_throughput.py --model bundled --dp 2 --requests 64 --new-tokens 64   # the CPU, SmolLM2

`--shape` builds a model directory with random weights (`load_format="dummy"`, bf16 on CUDA) from
benchmarks/model_shapes.py, so nothing needs the network; `--model` takes a checkpoint (`bundled`: the bundled
SmolLM2). Prompts are random token ids (lengths drawn from --prompt-len), greedy, EOS ignored, every prompt
submitted at once. DP=1 is the in-process LLM; DP=N runs N engine-core processes (cuda:0..N-1 with TP=1; on the
CPU each core gets cpu_count // N threads) behind one DPClient, the requests routed by --load-balance-method.
`--configs` picks what is timed: `dp` (DP=N), `core` (DP=1 through one engine-core process, as the DP client
drives each of N: what a core costs apart from sharing the host), `share` (one core process given every N-th
prompt: one DP engine's part alone; N x its tok/s is what DP=N reaches if the engines do not slow each other),
`pinned` (DP=N with every thread of core i bound to its own slice of the host's CPUs, its GPU's NUMA-local ones
where sysfs says which) and `inproc` (the in-process DP=1, the baseline the ratio is taken against). `--timeline`
prints, per run of a multi-process configuration, when the prompts were sent and each core's outputs arrived.
Each configuration is loaded on its own (the
multi-process ones first, while this process has not touched the GPU), warmed with one small batch, then timed
--repeats times (the first timed run may still compile kernels for new shapes: each run's time is reported);
the median run counts. Prints tok/s and the ratio; --report writes a markdown report.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
import model_shapes as ms  # noqa: E402

from infer import LLM, SamplingParams  # noqa: E402
from infer.dp_llm import DataParallelLLM  # noqa: E402
from infer.frontend.client import EngineClient  # noqa: E402

CONFIGS = ("dp", "pinned", "core", "share", "inproc")  # the order they run in: processes first, then this process's engine


def workload(vocab: int, requests: int, lengths: tuple[int, int], seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(rng.randint(*lengths))] for _ in range(requests)]


def cpu_slices(n: int) -> list[list[int]]:
    """n disjoint slices of the CPUs this process may use: each GPU's NUMA-local CPUs when sysfs names them
    (the GPUs on one node split that node's), else the allowed CPUs cut into n contiguous runs."""
    allowed = sorted(os.sched_getaffinity(0))
    local: list[list[int]] = []
    try:
        bus_ids = subprocess.run(["nvidia-smi", "--query-gpu=pci.bus_id", "--format=csv,noheader"],
                                 capture_output=True, text=True, check=True).stdout.split()[:n]
        for bus in bus_ids:
            text = Path(f"/sys/bus/pci/devices/{bus[-12:].lower()}/local_cpulist").read_text().strip()
            cpus = {c for part in text.split(",") for c in _cpu_range(part)}
            local.append([c for c in allowed if c in cpus])
    except (OSError, subprocess.CalledProcessError, ValueError):
        local = []
    if len(local) == n and all(local):
        shared: dict[tuple[int, ...], list[int]] = {}
        for i, cpus in enumerate(local):
            shared.setdefault(tuple(cpus), []).append(i)
        slices: list[list[int]] = [[] for _ in range(n)]
        for cpus, gpus in shared.items():
            for k, i in enumerate(gpus):
                slices[i] = list(cpus[k * len(cpus) // len(gpus):(k + 1) * len(cpus) // len(gpus)])
        if all(slices):
            return slices
    return [allowed[i * len(allowed) // n:(i + 1) * len(allowed) // n] for i in range(n)]


def _cpu_range(part: str) -> range:
    first, _, last = part.partition("-")
    return range(int(first), int(last or first) + 1)


def pin(pid: int, cpus: list[int]) -> None:
    """Bind every thread of process `pid` to `cpus` (affinity is per thread on Linux)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        os.sched_setaffinity(int(task), cpus)


def build(model: str | None, options: dict[str, object], config: str, args: argparse.Namespace) -> tuple[object, int]:
    """The LLM for one configuration, and its number of engines."""
    if config == "inproc":
        return LLM(model, **options), 1
    dp = 1 if config in ("core", "share") else args.dp
    llm = DataParallelLLM(model, data_parallel_size=dp, load_balance_method=args.load_balance_method, **options)
    if config == "pinned":
        for info, cpus in zip(llm.infos, cpu_slices(dp)):
            pin(info.pid, cpus)
            print(f"core pid {info.pid} ({info.config.device}) pinned to CPUs {cpus[0]}-{cpus[-1]} ({len(cpus)})")
    return llm, dp


def measure(model: str | None, options: dict[str, object], config: str, args: argparse.Namespace) -> dict[str, object]:
    """Load, warm, time `repeats` runs of the workload; tok/s of the median run."""
    started = time.perf_counter()
    llm, dp = build(model, options, config, args)
    load_s = time.perf_counter() - started
    vocab = llm.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=args.new_tokens, ignore_eos=True)
    llm.generate_ids(workload(vocab, min(8, args.requests), (16, 32), seed=1), params)  # warm-up
    pids = [info.pid for info in getattr(llm, "infos", [])]
    runs, cpu = [], []
    for repeat in range(args.repeats):
        prompts = workload(vocab, args.requests, tuple(args.prompt_len), seed=100 + repeat)  # fresh: no prefix hits
        if config == "share":
            prompts = prompts[::args.dp]
        timeline = Timeline() if args.timeline and pids else None
        cpu0, cores0, t0 = time.process_time(), [cpu_seconds(p) for p in pids], time.perf_counter()
        outs = llm.generate_ids(prompts, params)
        runs.append(time.perf_counter() - t0)
        if timeline is not None:
            timeline.close()
            print(f"{LABELS[config]}, run {repeat + 1} ({runs[-1]:.2f} s):\n{timeline.summary(t0, t0 + runs[-1])}")
        cpu.append((time.process_time() - cpu0, [cpu_seconds(p) - c for p, c in zip(pids, cores0)]))
        assert sum(len(o.token_ids) for o in outs) == len(prompts) * args.new_tokens
    if config != "inproc":
        llm.close()  # type: ignore[attr-defined]
    del llm
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    seconds = statistics.median(runs)
    # the CPU times of the median run (the upper one of an even count, whose median is no single run)
    this_cpu, cores_cpu = cpu[sorted(range(len(runs)), key=runs.__getitem__)[len(runs) // 2]]
    tokens = len(prompts) * args.new_tokens
    return {"config": config, "dp": dp, "tok_s": tokens / seconds, "seconds": seconds, "runs_s": runs,
            "load_s": load_s, "client_cpu_s": this_cpu, "cores_cpu_s": cores_cpu}


class Timeline:
    """When each core's outputs reached this process during one run (--timeline): EngineClient._deliver wrapped to
    note the time, its core's pid and the step's tokens, and flush to note when the requests were sent."""

    def __init__(self) -> None:
        self.events: list[tuple[float, int, int]] = []  # (time, core pid, tokens) per delivered step
        self.sent: list[float] = []
        self.busy = 0.0  # seconds spent in _deliver
        deliver, flush, timeline = EngineClient._deliver, EngineClient.flush, self

        def timed_deliver(client: EngineClient, step) -> None:  # type: ignore[no-untyped-def]
            t = time.perf_counter()
            deliver(client, step)
            timeline.busy += time.perf_counter() - t
            timeline.events.append((t, client.info.pid, len(step.emitted.token_ids) + len(step.emitted.outputs)))

        def timed_flush(client: EngineClient) -> None:
            had = bool(client._adds)
            flush(client)
            if had:
                timeline.sent.append(time.perf_counter())

        EngineClient._deliver, EngineClient.flush = timed_deliver, timed_flush  # type: ignore[method-assign]
        self._restore = (deliver, flush)

    def close(self) -> None:
        EngineClient._deliver, EngineClient.flush = self._restore  # type: ignore[method-assign]

    def summary(self, t0: float, t1: float) -> str:
        lines = [f"  sent at {', '.join(f'{t - t0:.3f}' for t in self.sent)} s; in _deliver {self.busy:.2f} s"]
        for pid in sorted({pid for _, pid, _ in self.events}):
            mine = [(t, n) for t, p, n in self.events if p == pid]
            gaps = sorted((b[0] - a[0] for a, b in zip(mine, mine[1:])), reverse=True)[:3]
            lines.append(f"  core {pid}: {len(mine)} steps, {sum(n for _, n in mine)} outputs, first at "
                         f"{mine[0][0] - t0:.3f} s, last at {mine[-1][0] - t0:.3f} s (run ends {t1 - t0:.3f} s); "
                         f"largest gaps {', '.join(f'{g * 1e3:.0f}' for g in gaps)} ms")
        return "\n".join(lines)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process `pid` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def hardware() -> str:
    if torch.cuda.is_available():
        return f"{torch.cuda.device_count()} x {torch.cuda.get_device_name()}"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"


LABELS = {"inproc": "in-process engine", "core": "one core process", "dp": "N core processes",
          "pinned": "N core processes, pinned", "share": "one core process, 1/N of the prompts"}


def report(results: list[dict[str, object]], args: argparse.Namespace, what: str) -> str:
    base = results[0]["tok_s"]
    lines = [f"# Data parallelism, offline throughput — {what}", "",
             f"Hardware: {hardware()}; torch {torch.__version__}.",
             f"Workload: {args.requests} prompts of {args.prompt_len[0]}-{args.prompt_len[1]} random tokens, "
             f"{args.new_tokens} new tokens each (greedy, EOS ignored), all submitted at once; median of "
             f"{args.repeats} runs; routing {args.load_balance_method}; host CPUs {len(os.sched_getaffinity(0))}, "
             f"load average {os.getloadavg()[0]:.1f} at the end.",
             f"Command: `python {' '.join(sys.argv)}`", "",
             "| configuration | DP | tok/s | median run (s) | runs (s) | CPU s: this process / each core "
             "| load (s) | vs in-process DP=1 |",
             "|---|---:|---:|---:|---|---|---:|---:|"]
    for r in results:
        runs = ", ".join(f"{t:.2f}" for t in r["runs_s"])  # type: ignore[attr-defined]
        cores = " ".join(f"{c:.2f}" for c in r["cores_cpu_s"])  # type: ignore[attr-defined]
        lines.append(f"| {LABELS[r['config']]} | {r['dp']} | {r['tok_s']:.0f} | {r['seconds']:.2f} | {runs} | "
                     f"{r['client_cpu_s']:.2f} / {cores or '-'} | {r['load_s']:.1f} | "
                     f"{r['tok_s'] / base:.2f}x |")  # type: ignore[operator]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="llama-3.2-1b", choices=sorted(ms.SHAPES))
    parser.add_argument("--model", help="a checkpoint instead of --shape; 'bundled' for the bundled SmolLM2")
    parser.add_argument("--dp", type=int, default=2, help="data-parallel engines compared with one")
    parser.add_argument("--requests", type=int, default=512)
    parser.add_argument("--prompt-len", type=int, nargs=2, default=(128, 512), metavar=("MIN", "MAX"))
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--configs", default="dp,inproc",
                        help=f"comma-separated, from {', '.join(CONFIGS)} (inproc is always timed: the baseline)")
    parser.add_argument("--load-balance-method", default="least_load")
    parser.add_argument("--timeline", action="store_true",
                        help="print when each core's outputs arrived in every run of the multi-process configs")
    parser.add_argument("--max-seq-len", type=int, default=2048)
    parser.add_argument("--max-batch-size", type=int, default=None)
    parser.add_argument("--report", type=Path, help="write a markdown report here")
    args = parser.parse_args()
    options: dict[str, object] = {"max_seq_len": args.max_seq_len}
    if args.max_batch_size is not None:
        options["max_batch_size"] = args.max_batch_size
    if args.model is None:
        model: str | None = str(ms.write_model_dir(args.shape, Path("/tmp/infer-shapes")))
        options["load_format"] = "dummy"
        what = f"{args.shape} (random weights)"
    else:
        model = None if args.model == "bundled" else args.model
        what = "bundled SmolLM2-135M-Instruct" if model is None else Path(args.model).name
    wanted = set(args.configs.split(",")) | {"inproc"}
    if unknown := wanted - set(CONFIGS):
        parser.error(f"--configs: unknown {sorted(unknown)}; choose from {', '.join(CONFIGS)}")
    # the core processes first: they load while this process has not touched the GPU yet
    results = [measure(model, options, c, args) for c in CONFIGS if c in wanted][::-1]
    base = results[0]["tok_s"]
    for r in results:
        runs = ", ".join(f"{t:.2f}" for t in r["runs_s"])  # type: ignore[attr-defined]
        cores = " ".join(f"{c:.2f}" for c in r["cores_cpu_s"])  # type: ignore[attr-defined]
        print(f"{LABELS[r['config']]} (DP={r['dp']}): {r['tok_s']:.0f} tok/s, {r['tok_s'] / base:.2f}x "  # type: ignore[operator]
              f"(runs {runs} s; CPU s this process {r['client_cpu_s']:.2f}, cores {cores or '-'}; "
              f"load {r['load_s']:.1f} s)")
    if args.report is not None:
        args.report.write_text(report(results, args, what))
        print(f"wrote {args.report}")


if __name__ == "__main__":
    main()
