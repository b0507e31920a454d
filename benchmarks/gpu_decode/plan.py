"""The run's plan (every count and size) and the small helpers that every measurement shares."""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

import model_shapes as ms

BLOCK_SIZE = 16
SLACK_TOKENS = 64  # batched requests may decode this much beyond the timed steps (early prefills, pipelining)
MODE_NAMES = {True: "graphs", False: "eager", None: "default"}


@dataclass(frozen=True)
class Plan:
    """Every count and size the run uses (recorded in the report)."""

    models: tuple[str, ...] = ms.GPU_SHAPES
    device: str = "cuda"
    dtype: str = "bfloat16"
    graph_modes: tuple[bool | None, ...] = (True, False)
    prompt_len: int = 128
    new_tokens: int = 256
    repeats: int = 3
    batches: tuple[int, ...] = (16, 64, 256)
    sweep_models: tuple[str, ...] = ("llama-3.2-1b",)  # also every power-of-two batch (each graph bucket)
    batch_warm_steps: int = 8
    batch_timed_steps: int = 32
    prefill_lens: tuple[int, ...] = (1024, 8192)
    prefill_repeats: int = 3
    hf_new_tokens: int = 128
    hf_repeats: int = 3
    hf_compiled_models: tuple[str, ...] = ("llama-3.2-1b",)
    ready_model: str = "llama-3.2-1b"
    ready_again: bool = True  # a second startup at the end, with the Triton cache warm
    max_seq_len: int = 8192 + 256
    max_batch_size: int = 256
    copy_mib: int = 1024
    gemm_n: int = 8192
    timing_reps: int = 10
    budget_s: float = 450.0
    model_root: str = "/tmp/infer_bench_models"


SMOKE = dict(
    models=("tiny-llama",), device="cpu", dtype="float32", graph_modes=(None,), prompt_len=16, new_tokens=16,
    repeats=2, batches=(4, 8), sweep_models=("tiny-llama",), batch_warm_steps=2, batch_timed_steps=4,
    prefill_lens=(64, 256), prefill_repeats=2, hf_new_tokens=8, hf_repeats=2, hf_compiled_models=(),
    ready_model="tiny-llama", ready_again=False, max_seq_len=512, max_batch_size=8, copy_mib=64, gemm_n=256,
    timing_reps=3, budget_s=50.0,
)


def torch_dtype(plan: Plan) -> torch.dtype:
    """The torch dtype named by plan.dtype."""
    return getattr(torch, plan.dtype)


def batch_context(plan: Plan) -> int:
    """Mean context length of a sequence over the timed steps of a batched decode."""
    return plan.prompt_len + plan.batch_warm_steps + plan.batch_timed_steps // 2


def sync(device: str) -> None:
    """Wait for queued GPU work (a no-op on the CPU)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def prompt_ids(vocab: int, length: int, seed: int = 0) -> list[int]:
    """A reproducible random prompt of token ids in [2, vocab)."""
    rng = random.Random(seed)
    return [rng.randrange(2, vocab) for _ in range(length)]
