"""The yardsticks: device info, copy bandwidth and GEMM rate, and transformers' decode on the same config."""

from __future__ import annotations

import os
import platform
import re
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import model_shapes as ms
from gpu_decode.plan import Plan, prompt_ids, sync, torch_dtype


def time_fn(fn: Callable[[], object], device: str, reps: int) -> float:
    """Median seconds of fn() (CUDA events on the GPU, perf_counter on the CPU), after one warm-up call."""
    fn()
    times = []
    for _ in range(reps):
        if device.startswith("cuda"):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def device_info(plan: Plan) -> dict[str, Any]:
    """GPU name, SMs and memory (or the CPU), plus software versions."""
    import transformers
    import triton

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                            "triton": triton.__version__, "transformers": transformers.__version__,
                            "cuda": torch.version.cuda, "cpu": platform.processor() or platform.machine(),
                            "cpu_count": os.cpu_count()}
    if plan.device.startswith("cuda"):
        props = torch.cuda.get_device_properties(plan.device)
        info |= {"gpu": props.name, "sms": props.multi_processor_count, "gpu_memory_bytes": props.total_memory,
                 "capability": f"sm_{props.major}{props.minor}"}
    return info


def gpu_slug(info: dict[str, Any], smoke: bool) -> str:
    """"NVIDIA H100 80GB HBM3" -> "h100"; smoke runs -> "smoke"."""
    if smoke or "gpu" not in info:
        return "smoke"
    words = [w for w in re.sub(r"[^a-z0-9]+", " ", info["gpu"].lower()).split() if w not in ("nvidia", "tesla")]
    return words[0] if words else "gpu"


def copy_bandwidth(plan: Plan) -> dict[str, float]:
    """Read + write bytes per second of a large device-to-device copy."""
    dtype = torch_dtype(plan)
    src = torch.randn(plan.copy_mib * 2**20 // dtype.itemsize, dtype=dtype, device=plan.device)
    dst = torch.empty_like(src)
    seconds = time_fn(lambda: dst.copy_(src), plan.device, plan.timing_reps)
    return {"gb_s": 2 * src.numel() * dtype.itemsize / seconds / 1e9, "bytes_copied": src.numel() * dtype.itemsize,
            "median_s": seconds, "reps": plan.timing_reps}


def gemm_rate(plan: Plan) -> dict[str, float]:
    """TFLOP/s of an n x n x n matmul in the run's dtype."""
    n, dtype = plan.gemm_n, torch_dtype(plan)
    a, b = (torch.randn(n, n, dtype=dtype, device=plan.device) for _ in range(2))
    c = torch.empty_like(a)
    seconds = time_fn(lambda: torch.mm(a, b, out=c), plan.device, plan.timing_reps)
    return {"tflops": 2 * n**3 / seconds / 1e12, "n": n, "median_s": seconds, "reps": plan.timing_reps}


# transformers -----------------------------------------------------------------------------------


def hf_generate_seconds(model: Any, x: torch.Tensor, tokens: int, compiled: bool, device: str) -> float:
    """Wall seconds of one greedy static-cache generate of exactly `tokens` new tokens."""
    sync(device)
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, do_sample=False, max_new_tokens=tokens, min_new_tokens=tokens,
                             cache_implementation="static", disable_compile=not compiled, pad_token_id=0)
    sync(device)
    assert out.shape[1] == x.shape[1] + tokens, out.shape
    return time.perf_counter() - start


def gptfast_decode_rate(one: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
                        step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], prompt: list[int], tokens: int,
                        repeats: int, device: str) -> float:
    """gpt-fast's batch-1 greedy decode tok/s: `one(ids [1, T], positions)` prefills `prompt` and returns the next
    token [1, 1]; then `step` (its compiled one-token decode) runs `tokens` tokens after 8 of warm-up (compile,
    capture), median of `repeats`."""
    with torch.inference_mode():
        x = one(torch.tensor([prompt], device=device), torch.arange(len(prompt), device=device))

        def run(n: int) -> float:
            nonlocal x
            sync(device)
            start = time.perf_counter()
            for i in range(n):
                x = step(x.clone(), torch.tensor([len(prompt) + i], device=device))
            sync(device)
            return time.perf_counter() - start

        run(8)
        return statistics.median(tokens / run(tokens) for _ in range(repeats))


def hf_decode(name: str, plan: Plan, compiled: bool) -> dict[str, Any]:
    """transformers' decode tok/s on a random model of the same config: (N-1) / (t(N) - t(1))."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    with torch.device(plan.device):
        model = AutoModelForCausalLM.from_config(ms.hf_config(name), dtype=torch_dtype(plan)).eval()
    x = torch.tensor([prompt_ids(model.config.vocab_size, plan.prompt_len)], device=plan.device)
    n = plan.hf_new_tokens
    start = time.perf_counter()
    hf_generate_seconds(model, x, n if compiled else 8, compiled, plan.device)  # compiled: its static cache's shape
    warmup = time.perf_counter() - start
    rates = []
    for _ in range(plan.hf_repeats):
        first = hf_generate_seconds(model, x, 1, compiled, plan.device)
        rates.append((n - 1) / (hf_generate_seconds(model, x, n, compiled, plan.device) - first))
    return {"tok_s": rates, "median_tok_s": statistics.median(rates), "new_tokens": n, "prompt_len": plan.prompt_len,
            "compiled": compiled, "warmup_s": warmup, "model_class": type(model).__name__,
            "attn_implementation": model.config._attn_implementation, "cache_implementation": "static"}
