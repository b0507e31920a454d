"""Decode on CUDA: graphs vs eager vs the CPU reference, sync-free steps under INFER_STRICT_SYNC=1."""

from __future__ import annotations

import pytest
import torch

from checkpoints import FAMILIES, save_tiny
from engine_fakes import FakeTokenizer, run_all
from infer import SamplingParams
from infer.engine.config import EngineConfig
from infer.build.in_process import Engine
from infer.kv.kv_manager import KVCacheManager
from infer.loader.model_loader import load_model
from infer.runners import graphs as graphs_module
from infer.runners import torch_runner
from infer.runners.step import StepInput, StepKind
from infer.runners.strict_sync import SyncInStepError
from infer.sampling.slots import SlotState
from infer.runners.torch_runner import TorchRunner

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

BLOCKS, BLOCK = 96, 4


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory):
    return save_tiny(request.param, tmp_path_factory.mktemp(request.param), seed=5)


def _engine(path, device: str, dtype=torch.float32, graphs: tuple[int, ...] = (), max_batch: int = 4) -> Engine:
    model = load_model(path, dtype, device, 256).model
    runner = TorchRunner(model, BLOCKS, BLOCK, max_batch, 256, graphs)
    config = EngineConfig(max_seq_len=256, max_batch_size=max_batch, device=device, use_cuda_graphs=bool(graphs))
    return Engine(config, runner, KVCacheManager(BLOCKS, BLOCK), FakeTokenizer())  # type: ignore[arg-type]


def _generate(engine: Engine, n: int, params: SamplingParams) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    requests = [engine.add_request(torch.randint(1, 300, (5 + 3 * i,), generator=g).tolist(), params) for i in range(n)]
    run_all(engine)
    assert engine.kv.audit_blocks() == {}
    return [r.output_token_ids for r in requests]


GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
SAMPLED = SamplingParams(temperature=0.9, top_p=0.9, seed=3, max_tokens=16, ignore_eos=True)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "seeded"])
def test_graphs_equal_eager_and_cpu(checkpoint, params):
    """Batch 3 pads to the bucket of 4; fp32 so CPU and CUDA pick the same tokens."""
    want = _generate(_engine(checkpoint, "cpu"), 3, params)
    assert _generate(_engine(checkpoint, "cuda"), 3, params) == want
    assert _generate(_engine(checkpoint, "cuda", graphs=(1, 2, 4)), 3, params) == want


@pytest.mark.parametrize("n", [1, 2])
def test_bf16_graphs_equal_eager(checkpoint, n):
    eager = _generate(_engine(checkpoint, "cuda", torch.bfloat16), n, GREEDY)
    assert _generate(_engine(checkpoint, "cuda", torch.bfloat16, graphs=(1, 2)), n, GREEDY) == eager


def test_batches_above_the_largest_bucket_run_eagerly(checkpoint):
    engine = _engine(checkpoint, "cuda", graphs=(1, 2))
    assert engine.runner.graphs.bucket(3) is None  # type: ignore[attr-defined]
    assert _generate(engine, 3, GREEDY) == _generate(_engine(checkpoint, "cpu"), 3, GREEDY)


def test_graph_stats_report_buckets_time_and_memory(checkpoint):
    stats = _engine(checkpoint, "cuda", graphs=(1, 2, 4)).runner.graph_stats  # type: ignore[attr-defined]
    assert stats.batch_sizes == (1, 2, 4) and stats.capture_seconds > 0 and stats.memory_bytes >= 0


def test_short_context_graphs_replay_the_smallest_bound_that_fits(checkpoint, monkeypatch):
    """Short bounds of 8 and 16 keys for buckets of up to 2 rows (a 256-key capacity; 200 does not halve it: no set):
    those buckets get a graph per bound, and a step replays the smallest bound every row's context fits (a 5-token
    prompt decodes at 6-8 keys, then 9-16, then in the capacity's graphs); tokens equal the CPU's, strict sync."""
    monkeypatch.setattr(graphs_module, "SHORT_CONTEXTS", (8, 16, 200))
    monkeypatch.setattr(torch_runner, "SHORT_CONTEXT_ROWS", 2)
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    engine = _engine(checkpoint, "cuda", graphs=(1, 2, 4))
    runner = engine.runner
    stats = runner.short_graph_stats  # type: ignore[attr-defined]
    assert {bound: s.batch_sizes for bound, s in stats.items()} == {8: (1, 2), 16: (1, 2)}
    replays: dict[str, list[int]] = {"8": [], "16": [], "full": []}
    short = runner.short_graphs  # type: ignore[attr-defined]
    sets = {"8": short[8], "16": short[16], "full": runner.graphs}  # type: ignore[attr-defined]
    for name, graphs in sets.items():
        monkeypatch.setattr(graphs, "replay", lambda size, r=graphs.replay, n=name: replays[n].append(size) or r(size))
    cpu = _engine(checkpoint, "cpu")
    for n in (1, 2):
        assert _generate(engine, n, GREEDY) == _generate(cpu, n, GREEDY)
    assert set(replays["8"]) == {1} and set(replays["16"]) == {1, 2} and replays["full"], replays


def test_strict_sync_passes_on_the_real_path(checkpoint, monkeypatch):
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    params = SamplingParams(temperature=0.7, top_k=20, seed=1, max_tokens=8, ignore_eos=True, logprobs=2,
                            prompt_logprobs=1)
    for graphs in ((), (1, 2, 4)):
        assert all(len(t) == 8 for t in _generate(_engine(checkpoint, "cuda", graphs=graphs), 3, params))


def _decode_step(engine: Engine) -> StepInput:
    """A decode step of a 4-token sequence (its cache content does not matter here)."""
    kv = engine.kv
    kv.allocate("probe", 4)
    return StepInput(StepKind.DECODE, token_ids=[5], positions=[3], query_lens=[1], context_lens=[4],
                     block_tables=[kv.block_table("probe")], slot_mapping=kv.slots("probe", 3, 1),
                     sampling_slots=[0], joined=[SlotState(0, GREEDY, 0, 0)])


@pytest.mark.parametrize("plant", ["item", "synchronize"])
def test_strict_sync_raises_on_a_planted_sync(checkpoint, monkeypatch, plant):
    monkeypatch.delenv("INFER_STRICT_SYNC", raising=False)  # scripts/gpu_check.sh runs everything strict
    engine = _engine(checkpoint, "cuda")
    step = _decode_step(engine)
    model = engine.runner.model  # type: ignore[attr-defined]
    head_logits = model.head_logits

    def planted(x):
        if plant == "item":
            x.sum().item()
        else:
            torch.cuda.synchronize()
        return head_logits(x)

    monkeypatch.setattr(model, "head_logits", planted)
    engine.runner.execute(step)  # type: ignore[attr-defined]  # allowed without strict mode
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    with pytest.raises(RuntimeError, match="synchroniz") as info:
        engine.runner.execute(step)  # type: ignore[attr-defined]
    if plant == "synchronize":
        assert info.type is SyncInStepError
    assert torch.cuda.get_sync_debug_mode() == 0  # the scope is restored


def test_pdl_launch_gives_the_tokens_of_plain_launches(checkpoint):
    """Triton kernels launched as programmatic dependents (the default on SM90+) change no token, in graphs."""
    from layerzero.kernels.triton import launch

    with_pdl = _generate(_engine(checkpoint, "cuda", torch.bfloat16, graphs=(1, 2, 4)), 3, GREEDY)
    launch._PDL_ENABLED = False
    launch._pdl.cache_clear()
    try:
        plain = _generate(_engine(checkpoint, "cuda", torch.bfloat16, graphs=(1, 2, 4)), 3, GREEDY)
    finally:
        launch._PDL_ENABLED = True
        launch._pdl.cache_clear()
    assert plain == with_pdl
