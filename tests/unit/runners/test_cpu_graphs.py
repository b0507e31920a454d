"""CPU decode graphs: a bucket's forward runs eagerly, is recorded, then replayed without Python; replays compute
what the forward would on the buffers' new contents; selection changes re-record; host values keep a bucket eager;
engines decode the same tokens with and without them, every family."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import layerzero as lz
from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.runners.cpu_graphs import MAX_CPU_GRAPH_BATCH, CpuDecodeGraphs
from layerzero.kernels.reference.norm import rms_norm as rms_norm_ref

pytestmark = pytest.mark.skipif(lz.which("rms_norm", torch.ones(1, 8), torch.ones(8), eps=1e-6, weight_offset=0.0)
                                ["kernel_id"] != "native.rms_norm_cpu", reason="needs the native CPU kernels")


class Toy:
    """A decode-shaped forward over fixed buffers: a native kernel, tensor ops, a view, a reshape that copies (under
    inference mode aten.reshape reaches the recorder whole, declared a view), an in-place write."""

    def __init__(self, host_value: bool = False) -> None:
        self.x = torch.randn(4, 32)
        self.ids = torch.tensor([3, 0, 2, 1])
        self.table = torch.randn(8, 32)
        self.state = torch.zeros(4, 32)
        self.site = lz.bind("rms_norm")
        self.calls = 0
        self.host_value = host_value

    def __call__(self, rows: int) -> torch.Tensor:
        self.calls += 1
        h = self.site(self.x[:rows] + self.table[self.ids[:rows]], torch.ones(32), eps=1e-6, weight_offset=0.0)
        self.state[:rows] += h  # in place: a replay adds again
        if self.host_value and h.sum().item() > 1e9:
            return h
        return (h * 2).view(rows, 2, 16).sum(-1) + self.x[:rows, :16].reshape(-1).view(rows, 16).sum(-1)[:, None]

    def want(self, rows: int) -> torch.Tensor:
        h = rms_norm_ref(self.x[:rows] + self.table[self.ids[:rows]], torch.ones(32), 1e-6, 0.0)
        return (h * 2).view(rows, 2, 16).sum(-1) + self.x[:rows, :16].sum(-1)[:, None]


def test_a_bucket_runs_eagerly_then_records_then_replays_the_new_inputs() -> None:
    toy = Toy()
    graphs = CpuDecodeGraphs(toy, (1, 2, 4))
    with torch.inference_mode():
        for step in range(5):
            toy.x.copy_(torch.randn(4, 32))
            toy.ids.copy_(torch.randint(0, 8, (4,)))
            got = graphs.replay(graphs.bucket(3))
            assert torch.allclose(got[:3], toy.want(3), atol=1e-6)
        assert toy.calls == 2  # warm-up and recording; three replays ran no Python
    assert graphs.stats.batch_sizes == (4,) and graphs.stats.memory_bytes > 0


def test_in_place_ops_run_again_on_each_replay() -> None:
    toy = Toy()
    graphs = CpuDecodeGraphs(toy, (4,))
    with torch.inference_mode():
        total = torch.zeros(4, 32)
        for _ in range(4):
            toy.x.copy_(torch.randn(4, 32))
            graphs.replay(4)
            total += rms_norm_ref(toy.x + toy.table[toy.ids], torch.ones(32), 1e-6, 0.0)
    assert torch.allclose(toy.state, total, atol=1e-5)


def test_a_policy_change_records_again() -> None:
    toy = Toy()
    graphs = CpuDecodeGraphs(toy, (4,))
    with torch.inference_mode():
        for _ in range(3):
            graphs.replay(4)
        assert toy.calls == 2
        lz.lock("rms_norm", "reference.rms_norm")
        try:
            for _ in range(3):
                toy.x.copy_(torch.randn(4, 32))
                assert torch.allclose(graphs.replay(4), toy.want(4), atol=1e-6)
            assert toy.calls == 4 and toy.site.kernel_id == "reference.rms_norm"
        finally:
            lz.unlock("rms_norm")


def test_a_forward_that_reads_a_host_value_stays_eager() -> None:
    toy = Toy(host_value=True)
    graphs = CpuDecodeGraphs(toy, (4,))
    with torch.inference_mode():
        for _ in range(4):
            toy.x.copy_(torch.randn(4, 32))
            assert torch.allclose(graphs.replay(4), toy.want(4), atol=1e-6)
    assert toy.calls == 4 and "host value" in graphs.eager[4]
    assert graphs.stats.batch_sizes == ()


def test_buckets_stop_at_the_cpu_cap() -> None:
    graphs = CpuDecodeGraphs(Toy(), (1, 2, 4, 8, 16, 32, 64))
    assert max(graphs.sizes) == MAX_CPU_GRAPH_BATCH and graphs.bucket(MAX_CPU_GRAPH_BATCH + 1) is None


@pytest.mark.parametrize("family", FAMILIES)
def test_engines_decode_the_same_tokens_with_and_without_graphs(family: str, tmp_path) -> None:
    path = str(save_tiny_with_tokenizer(family, tmp_path, seed=3))
    prompts = [[5, 17, 42, 9], [7, 3], [11, 12, 13, 14, 15, 16], [2]]
    params = SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True)
    outs = []
    for graphs in (False, None):
        llm = LLM(path, max_seq_len=128, max_batch_size=4, block_size=4, use_cuda_graphs=graphs)
        single = [[o.token_id for o in llm.stream(p, params)] for p in prompts[:2]]
        batch = [o.token_ids for o in llm.generate(prompts, params)]
        outs.append((single, batch))
        runner_graphs = llm.engine.runner.graphs
        if graphs is None:
            assert isinstance(runner_graphs, CpuDecodeGraphs) and not runner_graphs.eager
            assert 1 in runner_graphs.stats.batch_sizes and 4 in runner_graphs.stats.batch_sizes
        else:
            assert runner_graphs is None
    assert outs[0] == outs[1]


def test_graphs_do_not_keep_their_runner_alive(tmp_path) -> None:
    llm = LLM(str(save_tiny_with_tokenizer("llama", tmp_path)), max_seq_len=64, max_batch_size=2, block_size=4,
              kv_cache_memory_gb=0.01)
    llm.generate_ids([[5, 6, 7]], SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True))
    assert llm.engine.runner.graphs.stats.batch_sizes == (1,)
    runner = weakref.ref(llm.engine.runner)
    gc.disable()  # freed by reference counting alone: its KV cache goes with the LLM, not at the next collection
    try:
        del llm
        assert runner() is None
    finally:
        gc.enable()


def test_while_a_forward_hook_is_registered_every_decode_step_runs_eagerly(tmp_path) -> None:
    llm = LLM(str(save_tiny_with_tokenizer("llama", tmp_path)), max_seq_len=64, max_batch_size=2, block_size=4,
              kv_cache_memory_gb=0.01)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    want = llm.generate_ids([[5, 6, 7]], params)[0].token_ids  # recorded: later steps replay
    seen: list[int] = []
    handle = llm.engine.runner.model.blocks[1].resid_post.register_forward_hook(
        lambda _m, _i, out: seen.append(out.shape[0]))
    try:
        assert llm.generate_ids([[5, 6, 7]], params)[0].token_ids == want
    finally:
        handle.remove()
    assert seen == [3] + [1] * 11  # the prefill, then every decode step
    assert llm.generate_ids([[5, 6, 7]], params)[0].token_ids == want  # and replays again once it is gone


def test_cpu_runners_capture_no_short_context_graphs(tmp_path) -> None:
    """Short-context decode graphs are CUDA's (runners/graphs.py): the native CPU attention loops over each row's own
    keys, whatever the bound its recording holds."""
    llm = LLM(str(save_tiny_with_tokenizer("llama", tmp_path)), max_seq_len=1024, max_batch_size=2, block_size=4,
              kv_cache_memory_gb=0.01)
    assert isinstance(llm.engine.runner.graphs, CpuDecodeGraphs) and llm.engine.runner.short_graphs == {}
    assert llm.engine.runner.short_graph_stats == {}
