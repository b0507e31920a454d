"""The host's time per decode step with and without probe scores, through `Engine.step` (core and text side), with a
runner that does nothing: what asking for probes costs the host, measurable on any machine.

    python benchmarks/probe_host_cost.py [--batch 64] [--probes 64] [--steps 300] [--repeats 3] [--out STEM]

`--batch` requests of 128 prompt tokens decode `--steps` steps after their prefill; with probes each asks for all
`--probes` probes (the probe benchmark's 16 x 4), whose scores the runner returns as random numbers. The GPU probe
benchmark's batch-64 runs are host-bound when this cost is close to a step's device time (docs/engine.md).
Reported: ms per step, median of `--repeats` interleaved runs, and the probes' share.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from core_host_cost import NullRunner  # noqa: E402  (with a probe layout it returns scores for every probe)
from engine_fakes import FakeTokenizer  # noqa: E402  (the tests' model-free tokenizer)

from infer.engine.config import EngineConfig  # noqa: E402
from infer.build.in_process import Engine  # noqa: E402
from infer.kv.kv_manager import KVCacheManager  # noqa: E402
from infer.sampling.params import SamplingParams  # noqa: E402
from omniscience.bank import ProbeLayout  # noqa: E402
from omniscience.weights import Probe  # noqa: E402
from report_files import write_report  # noqa: E402


def layout_of(count: int) -> ProbeLayout:
    probes = tuple(Probe(f"p{i}", i % 4, "sigmoid", torch.zeros(8), 0.0, Path("none"), "") for i in range(count))
    return ProbeLayout(probes, {p.name: i for i, p in enumerate(probes)}, 1)


def ms_per_step(layout: ProbeLayout | None, batch: int, steps: int) -> float:
    engine = Engine(EngineConfig(max_seq_len=2048, max_batch_size=batch), NullRunner(layout),
                    KVCacheManager(8000, 16), FakeTokenizer())  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_tokens=steps + 16, ignore_eos=True,
                            probes=True if layout is not None else None)
    requests = [engine.add_request(list(range(1, 129)), params) for _ in range(batch)]
    while not all(r.output_token_ids for r in requests):
        engine.step()
    for _ in range(4):
        engine.step()
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    return 1e3 * (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--probes", type=int, default=64)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "reports" / "probe_host_cost_cpu")
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"plain": [], "probes": []}
    for _ in range(args.repeats):
        runs["plain"].append(ms_per_step(None, args.batch, args.steps))
        runs["probes"].append(ms_per_step(layout_of(args.probes), args.batch, args.steps))
    plain, probed = statistics.median(runs["plain"]), statistics.median(runs["probes"])
    text = "\n".join([
        f"# Host time per decode step with probe scores (batch {args.batch}, {args.probes} probes)", "",
        f"`python benchmarks/probe_host_cost.py --batch {args.batch} --probes {args.probes}`; `Engine.step` with a "
        f"runner that does nothing, median of {args.repeats} interleaved runs of {args.steps} steps.", "",
        "| requests ask for | ms per step | runs |", "|---|---:|---|",
        f"| nothing | {plain:.3f} | {', '.join(f'{x:.3f}' for x in runs['plain'])} |",
        f"| every probe | {probed:.3f} | {', '.join(f'{x:.3f}' for x in runs['probes'])} |", "",
        f"The probes cost the host {probed - plain:.3f} ms a step, "
        f"{1e3 * (probed - plain) / args.batch:.1f} µs a row.",
    ])
    print(text)
    write_report(args.out, {"batch": args.batch, "probes": args.probes, "steps": args.steps, "runs": runs,
                            "median_ms": {"plain": plain, "probes": probed}}, text)


if __name__ == "__main__":
    main()
