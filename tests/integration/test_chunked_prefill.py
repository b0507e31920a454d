"""Chunked prefill, mixed batches and prefix caching give exactly the tokens of whole-prompt prefill.

Tiny random Llama 3 / Qwen 3 / Gemma 3 checkpoints in float32 on the CPU (and on CUDA with decode graphs
when there is one): chunk sizes 1, 7 and 64 beside running decodes, prefix caching on and off with full
hits, prefixes that end inside a block, eviction under pressure and preemption in the middle of a prefill.
"""

from __future__ import annotations

import random

import pytest
import torch

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory) -> str:
    return str(save_tiny_with_tokenizer(request.param, tmp_path_factory.mktemp(request.param), seed=3))


def _prompts() -> list[list[int]]:
    """Varied lengths; several share a system-prompt-like prefix that ends inside a 4-token block."""
    rng = random.Random(11)
    shared = [rng.randrange(1, 320) for _ in range(30)]
    own = [[rng.randrange(1, 320) for _ in range(n)] for n in (3, 41, 90, 9)]
    return [shared + own[0], own[1], shared + own[3], own[2], shared[:13], shared + own[0]]


def _llm(path: str, device: str, **options: object) -> LLM:
    return LLM(path, device=device, dtype="float32", max_seq_len=160, max_batch_size=8, block_size=4, **options)


def _staggered(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> list[list[int]]:
    """Requests arrive while others decode, so prefill chunks share steps with running decodes."""
    engine, pending, requests = llm.engine, list(zip(prompts, params)), []
    while pending or engine.has_unfinished():
        if pending:
            requests.append(engine.add_request(*pending.pop(0)))
        for out in engine.step():
            assert out.error is None, out.error
    assert engine.kv.audit_blocks() == {}
    return [r.output_token_ids for r in requests]


@pytest.fixture(scope="module", params=DEVICES)
def device(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def expected(checkpoint, device) -> list[list[int]]:
    """Whole prompts, no prefix cache, each request alone, on the same device."""
    llm = _llm(checkpoint, device, use_chunked_prefill=False, use_prefix_caching=False)
    return [llm.generate_ids([p], GREEDY)[0].token_ids for p in _prompts()]



@pytest.mark.parametrize("chunk", [1, 7, 64])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_chunked_mixed_steps_equal_whole_prompts(checkpoint, expected, device, chunk, prefix_caching):
    llm = _llm(checkpoint, device, prefill_chunk_size=chunk, use_prefix_caching=prefix_caching)
    assert _staggered(llm, _prompts(), [GREEDY] * len(expected)) == expected
    hits = llm.engine.kv.prefix_hits
    assert (hits > 0) == prefix_caching  # the shared prefix was read from the cache


def test_full_hit_and_partial_block_prefix(checkpoint, expected, device):
    llm = _llm(checkpoint, device, prefill_chunk_size=16, use_prefix_caching=True)
    prompts = _prompts()
    first = llm.generate_ids([prompts[0]], GREEDY)[0]
    again = llm.generate_ids([prompts[0]], GREEDY)[0]  # every full block cached; the last token still runs
    assert first.token_ids == again.token_ids == expected[0]
    assert first.cached_tokens == 0 and again.cached_tokens == (len(prompts[0]) - 1) // 4 * 4
    shorter = llm.generate_ids([prompts[4]], GREEDY)[0]  # 13 tokens of the cached 33: 3 full blocks match
    assert shorter.token_ids == expected[4] and shorter.cached_tokens == 12
    assert llm.engine.kv.audit_blocks() == {}


def test_eviction_and_preemption_mid_prefill(checkpoint, expected, device):
    """A cache of 40 blocks of 4 for ~300 tokens of work: cached prefixes are evicted, requests are preempted
    (also while still prefilling in chunks of 5) and recomputed, and the tokens do not change."""
    llm = _llm(checkpoint, device, prefill_chunk_size=5, num_kv_blocks=40, use_prefix_caching=True)
    scheduler, states = llm.engine.scheduler, []
    preempt = scheduler._preempt

    def recording(request):
        states.append(request.state.value)
        preempt(request)

    scheduler._preempt = recording  # type: ignore[method-assign]
    got = llm.generate_ids(_prompts(), GREEDY)
    assert [o.token_ids for o in got] == expected
    assert "prefill" in states and "decode" in states
    assert llm.engine.kv.audit_blocks() == {}


def test_seeded_sampling_is_unchanged_by_chunks_batches_and_preemption(checkpoint, device):
    """A seeded request's noise follows its own generated tokens (its sampling slot's counter): chunked (chunks
    of 1 make steps of one new token per row that are not all decodes), batched, and preempted mid-prefill,
    it samples what it samples alone."""
    prompts = _prompts()
    params = [SamplingParams(temperature=0.9, top_k=40, seed=100 + i, max_tokens=10, ignore_eos=True)
              for i in range(len(prompts))]
    whole = _llm(checkpoint, device, use_chunked_prefill=False)
    alone = [whole.generate_ids([p], q)[0].token_ids for p, q in zip(prompts, params)]
    for chunk in (1, 7):
        assert _staggered(_llm(checkpoint, device, prefill_chunk_size=chunk), prompts, params) == alone
    tight = _llm(checkpoint, device, prefill_chunk_size=5, num_kv_blocks=40, use_prefix_caching=True)
    assert [o.token_ids for o in tight.generate_ids(prompts, params)] == alone
    assert tight.engine.scheduler.num_preemptions > 0


def test_chunks_that_do_not_sample_skip_the_lm_head(checkpoint, expected, device):
    """A prompt alone in chunks of 7: only its last chunk computes logits (one row), and samples whole prefill's
    first token."""
    llm = _llm(checkpoint, device, prefill_chunk_size=7, use_prefix_caching=False)
    model = llm.runner.model
    head, rows = model.head_logits, []

    def counting(hidden):
        rows.append(hidden.shape[0])
        return head(hidden)

    model.head_logits = counting  # type: ignore[method-assign]
    prompt = _prompts()[3]  # 90 tokens: 13 chunks
    first = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    assert llm.generate_ids([prompt], first)[0].token_ids == expected[3][:1]
    assert rows == [1]  # nothing for the 12 chunks before it


def _prompt_logprobs(llm: LLM, prompts: list[list[int]], params: SamplingParams) -> list[list]:
    """Each prompt's prompt logprobs (first output), as (logprob, top ids) per position."""
    engine, firsts = llm.engine, {}
    requests = [engine.add_request(prompt, params) for prompt in prompts]  # all at once: they compete for blocks
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            if out.prompt_logprobs is not None:
                firsts[out.request_id] = out.prompt_logprobs
    out = []
    for prompt, request in zip(prompts, requests):
        first = firsts[request.request_id]
        assert len(first) == len(prompt) and first[0] is None
        out.append([(lp.logprob, [t for t, _ in lp.top]) for lp in first[1:]])
    return out


@pytest.mark.parametrize("max_tokens", [0, 1])
def test_prompt_logprobs_go_through_chunked_prefill(checkpoint, device, max_tokens):
    """Echo with logprobs (lm-eval's loglikelihood) in chunks of 1 and 7 and preempted mid-prefill: no chunk is
    wider than its size, and the logprobs equal whole-prompt prefill's."""
    prompts = _prompts()
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, prompt_logprobs=2)
    whole = _prompt_logprobs(_llm(checkpoint, device, use_chunked_prefill=False), prompts, params)
    for chosen, options in (([4], {"prefill_chunk_size": 1}), (range(len(prompts)), {"prefill_chunk_size": 7}),
                            (range(len(prompts)), {"prefill_chunk_size": 5, "num_kv_blocks": 40})):
        llm = _llm(checkpoint, device, **options)
        scheduler, widths = llm.engine.scheduler, []
        schedule = scheduler.schedule

        def recording():
            batch = schedule()
            widths.extend(row.num_new for row in (batch.rows if batch is not None else []))
            return batch

        scheduler.schedule = recording  # type: ignore[method-assign]
        got = _prompt_logprobs(llm, [prompts[i] for i in chosen], params)
        assert max(widths) <= options["prefill_chunk_size"]
        for ours, i in zip(got, chosen):
            assert [top for _, top in ours] == [top for _, top in whole[i]]
            assert max(abs(a - b) for (a, _), (b, _) in zip(ours, whole[i])) < 1e-5
        assert llm.engine.kv.audit_blocks() == {}
        assert (scheduler.num_preemptions > 0) == ("num_kv_blocks" in options)
