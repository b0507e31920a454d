"""A decode step costs what the real contexts cost: the work does not grow with max_seq_len.

Work is counted, not timed: the elements every freshly computed tensor of the step holds (views and
in-place writes into the cache excluded). Before attention was bounded by the step's own longest
context, a 4096-token max_seq_len made the CPU decode gather and attend over every position.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

import layerzero as lz
from checkpoints import save_tiny
from decode_helpers import _step
from infer.kv.kv_manager import KVCacheManager
from infer.loader.model_loader import load_model
from infer.runners.step import StepKind
from infer.runners.torch_runner import TorchRunner

BLOCK = 4


@pytest.fixture(autouse=True)
def attention_the_counter_sees():
    """The counter sees aten ops only; the native C attention would be invisible to it, so attention runs the
    reference here (the bound it is given, max_context_len, is the same for every kernel)."""
    lz.lock("paged_attention", "reference.paged_attention")
    yield
    lz.unlock("paged_attention")


class ComputedElements(TorchDispatchMode):
    """Sums the elements of every op output that is new memory (not a view or an in-place result)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        self.elements += sum(t.numel() for t in tree_leaves(out)
                             if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs)
        return out


def _decode_work(model, max_seq_len: int, prompt_lens: tuple[int, ...]) -> int:
    blocks = len(prompt_lens) * max_seq_len // BLOCK
    runner = TorchRunner(model, num_blocks=blocks, block_size=BLOCK, max_batch_size=8, max_seq_len=max_seq_len)
    kv = KVCacheManager(blocks, BLOCK)
    seqs = {f"r{i}": list(range(1, n + 1)) for i, n in enumerate(prompt_lens)}
    for rid, tokens in seqs.items():
        kv.allocate(rid, len(tokens) + 1)
    result = runner.execute(_step(StepKind.PREFILL, kv, seqs, {rid: 0 for rid in seqs}))
    for rid, token in zip(seqs, result.token_ids):
        seqs[rid].append(token)
    with ComputedElements() as work:
        runner.execute(_step(StepKind.DECODE, kv, seqs, {rid: len(t) - 1 for rid, t in seqs.items()}))
    return work.elements


@pytest.mark.parametrize("family", ["llama", "gemma3"])
@pytest.mark.parametrize("prompt_lens", [(9,), (5, 11, 2)])
def test_decode_work_does_not_grow_with_max_seq_len(family, prompt_lens, tmp_path):
    model = load_model(save_tiny(family, tmp_path, seed=5), torch.float32).model
    short = _decode_work(model, 64, prompt_lens)
    assert _decode_work(model, 4096, prompt_lens) == short


def test_decode_work_grows_with_the_real_context(tmp_path):
    """The counter sees attention at all: a longer real context is more work."""
    model = load_model(save_tiny("llama", tmp_path, seed=5), torch.float32).model
    assert _decode_work(model, 512, (200,)) > _decode_work(model, 512, (9,))
