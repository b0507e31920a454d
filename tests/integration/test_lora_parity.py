"""LoRA adapters against transformers + peft in float32: tiny random Llama 3 / Qwen 3 / Gemma 3 checkpoints with random
PEFT adapters (rank 8 on every projection, rank 16 on a few, rsLoRA on the MLP), their logits and greedy tokens; a
batch mixing three adapters and the base gives each row what it gets alone; an adapter swapped out of its device slot
and back gives the same tokens; a prefix cached under one adapter never serves another; TP=2 on gloo."""

from __future__ import annotations

import pytest
import torch

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, LoRARequest, SamplingParams
from infer.loader.model_loader import load_model
from infer.lora.registry import AdapterRef, LoRALoad
from infer.lora.stacks import LoRAWeights
from infer.models.forward_batch import ForwardBatch
from lora_adapters import reference, save_adapter

FP32_ATOL = 1e-4
ADAPTERS = {  # name -> (rank, targets, use_rslora)
    "all8": (8, ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"), False),
    "few16": (16, ("q_proj", "v_proj", "down_proj"), False),
    "mlp_rs": (8, ("gate_proj", "up_proj", "o_proj"), True),
}
PROMPTS = [[5, 9, 13, 22, 40, 7, 3], [7, 8, 9], [100, 3, 45, 2, 2, 60, 71, 8, 19, 33, 4], [12]]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    base = save_tiny_with_tokenizer(request.param, root / "base")
    adapters = {name: save_adapter(base, root / name, rank=rank, targets=targets, use_rslora=rs, seed=i)
                for i, (name, (rank, targets, rs)) in enumerate(ADAPTERS.items())}
    return request.param, base, adapters


def test_logits_match_transformers_and_peft(family):
    _, base, adapters = family
    loaded = load_model(base, torch.float32, "cpu")
    weights = LoRAWeights(loaded.model, slots=3, rank=16, cpu_slots=3, max_batch_size=4)
    weights.load([LoRALoad(i, AdapterRef(name, i + 1, str(path), 0, ())) for i, (name, path) in enumerate(adapters.items())])
    ids = torch.tensor([t for p in PROMPTS for t in p])
    for slot, (name, path) in enumerate([(None, None), *adapters.items()]):
        batch = ForwardBatch.for_prompts([len(p) for p in PROMPTS])
        batch.lora_ids = torch.full((len(ids),), slot - 1, dtype=torch.int64)  # -1: the base model
        with torch.no_grad():
            ours = loaded.model.compute_logits(loaded.model(ids, batch)).split([len(p) for p in PROMPTS])
            ref = reference(base, path)
            for got, prompt in zip(ours, PROMPTS):
                want = ref(torch.tensor([prompt])).logits[0].float()
                assert (got - want).abs().max().item() <= FP32_ATOL, (name, prompt)


def test_greedy_tokens_mixed_batches_and_swaps(family):
    name_of_family, base, adapters = family
    want = {}
    for name, path in [(None, None), *adapters.items()]:
        ref = reference(base, path)
        with torch.no_grad():
            want[name] = [ref.generate(torch.tensor([p]), max_new_tokens=8, do_sample=False, min_new_tokens=8)[0, len(p):]
                          .tolist() for p in PROMPTS]
    # each adapter changes the tokens (the tiny Gemma 3 repeats its last prompt token under all of them: its logits
    # test shows the adapters at work)
    assert len({tuple(map(tuple, w)) for w in want.values()}) == 4 or name_of_family == "gemma3"
    # two device slots for three adapters: the mixed batch waits for slots, adapters are swapped out and back in
    llm = LLM(str(base), device="cpu", enable_lora=True, max_loras=2, max_lora_rank=16, max_cpu_loras=2)
    requests = [LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())]
    for request in requests:
        got = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), lora_request=request)
        assert [o.token_ids for o in got] == want[request.lora_name]
    mixed = [None, *requests] * 2
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(mixed))]
    got = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), lora_request=mixed)
    assert [o.token_ids for o in got] == [want[None if r is None else r.lora_name][i % len(PROMPTS)]
                                          for i, r in enumerate(mixed)]
    again = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), lora_request=requests[0])
    assert [o.token_ids for o in again] == want[requests[0].lora_name]  # swapped out and back in
    assert llm.runner.lora.disk_reads > len(requests)  # max_cpu_loras=2 < 3 adapters: some were read again
    assert llm.engine.kv.audit_blocks() == {}
    assert all(users == 0 for users in llm.engine.scheduler.adapters.held().values())  # no slot leaked


def test_a_prefix_cached_under_an_adapter_serves_only_that_adapter(family):
    _, base, adapters = family
    llm = LLM(str(base), device="cpu", enable_lora=True, max_loras=2, max_lora_rank=16, block_size=4)
    prompt = list(range(3, 40))
    params = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    name = next(iter(adapters))
    request = LoRARequest(name, 1, str(adapters[name]))
    first = llm.generate([prompt], params, lora_request=request)[0]
    base_run = llm.generate([prompt], params)[0]
    assert base_run.cached_tokens == 0  # the adapter's KV is not the base model's
    second = llm.generate([prompt], params, lora_request=request)[0]
    assert second.cached_tokens > 0 and second.token_ids == first.token_ids
    assert llm.generate([prompt], params)[0].cached_tokens > 0


def test_data_parallel_engines_load_adapters_and_match_one_engine(tmp_path):
    """Two engine cores: an adapter loaded offline reaches both, and every row gets what one engine gives it."""
    base = save_tiny_with_tokenizer("llama", tmp_path / "base")
    path = save_adapter(base, tmp_path / "ad", rank=8, seed=5)
    requests = [None, LoRARequest("ad", 1, str(path))] * 3
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(len(requests))]
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    options = dict(device="cpu", enable_lora=True, max_batch_size=4)
    one = [o.token_ids for o in LLM(str(base), **options).generate(prompts, params, lora_request=requests)]
    with LLM(str(base), data_parallel_size=2, **options) as two:
        assert [o.token_ids for o in two.generate(prompts, params, lora_request=requests)] == one


def test_tensor_parallel_on_gloo_matches_one_rank(tmp_path):
    base = save_tiny_with_tokenizer("llama", tmp_path / "base")
    adapters = {name: save_adapter(base, tmp_path / name, rank=rank, targets=targets, use_rslora=rs, seed=i)
                for i, (name, (rank, targets, rs)) in enumerate(ADAPTERS.items())}
    requests = [None] + [LoRARequest(name, i + 1, str(path)) for i, (name, path) in enumerate(adapters.items())]
    params = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    options = dict(device="cpu", enable_lora=True, max_loras=3, max_lora_rank=16)
    one = [o.token_ids for o in LLM(str(base), **options).generate(PROMPTS, params, lora_request=requests)]
    with LLM(str(base), tensor_parallel_size=2, **options) as two:
        assert [o.token_ids for o in two.generate(PROMPTS, params, lora_request=requests)] == one


def test_adapters_compose_with_speculation_structured_output_and_probes(tmp_path):
    """n-gram speculation stays lossless on an adapter (verification runs it); a grammar holds on an adapter's
    output; probe scores are read off the adapted residual stream (they differ from the base model's)."""
    from infer.structured import Constraint
    from probe_sets import Spec, write_probe_set

    base = save_tiny_with_tokenizer("llama", tmp_path / "base")
    path = save_adapter(base, tmp_path / "ad", rank=8, seed=3)
    request = LoRARequest("ad", 1, str(path))
    repeat = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]]
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    plain = LLM(str(base), device="cpu", enable_lora=True)
    want = plain.generate(repeat, params, lora_request=request)[0].token_ids
    spec = LLM(str(base), device="cpu", enable_lora=True, speculative_method="ngram",
               speculative_disable_by_batch_size=0)
    assert spec.generate(repeat, params, lora_request=request)[0].token_ids == want
    assert spec.engine.scheduler.num_drafted > 0
    digits = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, structured=Constraint("regex", "[0-9]{6}"))
    text = plain.generate([[5, 9, 13]], digits, lora_request=request)[0].text
    assert len(text) == 6 and text.isdigit(), text
    probes = write_probe_set(tmp_path / "probes", 64, [Spec("lin", 1)], seed=1, scale=0.3)
    probed = LLM(str(base), device="cpu", enable_lora=True, probes=str(probes))
    on_adapter = probed.generate(repeat, params, lora_request=request)[0]
    on_base = probed.generate(repeat, params)[0]
    assert on_adapter.token_ids == want and len(on_adapter.probes["lin"]) == len(want)
    assert on_adapter.probes["lin"] != on_base.probes["lin"]
