"""Probes on CUDA: the Triton read-out against float64 (bf16 and fp32 residuals), graphs == eager with the
scores read back sync-free (INFER_STRICT_SYNC=1 in scripts/gpu_probes.sh), reload without a re-capture."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from omniscience import load_probe_set
from omniscience.kernel import launch_kernel, launch_split_kernel, workspace
from probe_sets import Spec, float64_scores, write_probe_set

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]
SPECS = [Spec("a", 0, "sigmoid"), Spec("bank", 1, "tanh", count=20), Spec("lin", 2)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden, probes", [(1, 2048, 16), (64, 2048, 16), (3000, 576, 48)])
def test_kernel_matches_float64(dtype, rows, hidden, probes):
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
    h = torch.randn(rows, hidden, generator=g).to(dtype)
    weight, bias = torch.randn(hidden, probes, generator=g) * 0.05, torch.randn(probes, generator=g)
    codes = torch.randint(0, 3, (probes,), generator=g, dtype=torch.int32)
    out = torch.zeros(rows, probes + 16, device="cuda")
    launch_kernel(h.cuda(), weight.cuda(), bias.cuda(), codes.cuda(), out[:, 8 : 8 + probes])
    want = float64_scores(h, weight, bias, codes)  # the bf16 residual itself is the input: only the sum rounds
    torch.testing.assert_close(out[:, 8 : 8 + probes].cpu().double(), want, rtol=1e-4, atol=1e-4,
                               msg=lambda m: f"{m} (seed {g.initial_seed()})")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows, hidden, probes", [(1, 2048, 16), (7, 576, 16), (64, 4096, 48)])
def test_split_kernel_matches_float64_across_calls(dtype, rows, hidden, probes):
    g = torch.Generator().manual_seed(random.SystemRandom().randrange(2**31))
    partial, tickets = workspace(probes, torch.device("cuda"))
    for _ in range(3):
        h = torch.randn(rows, hidden, generator=g).to(dtype)
        weight, bias = torch.randn(hidden, probes, generator=g) * 0.05, torch.randn(probes, generator=g)
        codes = torch.randint(0, 3, (probes,), generator=g, dtype=torch.int32)
        out = torch.zeros(rows, probes, device="cuda")
        launch_split_kernel(h.cuda(), weight.cuda(), bias.cuda(), codes.cuda(), out, partial, tickets)
        want = float64_scores(h, weight, bias, codes)
        torch.testing.assert_close(out.cpu().double(), want, rtol=1e-4, atol=1e-4, msg=lambda m: f"{m} (seed {g.initial_seed()})")
        assert not partial.any() and not tickets.any()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llama")
    return str(save_tiny_with_tokenizer("llama", folder / "model", seed=2)), folder


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(1, 320) for _ in range(n)] for n in (5, 19, 2, 33, 8, 12)]


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_graphs_equal_eager_and_reload_keeps_the_graphs(tiny, dtype):
    model, folder = tiny
    probes = write_probe_set(folder / "p", 64, SPECS, scale=0.3)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, probe_prompt=True)
    graphs = LLM(model, probes=str(probes), dtype=dtype, max_seq_len=128, max_batch_size=8, kv_cache_memory_gb=1)
    eager = LLM(model, probes=str(probes), dtype=dtype, max_seq_len=128, max_batch_size=8, kv_cache_memory_gb=1, use_cuda_graphs=False)
    assert graphs.runner.graphs is not None and eager.runner.graphs is None
    atol = 1e-5 if dtype == "float32" else 2e-2
    for g, e in zip(graphs.generate_ids(_prompts(), params), eager.generate_ids(_prompts(), params)):
        assert g.token_ids == e.token_ids
        for name in e.probes:
            np.testing.assert_allclose(g.probes[name], e.probes[name], atol=atol)
            np.testing.assert_allclose(g.prompt_probes[name], e.prompt_probes[name], atol=atol)
    captured = dict(graphs.runner.graphs._graphs)
    before = graphs.generate_ids(_prompts()[:1], params)[0].probes["bank.p3"]
    write_probe_set(folder / "p", 64, SPECS, seed=8, scale=0.3)
    assert graphs.reload_probes()[0].version == 2
    after = graphs.generate_ids(_prompts()[:1], params)[0].probes["bank.p3"]
    assert graphs.runner.graphs._graphs == captured  # the same graph objects: nothing was re-captured
    assert not np.allclose(before, after, atol=1e-3)
    fresh = LLM(model, probes=str(probes), dtype=dtype, max_seq_len=128, max_batch_size=8, kv_cache_memory_gb=1, use_cuda_graphs=False)
    np.testing.assert_allclose(after, fresh.generate_ids(_prompts()[:1], params)[0].probes["bank.p3"], atol=atol)
    assert load_probe_set(probes, 64, 3).names == tuple(p.name for p in graphs.probes())
