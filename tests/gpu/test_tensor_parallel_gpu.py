"""Tensor parallelism on NCCL (needs 2+ GPUs; run under INFER_STRICT_SYNC=1 by scripts/gpu_distributed.sh): bf16
teacher-forced logits of TP=2 (and TP=4) within tolerance of TP=1, CUDA graphs that replay the collectives, and
float32 greedy tokens equal to TP=1's with graphs on and off, and with the projections folded into the
reduce-and-norm."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(GPUS < 2, reason="tensor parallelism on NCCL needs 2 or more CUDA devices")

PROMPTS = [[1, 5, 9, 33, 17, 3, 200, 41] * 4, [7, 7, 90], list(range(40, 100))]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """The tiny Llama (4 heads, 2 KV heads: split at TP=2, replicated at TP=4), float32 on disk."""
    path = tmp_path_factory.mktemp("tp_llama")
    return save_tiny_with_tokenizer("llama", path)


def _prompt_logprobs(llm: LLM) -> list[list[float]]:
    params = SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0)
    out = []
    for ids in PROMPTS:
        for step in llm.stream(ids, params):
            if step.prompt_logprobs is not None:
                out.append([lp.logprob for lp in step.prompt_logprobs if lp is not None])
    return out


def _greedy(llm: LLM) -> list[list[int]]:
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    return [o.token_ids for o in llm.generate_ids(PROMPTS, params)]


def _measure(path: str, what: str, options: dict) -> object:
    """Build one engine, measure it, close it (a process of its own: one NCCL tensor-parallel engine per process).
    "lora": the prompts' greedy tokens with `params` (one SamplingParams per prompt, popped from the options)."""
    params = options.pop("params", None)
    with LLM(path, max_batch_size=8, **options) as llm:
        if what == "lora":
            result = [o.token_ids for o in llm.generate_ids(PROMPTS, params)]
        elif what == "kernels":  # the greedy tokens and the kernels rank 0's bound sites run
            from layerzero.dispatch.bound import sites_of

            result = _greedy(llm), sorted({s.kernel_id for s in sites_of(llm.runner.model).values() if s.kernel_id})
        else:
            result = _prompt_logprobs(llm) if what == "logprobs" else _greedy(llm)
        graphs = llm.runner.graph_stats.batch_sizes if llm.runner.graph_stats is not None else ()
    return result, graphs


def _child(queue: multiprocessing.Queue, path: str, what: str, options: dict) -> None:
    try:
        queue.put(("ok", _measure(path, what, options)))
    except BaseException as exc:  # noqa: BLE001 - reported to the test
        queue.put(("error", f"{type(exc).__name__}: {exc}"))
    queue.close()
    queue.join_thread()  # the put is written by a feeder thread: flushed before the exit below
    os._exit(0)  # no NCCL teardown at exit (it can wait on the worker, which has gone)


def in_child(path: Path, what: str, **options: object) -> tuple[object, tuple[int, ...]]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    process = ctx.Process(target=_child, args=(queue, str(path), what, options))
    process.start()
    try:
        status, value = queue.get(timeout=300)
    finally:
        process.join(30)
        if process.is_alive():
            process.kill()
    assert status == "ok", value
    return value


@pytest.mark.parametrize("tp", [t for t in (2, 4) if t <= GPUS])
def test_bf16_teacher_forced_logits_within_tolerance(model, tp):
    want, _ = in_child(model, "logprobs", dtype="bfloat16")
    got, graphs = in_child(model, "logprobs", dtype="bfloat16", tensor_parallel_size=tp)
    assert graphs  # decode graphs captured with their all-reduces on every rank
    for w, g in zip(want, got):
        assert g == pytest.approx(w, abs=0.05)  # bf16 sums in another order


@pytest.mark.parametrize("graphs", [None, False], ids=["graphs", "eager"])
def test_fp32_greedy_tokens_equal_tp1(model, graphs):
    want, _ = in_child(model, "greedy", dtype="float32", use_cuda_graphs=graphs)
    got, captured = in_child(model, "greedy", dtype="float32", tensor_parallel_size=2, use_cuda_graphs=graphs)
    assert got == want
    assert bool(captured) == (graphs is None)


def test_fp32_folded_projections_equal_tp1(tmp_path):
    """A Llama whose TP=2 shards are of the folds' sizes (hidden and intermediate 4096, 32 heads of 128, one layer,
    float32: O and down shards of 32 MiB, K 2048): rank 0 binds the reduce-and-norm that sums the O and down
    projections' split-K slices (and the QKV fold) on its decode steps (the last binding, eagerly) and its greedy
    tokens, eager and with graphs, equal TP=1's."""
    path = save_tiny_with_tokenizer("llama", tmp_path, seed=3, hidden_size=4096, intermediate_size=4096,
                                    num_hidden_layers=1, num_attention_heads=32, num_key_value_heads=8, head_dim=128)
    want, _ = in_child(path, "greedy", dtype="float32")
    (eager, kernels), _ = in_child(path, "kernels", dtype="float32", tensor_parallel_size=2, use_cuda_graphs=False)
    assert {"triton.all_reduce_add_rms_norm_splitk", "triton.rope_store_kv_splitk"} <= set(kernels), kernels
    got, captured = in_child(path, "greedy", dtype="float32", tensor_parallel_size=2)
    assert captured
    assert eager == want and got == want
