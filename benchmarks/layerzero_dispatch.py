"""Dispatch overhead of layerzero: a bound call site and an lz op on a call-cache hit, against a direct call of the kernel.

For each op, four pairs, timed interleaved (so machine noise hits both sides alike):
  planned    what a model's forward does: `calls` bound sites of the op, each called once inside one
             `lz.plan(signature)` pass (vouched sites skip their guards), vs calling the chosen kernel as often
  bound      one `lz.bind(op)` site called with the canonical call, outside any plan (its guard runs every call)
  selected   the public `lz.<op>` on a call-cache hit vs calling the chosen kernel directly
  reference  `with lz.disabled()` (reference kernels only) vs calling the reference function directly
and the cost of a miss (a shape never seen: context build, filter, score). Then the same paths around a kernel
that does nothing (registered on top for the measurement), where the kernel's own time and its noise are gone:
what layerzero itself costs per call. Medians of per-round means, µs;
the overhead is the median of the per-round paired differences.
Runs on CPU, and on CUDA when available (CUDA times are host-side call latency: the kernels are tiny
and asynchronous, so the device never limits the loop). Under a minute.

    .venv/bin/python benchmarks/layerzero_dispatch.py
Writes benchmarks/reports/layerzero_dispatch.{json,md}.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("LAYERZERO_PERFDB", "off")  # static priorities only: the choice is the same everywhere

import torch  # noqa: E402

import layerzero as lz  # noqa: E402
from layerzero.select.context import SelectionContext  # noqa: E402
from layerzero.select.engine import get_engine  # noqa: E402
from report_files import write_report  # noqa: E402

REPORTS = Path(__file__).resolve().parent / "reports"


def _calls(device: str) -> list[tuple[str, Callable[[], Any], tuple[Any, ...], dict[str, Any]]]:
    """(op, public lz call, canonical args, canonical kwargs) for small decode-like shapes."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def t(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g).to(device)

    x, w, gate = t(4, 256), t(256), t(4, 512)
    q, k = t(1, 1, 8, 64), t(1, 32, 2, 64)
    angles = t(4, 32)
    xr = t(4, 8, 64)
    cos, sin = angles.cos(), angles.sin()
    return [
        ("rms_norm", lambda: lz.rms_norm(x, w), (x, w), {"eps": 1e-6, "weight_offset": 0.0}),
        ("silu_and_mul", lambda: lz.silu_and_mul(gate), (gate,), {}),
        ("rope", lambda: lz.rope(xr, cos, sin), (xr, cos, sin), {"interleaved": False}),
        ("attention", lambda: lz.attention(q, k, k, layout="BSHD"), (q, k, k),
         {"causal": True, "scale": 0.125, "sliding_window": None, "layout": "BSHD"}),
    ]


def _time(fn: Callable[[], Any], n: int, sync: Callable[[], None]) -> float:
    sync()
    start = time.perf_counter_ns()
    for _ in range(n):
        fn()
    sync()
    return (time.perf_counter_ns() - start) / n / 1e3


def _synchronizer(device: str) -> Callable[[], None]:
    """Waits for the device's queued work (CUDA), or nothing (CPU)."""
    return (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)


def _pair(a: Callable[[], Any], b: Callable[[], Any], n: int, rounds: int, sync: Callable[[], None]) -> tuple[float, float, float]:
    """Medians of a's and b's round means, and the median of the paired per-round differences a - b."""
    for _ in range(3):
        a(), b()
    ta, tb = [], []
    for _ in range(rounds):
        ta.append(_time(a, n, sync))
        tb.append(_time(b, n, sync))
    return statistics.median(ta), statistics.median(tb), statistics.median(x - y for x, y in zip(ta, tb))


def _miss_us(op: str, args: tuple[Any, ...], kwargs: dict[str, Any], device: str) -> float:
    """One full selection (call-cache and selection-cache miss): context, filter, score."""
    engine = get_engine()
    samples = []
    for _ in range(20):
        engine.invalidate()
        start = time.perf_counter_ns()
        engine.choose(SelectionContext.from_tensors(op, *args, **kwargs))
        samples.append((time.perf_counter_ns() - start) / 1e3)
    return statistics.median(samples)


def bench(device: str, n: int, rounds: int) -> list[dict[str, Any]]:
    sync = _synchronizer(device)
    rows = []
    for op, public, args, kwargs in _calls(device):
        ref_impl = get_engine().registry.reference(op).impl
        with lz.disabled():
            lz_ref, direct_ref, over_ref = _pair(public, lambda: ref_impl(*args, **kwargs), n, rounds, sync)
        chosen = lz.which(op, *args, **kwargs)["kernel_id"]
        chosen_impl = get_engine().registry.get(chosen).impl
        lz_sel, direct_sel, over_sel = _pair(public, lambda: chosen_impl(*args, **kwargs), n, rounds, sync)
        site = lz.bind(op)
        site(*args, **kwargs)
        bound, direct_b, over_b = _pair(lambda: site(*args, **kwargs), lambda: chosen_impl(*args, **kwargs), n, rounds, sync)
        sites = [lz.bind(op) for _ in range(n)]

        def planned() -> None:
            with lz.plan((op, device)):
                for s in sites:
                    s(*args, **kwargs)

        def direct_loop() -> None:
            for _ in sites:
                chosen_impl(*args, **kwargs)

        planned(), planned()  # two passes vouch for every site
        if not all(s.vouched for s in sites):
            raise RuntimeError(f"{op}: the plan did not vouch for its sites")
        plan_us, direct_p, over_p = (v / n for v in _pair(planned, direct_loop, 1, rounds, sync))
        if site.kernel_id != chosen or site.binds != 1:
            raise RuntimeError(f"{op}: the bound site holds {site!r}, expected {chosen} bound once")
        rows.append({
            "device": device, "op": op, "selected": chosen,
            "bound_direct_us": direct_b, "bound_us": bound, "bound_overhead_us": over_b,
            "planned_direct_us": direct_p, "planned_us": plan_us, "planned_overhead_us": over_p,
            "reference_direct_us": direct_ref, "reference_lz_us": lz_ref, "reference_overhead_us": over_ref,
            "selected_direct_us": direct_sel, "selected_lz_us": lz_sel, "selected_overhead_us": over_sel,
            "miss_us": _miss_us(op, args, kwargs, device),
        })
    return rows


def _environment() -> dict[str, Any]:
    env = {"python": platform.python_version(), "torch": torch.__version__, "platform": platform.platform(),
           "cpu": platform.processor() or platform.machine(), "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(0)
        env["cuda"] = torch.version.cuda
    return env


def _markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    lines = [
        "# layerzero dispatch overhead",
        "",
        f"{env.get('gpu', 'CPU only')}; {env['cpu']}, {env['threads']} threads; torch {env['torch']}, "
        f"Python {env['python']}. {report['calls_per_round']} calls x {report['rounds']} interleaved rounds; "
        "medians of round means, µs per call. Overhead = median over rounds of (the layerzero path - the direct "
        "call of the same kernel in the same round), so load that drifts between rounds cancels.",
        "",
        "| device | op | kernel picked | direct (µs) | planned (µs) | **planned overhead (µs)** | bound overhead (µs) | lz op (µs) | lz op overhead (µs) | ref direct (µs) | lz, disabled (µs) | ref overhead (µs) | miss (µs) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(
            f"| {r['device']} | {r['op']} | {r['selected']} | {r['planned_direct_us']:.1f} | {r['planned_us']:.1f} | "
            f"**{r['planned_overhead_us']:.2f}** | {r['bound_overhead_us']:.2f} | {r['selected_lz_us']:.1f} | {r['selected_overhead_us']:.1f} | {r['reference_direct_us']:.1f} | {r['reference_lz_us']:.1f} | "
            f"{r['reference_overhead_us']:.1f} | {r['miss_us']:.0f} |"
        )
    lines += ["", "Around a do-nothing kernel (the cost of layerzero alone, µs per call):", "",
              "| device | op | **planned** | bound (guarded) | lz op |", "|---|---|---|---|---|"]
    lines += [f"| {r['device']} | {r['op']} | **{r['planned_us']:.2f}** | {r['bound_us']:.2f} | {r['lz_op_us']:.2f} |"
              for r in report["noop_kernel"]]
    lines += ["", "`planned`: per call, the calls of a model's forward: one `lz.plan` pass over many bound sites of "
              "the op, each called once (its plan entry shared by all of them); vouched sites skip their guards. "
              "`bound`: one site outside any plan: after its first call it runs a generated guard and then the kernel. `lz op` is the public function (argument normalization, the call "
              "key, the call cache). `miss` is one full selection (context, filter with reasons, scoring) after "
              "clearing the caches."]
    return "\n".join(lines) + "\n"


def noop_costs(device: str, n: int, rounds: int) -> list[dict[str, Any]]:
    """Per-call cost of each path around a do-nothing kernel of the op (µs; direct = calling that function)."""
    from layerzero.kernels import get_registry
    from layerzero.select.kernel_spec import KernelSpec

    sync = _synchronizer(device)
    rows = []
    for op, public, args, kwargs in _calls(device):
        def noop(*a: Any, **k: Any) -> Any:
            return a[0]

        spec = KernelSpec(f"noop.{op}", op, "noop", noop, priority=10**6, platforms=frozenset({"cpu", "cuda"}),
                          graph_safe=True)
        get_registry().register(spec)
        try:
            sites = [lz.bind(op) for _ in range(n)]

            def planned() -> None:
                with lz.plan((op, device, "noop")):
                    for s in sites:
                        s(*args, **kwargs)

            def direct() -> None:
                for _ in sites:
                    noop(*args, **kwargs)

            def bound() -> None:
                for _ in sites:
                    sites[0](*args, **kwargs)

            def public_op() -> None:
                for _ in sites:
                    public()

            planned(), planned()
            row = {"device": device, "op": op}
            for name, fn in (("planned", planned), ("bound", bound), ("lz_op", public_op)):
                _, _, over = _pair(fn, direct, 1, rounds, sync)
                row[f"{name}_us"] = over / n
            rows.append(row)
        finally:
            get_registry().unregister(spec.kernel_id)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=300, help="calls per round")
    parser.add_argument("--rounds", type=int, default=31)
    parser.add_argument("--out", type=Path, default=REPORTS / "layerzero_dispatch")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the overhead is host-side Python; one intra-op thread keeps shared machines quiet
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    results = [row for device in devices for row in bench(device, args.calls, args.rounds)]
    noops = [row for device in devices for row in noop_costs(device, args.calls, args.rounds)]
    report = {"environment": _environment(), "calls_per_round": args.calls, "rounds": args.rounds, "results": results,
              "noop_kernel": noops}
    write_report(args.out, report, _markdown(report))
    print(_markdown(report))


if __name__ == "__main__":
    main()
