"""`infer serve` from process start to a healthy /health, phase by phase, and what each process holds once up.

Starts `infer serve` (the bundled model on the CPU by default; `--shape NAME` for a random-weight shape from
model_shapes.py), reads its start-up report lines as they come (each stamped with the seconds since the process
started), polls /health until 200, then reads the resident memory of the engine core and of every API server
process (/proc) and times the first completion against the median of the next five (the first batch within 10% of
warm is the target). Writes startup_<device>_<model>.md under OUT_DIR (default benchmarks/reports).

    python benchmarks/startup.py                          # the bundled model, this machine's defaults
    python benchmarks/startup.py --shape llama-3.2-1b     # on a GPU: the 1B shape, 4 API servers by default
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from bench_serving import free_port  # noqa: E402

SHAPE_FLAGS = ["--max-seq-len", "2048", "--max-batch-size", "256", "--kv-cache-memory-gb", "16"]  # serve_vs_offline's
BODY = {"prompt": "The quick brown fox", "max_tokens": 16, "temperature": 0, "ignore_eos": True}


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def run(model_args: list[str], api_servers: int | None, timeout_s: float) -> dict:
    port = free_port()
    cmd = [sys.executable, "-m", "infer.cli", "serve", *model_args, "--port", str(port)]
    if api_servers is not None:
        cmd += ["--api-server-count", str(api_servers)]
    started = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[tuple[float, str]] = []

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append((time.perf_counter() - started, line.rstrip()))

    threading.Thread(target=read, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    healthy = None
    try:
        while time.perf_counter() - started < timeout_s and proc.poll() is None:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    healthy = time.perf_counter() - started
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        if healthy is None:
            raise RuntimeError("not healthy:\n" + "\n".join(text for _, text in lines[-30:]))
        health = httpx.get(f"{base}/health", timeout=5).json()
        time.sleep(1.0)  # every API server process has finished starting (they answer as they come up)
        core_pid = health.get("core_pid")
        kids = [p for p in _children(proc.pid) if "resource_tracker" not in _cmdline(p)]
        # several API servers are forked by multiprocessing's fork server, itself the launcher's child
        kids = [q for p in kids for q in (_children(p) if "forkserver" in _cmdline(p) else [p])]
        api_pids = [p for p in kids if p != core_pid] or [proc.pid]
        memory = {"core": _rss_mb(core_pid) if core_pid else float("nan"), "launcher": _rss_mb(proc.pid),
                  "api_servers": [_rss_mb(p) for p in api_pids]}
        times = []
        with httpx.Client(timeout=120) as client:
            for _ in range(6):
                t = time.perf_counter()
                reply = client.post(f"{base}/v1/completions", json=BODY)
                reply.raise_for_status()
                times.append(time.perf_counter() - t)
        return {"healthy_s": healthy, "lines": lines, "memory": memory, "first_s": times[0],
                "warm_s": statistics.median(times[1:]), "api_server_pids": api_pids, "cmd": cmd}
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default=None, help="a model_shapes.py shape (random weights); default: bundled")
    parser.add_argument("--api-server-count", type=int, default=None)
    parser.add_argument("--runs", type=int, default=2, help="start-ups in a row (the first on a cold page cache)")
    parser.add_argument("--timeout-s", type=float, default=300)
    args = parser.parse_args()
    model_args: list[str] = []
    name = "bundled"
    if args.shape:
        import model_shapes as ms

        model_args = ["--model", str(ms.write_model_dir(args.shape, Path("/tmp/infer-shapes"))), "--load-format",
                      "dummy", *SHAPE_FLAGS]
        name = args.shape
    results = [run(model_args, args.api_server_count, args.timeout_s) for _ in range(args.runs)]
    device = "cpu"
    try:
        import torch

        if torch.cuda.is_available():
            device = torch.cuda.get_device_name().lower().replace("nvidia", "").split()[0]
    except ImportError:
        pass
    out = Path(os.environ.get("OUT_DIR", "benchmarks/reports"))
    report = [f"# `infer serve` start-up — {name}, {device}", "",
              f"`{' '.join(Path(c).name if i == 0 else c for i, c in enumerate(results[0]['cmd']))}`; "
              f"reproduce: `python benchmarks/startup.py{' --shape ' + args.shape if args.shape else ''}`.", "",
              "| run | healthy after | first completion / warm median (16 tokens) | core RSS | API server RSS each |",
              "|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(results):
        m = r["memory"]
        report.append(f"| {i + 1} | {r['healthy_s']:.2f} s | {r['first_s'] * 1000:.0f} / {r['warm_s'] * 1000:.0f} ms | "
                      f"{m['core']:.0f} MB | {', '.join(f'{x:.0f}' for x in m['api_servers'])} MB |")
    report += ["", f"Start-up lines of run {len(results)} (seconds since the process started):", "", "```"]
    report += [f"{t:6.2f}  {text}" for t, text in results[-1]["lines"] if text.strip()][:60]
    report += ["```", ""]
    path = out / f"startup_{device}_{name}.md"
    path.write_text("\n".join(report))
    print("\n".join(report))


if __name__ == "__main__":
    main()
