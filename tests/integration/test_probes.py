"""Probe scores through the engine: parity with transformers' hidden states, request-exact rows whatever shares
the step (batching, chunked prefill, preemption), hot reload between steps, probe_stop and the errors.

Tiny random Llama 3 / Qwen 3 / Gemma 3 checkpoints and the bundled SmolLM2, float32 on the CPU (and on CUDA
when there is one). A generated token's score is the probe of the residual at the position whose forward
produced it: the last prompt position for the first token, then each previous token.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.sampling.params import ProbeStop
from omniscience import load_probe_set
from probe_sets import Spec, expected_scores, write_probe_set

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
ATOL = 1e-4  # the bound; measured here ~1e-6
SPECS = [Spec("lin", 0), Spec("sig", 1, "sigmoid"), Spec("bank", 1, "tanh", count=3)]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, probe_prompt=True)


@pytest.fixture(scope="module", params=[*FAMILIES, "qwen3_moe"])  # probes on resid_post of sparse blocks too
def tiny(request, tmp_path_factory) -> tuple[str, str]:
    folder = tmp_path_factory.mktemp(request.param)
    path = save_tiny_with_tokenizer(request.param, folder / "model", seed=3)
    return str(path), str(write_probe_set(folder / "probes", 64, SPECS, seed=1, scale=0.3))


def _prompts(n: int, seed: int = 5) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 320) for _ in range(length)] for length in (7, 30, 3, 55, 12, 21, 40, 9, 17)[:n]]


def _hf_check(hf, probe_set, out, atol: float = ATOL) -> None:
    """Served scores against activation(w . h + b) from transformers' hidden states of the same tokens."""
    ids = out.prompt_token_ids + out.token_ids
    with torch.no_grad():
        states = hf(torch.tensor([ids]), output_hidden_states=True).hidden_states  # [0] embeddings, [i + 1] block i
    n, m = len(out.prompt_token_ids), len(out.token_ids)
    for probe in probe_set.probes:
        want = expected_scores(probe, states[probe.layer + 1][0])
        assert len(out.probes[probe.name]) == m and len(out.prompt_probes[probe.name]) == n
        # rtol: a score of ~2000 (SmolLM2's first position) has a float32 ulp of 1.2e-4, above atol alone
        np.testing.assert_allclose(out.probes[probe.name], want[n - 1 : n - 1 + m], atol=atol, rtol=1e-6,
                                   err_msg=probe.name)
        np.testing.assert_allclose(out.prompt_probes[probe.name], want[:n], atol=atol, rtol=1e-6, err_msg=probe.name)


@pytest.mark.parametrize("device", DEVICES)
def test_scores_equal_transformers_hidden_states(tiny, device):
    from transformers import AutoModelForCausalLM

    model, probes = tiny
    llm = LLM(model, probes=probes, device=device, dtype="float32", max_seq_len=128)
    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    probe_set = load_probe_set(probes, 64, 3)
    for out in llm.generate_ids(_prompts(3), GREEDY):
        _hf_check(hf, probe_set, out)


@pytest.mark.slow
def test_smollm2_scores_equal_transformers_hidden_states(smollm2_gguf, hf_smollm2, tmp_path):
    probes = write_probe_set(tmp_path, 576, [Spec("early", 3, "sigmoid"), Spec("late", 17, count=2)], scale=0.05)
    llm = LLM(str(smollm2_gguf), probes=str(probes), max_seq_len=256, quantization="none")  # the weights transformers loads
    out = llm.generate(["The capital of France is"], SamplingParams(temperature=0, max_tokens=6, probe_prompt=True))[0]
    assert "Paris" in out.text and set(out.probes) == {"early", "late.p0", "late.p1"}
    _hf_check(hf_smollm2, load_probe_set(probes, 576, 30), out)


def _alone(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list:
    return [llm.generate_ids([p], params)[0] for p in prompts]


def _assert_same(got, want) -> None:
    for g, w in zip(got, want):
        assert g.token_ids == w.token_ids
        for field in ("probes", "prompt_probes"):
            assert getattr(g, field).keys() == getattr(w, field).keys()
            for name in getattr(w, field):
                np.testing.assert_allclose(getattr(g, field)[name], getattr(w, field)[name], atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_rows_are_request_exact_amid_other_requests_and_chunks(tiny, device):
    """Each request alone (whole prompts) == 9 requests at once with prompts cut in chunks of 5."""
    model, probes = tiny
    whole = LLM(model, probes=probes, device=device, dtype="float32", max_seq_len=128, use_chunked_prefill=False)
    chunked = LLM(model, probes=probes, device=device, dtype="float32", max_seq_len=128, prefill_chunk_size=5)
    prompts = _prompts(9)
    _assert_same(chunked.generate_ids(prompts, GREEDY), _alone(whole, prompts, GREEDY))


def test_preempted_requests_do_not_repeat_or_lose_scores(tiny):
    """A KV cache too small for the batch: requests are preempted (some mid-prompt) and recomputed."""
    model, probes = tiny
    tight = LLM(model, probes=probes, dtype="float32", max_seq_len=80, block_size=4, num_kv_blocks=24,
                prefill_chunk_size=5, max_batch_size=8)
    roomy = LLM(model, probes=probes, dtype="float32", max_seq_len=128)
    prompts = _prompts(8)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, probe_prompt=True)
    got = tight.generate_ids(prompts, params)
    assert tight.engine.scheduler.num_preemptions > 0
    _assert_same(got, _alone(roomy, prompts, params))


def test_reload_changes_scores_from_the_next_step_without_failing_requests(tiny, tmp_path):
    model, probes = tiny
    llm = LLM(model, probes=probes, dtype="float32", max_seq_len=128)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, probes=["sig", "bank.p1"])
    request = engine.add_request(_prompts(1)[0], params)
    scores: list[dict] = []
    while len(scores) < 4:
        scores += [o.probe_dict() for o in engine.step() if o.probes is not None]
    new = write_probe_set(tmp_path, 64, [Spec("sig", 1, "sigmoid"), Spec("bank", 1, "tanh", count=2)], seed=9, scale=0.3)
    version = engine.swap_probes(load_probe_set(new, 64, 3)).version
    swapped_at = len(scores)
    while engine.has_unfinished():
        outs = engine.step()
        assert all(o.error is None for o in outs)
        scores += [o.probe_dict() for o in outs if o.probes is not None]
    assert version == 2 and len(scores) == 12 and request.finish_reason == "length"
    # reference: the same tokens recomputed under each set
    old_llm, new_llm = LLM(model, probes=probes, dtype="float32"), LLM(model, probes=str(new), dtype="float32")
    teacher = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    old = old_llm.generate_ids([request.prompt_token_ids], teacher)[0].probes
    fresh = new_llm.generate_ids([request.prompt_token_ids], teacher)[0].probes
    assert old_llm.generate_ids([request.prompt_token_ids], teacher)[0].token_ids == request.output_token_ids
    source = ["old" if np.isclose(s["sig"], old["sig"][i], atol=1e-5) else "new" if np.isclose(s["sig"], fresh["sig"][i], atol=1e-5)
              else "neither" for i, s in enumerate(scores)]
    boundary = source.index("new")
    assert source == ["old"] * boundary + ["new"] * (12 - boundary), source
    assert swapped_at <= boundary <= swapped_at + 2  # the steps launched before the swap keep the old weights


def test_probe_stop_ends_the_request_with_content_filter(tiny):
    model, probes = tiny
    llm = LLM(model, probes=probes, dtype="float32", max_seq_len=128)
    prompt = _prompts(1)[0]
    free = llm.generate_ids([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True))[0]
    threshold = float(np.median(free.probes["sig"]))
    crossing = next(i for i, s in enumerate(free.probes["sig"]) if s > threshold)
    stopped = llm.generate_ids([prompt], SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, probes=["lin"],
                                                        probe_stop=ProbeStop("sig", above=threshold)))[0]
    assert stopped.finish_reason == "content_filter"
    assert stopped.token_ids == free.token_ids[: crossing + 1]  # the crossing token is the last one
    assert list(stopped.probes) == ["lin"] and len(stopped.probes["lin"]) == crossing + 1


def test_unknown_probes_and_a_smollm2_without_probes_are_refused(tiny, smollm2_llm):
    model, probes = tiny
    llm = LLM(model, probes=probes, dtype="float32", max_seq_len=128)
    assert [p.name for p in llm.probes()] == ["lin", "sig", "bank.p0", "bank.p1", "bank.p2"]
    assert {p.layer for p in llm.probes()} == {0, 1} and llm.probes()[0].version == 1
    with pytest.raises(ValueError, match="probes: unknown probe"):
        llm.generate_ids([[1, 2]], SamplingParams(probes=["nope"]))
    with pytest.raises(ValueError, match="probe_stop: unknown probe"):
        llm.generate_ids([[1, 2]], SamplingParams(probe_stop=ProbeStop("nope", below=0)))
    with pytest.raises(ValueError, match="no probe set is loaded"):
        smollm2_llm.generate_ids([[1, 2]], SamplingParams(probes=True))
    assert smollm2_llm.probes() == [] and smollm2_llm.generate_ids([[1, 2]], SamplingParams(max_tokens=2))[0].probes == {}
