"""Padded prefill inputs: a step padded to its token bucket lands at the addresses a graph was captured over, its
padding does no work, and engines whose prefill and mixed steps run padded (the graph path, replayed eagerly on
the CPU) produce the same greedy tokens and prompt logprobs as the plain path, every family."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.engine.config import EngineConfig
from infer.runners import prefill_graphs
from infer.runners.prefill_buffers import PrefillBuffers, PrefillShape
from infer.runners.prefill_graphs import PrefillGraphs, prefill_bucket_sizes, prefill_shapes
from infer.runners.step import StepInput, StepKind


class EagerReplay:
    """CudaGraphs' contract without CUDA: `before(size)` sets a bucket's inputs up once, and each replay re-runs
    `forward(size)` over them, so a step reaches the forward only through the addresses the bucket was set up at."""

    def __init__(self, forward: Callable[[PrefillShape], object], sizes: tuple[PrefillShape, ...],
                 device: torch.device, pool: object = None, before: Callable[[PrefillShape], None] | None = None) -> None:
        self.sizes, self.forward, self.replays = sizes, forward, 0
        self.stats = None
        for size in sorted(sizes, reverse=True):
            if before is not None:
                before(size)

    def replay(self, size: PrefillShape) -> object:
        self.replays += 1
        return self.forward(size)


def _step() -> StepInput:
    """Two sequences: a 5-token chunk after 3 cached tokens, and a decode row whose input is the previous step's
    row 1."""
    return StepInput(
        step_kind=StepKind.PREFILL, token_ids=[4, 5, 6, 7, 8, 0], positions=[3, 4, 5, 6, 7, 9], query_lens=[5, 1],
        context_lens=[8, 10], slot_mapping=[3, 4, 5, 6, 7, 25], block_tables=[[0, 1], [5, 6, 7]],
        sampling_slots=[2, 0], prev_rows=[-1, 1],
    )


def test_a_padded_step_fills_the_bucket_and_keeps_its_addresses() -> None:
    buffers = PrefillBuffers(torch.device("cpu"), [], max_blocks=4, max_context_len=16, largest=PrefillShape(16, 4))
    shape = PrefillShape(8, 4)
    captured = buffers.padding(shape)
    assert captured.padded.slot_mapping.tolist() == [-1] * 8 and captured.padded.cu_seqlens_q.tolist() == [0] * 5
    inputs = buffers.fill(_step(), shape, [2, 0])
    for name in ("token_ids", "prev_rows"):
        assert getattr(inputs, name).data_ptr() == getattr(captured, name).data_ptr()
    for name in ("positions", "cu_seqlens_q", "context_lens", "block_tables", "slot_mapping"):
        assert getattr(inputs.padded, name).data_ptr() == getattr(captured.padded, name).data_ptr()
    assert inputs.token_ids.tolist() == [4, 5, 6, 7, 8, 0, 0, 0]
    assert inputs.prev_rows.tolist() == [-1, -1, -1, -1, -1, 1, -1, -1]
    assert inputs.padded.slot_mapping.tolist() == [3, 4, 5, 6, 7, 25, -1, -1]
    assert inputs.padded.cu_seqlens_q.tolist() == [0, 5, 6, 6, 6]
    assert inputs.padded.context_lens.tolist() == [8, 10, 0, 0]
    assert inputs.padded.block_tables.tolist() == [[0, 1, 0, 0], [5, 6, 7, 0], [0] * 4, [0] * 4]
    assert inputs.batch.cu_seqlens_q.tolist() == [0, 5, 6] and inputs.batch.cu_seqlens_q_host == [0, 5, 6]
    assert inputs.batch.max_seqlen_q == 5 and inputs.batch.max_context_len == 10
    assert inputs.sampling_slots.tolist() == [2, 0] and inputs.advancing.tolist() == [2, 0]


def test_a_step_larger_than_its_bucket_is_refused() -> None:
    buffers = PrefillBuffers(torch.device("cpu"), [], max_blocks=4, max_context_len=16, largest=PrefillShape(16, 4))
    with pytest.raises(ValueError, match="does not fit the bucket"):
        buffers.fill(_step(), PrefillShape(4, 4), [])


def test_eager_steps_are_uploaded_as_they_are() -> None:
    buffers = PrefillBuffers(torch.device("cpu"), [], max_blocks=4, max_context_len=16, largest=None)
    inputs = buffers.fill(_step(), None, [2])
    assert inputs.padded is inputs.batch and inputs.token_ids.shape == (6,)
    assert np.array_equal(inputs.batch.block_tables.numpy(), [[0, 1, 0], [5, 6, 7]])


def test_prefill_buckets() -> None:
    assert prefill_bucket_sizes(8192) == (16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
    assert prefill_bucket_sizes(100_000)[-1] == 8192
    assert prefill_bucket_sizes(300) == (16, 32, 64, 128, 256, 300)


def test_a_step_replays_the_smallest_shape_holding_its_tokens_and_sequences(monkeypatch: pytest.MonkeyPatch) -> None:
    shapes = prefill_shapes((16, 32, 64, 512), max_batch_size=256)
    assert shapes == ((16, 16), (32, 16), (32, 32), (64, 16), (64, 64), (512, 16), (512, 256))
    assert prefill_shapes((16, 64), max_batch_size=8) == ((16, 8), (64, 8))
    monkeypatch.setattr(prefill_graphs, "CudaGraphs", EagerReplay)
    buffers = PrefillBuffers(torch.device("cpu"), [], max_blocks=4, max_context_len=16, largest=PrefillShape(512, 256))
    graphs = PrefillGraphs(lambda inputs: (inputs.token_ids, inputs.token_ids), buffers, shapes, torch.device("cpu"))
    assert graphs.shape(20, 3) == (32, 16)
    assert graphs.shape(20, 17) == (32, 32)
    assert graphs.shape(40, 40) == (64, 64)
    assert graphs.shape(100, 100) == (512, 256)
    assert graphs.shape(513, 1) is None


def _run(path: str, padded: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list, int]:
    with monkeypatch.context() as patch:
        if padded:
            patch.setattr(EngineConfig, "prefill_graphs", property(lambda self: True))
            patch.setattr(prefill_graphs, "CudaGraphs", EagerReplay)
        llm = LLM(path, max_seq_len=96, max_batch_size=4, block_size=4, prefill_chunk_size=8,
                  max_num_batched_tokens=96)
    prompts = [list(range(3, 3 + n)) for n in (21, 2, 13, 7)] + [list(range(3, 24)) + [40, 41]]  # the last shares a prefix
    tokens = [o.token_ids for o in llm.generate_ids(prompts, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))]
    logprobs = [[lp.logprob for lp in step.prompt_logprobs if lp is not None]
                for step in llm.stream(prompts[2], SamplingParams(temperature=0, max_tokens=1, prompt_logprobs=0))
                if step.prompt_logprobs is not None]
    graphs = llm.engine.runner.prefill_graphs
    replays = graphs._graphs.replays if graphs is not None else 0
    return tokens, logprobs, replays


@pytest.mark.parametrize("family", FAMILIES)
def test_padded_prefill_matches_the_plain_path(family: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = str(save_tiny_with_tokenizer(family, tmp_path, seed=5))
    plain_tokens, plain_logprobs, _ = _run(path, False, monkeypatch)
    tokens, logprobs, replays = _run(path, True, monkeypatch)
    assert replays > 0
    assert tokens == plain_tokens
    np.testing.assert_allclose(np.array(logprobs[0]), np.array(plain_logprobs[0]), rtol=1e-4, atol=1e-5)
