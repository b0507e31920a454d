"""Speculative decoding with a draft model through the engine: greedy tokens and text identical to plain decoding
for tiny Llama / Qwen / Gemma in float32 (a drafter equal to the target accepts every draft; a different, smaller
one rejects most), alone, in mixed batches with chunked prefills and requests that draft nothing, under preemption;
seeded sampling reproducible whatever shares the batch; a drafter with another vocabulary refused at startup."""

from __future__ import annotations

from pathlib import Path

import pytest

from checkpoints import FAMILIES, save_tiny, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.engine.config import EngineConfigError
from test_speculative import GREEDY, _llm, _prompts, _same


@pytest.fixture(scope="module", params=FAMILIES)
def family(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def target(family, tmp_path_factory) -> str:
    return str(save_tiny_with_tokenizer(family, tmp_path_factory.mktemp(family) / "target", seed=2))


@pytest.fixture(scope="module")
def small_drafter(family, tmp_path_factory) -> str:
    """Another model with the same vocabulary: a narrower MLP, other weights (its drafts are mostly rejected)."""
    return str(save_tiny(family, tmp_path_factory.mktemp(family) / "drafter", seed=9, intermediate_size=64))


@pytest.fixture(scope="module")
def plain(target) -> list:
    return _llm(target).generate_ids(_prompts(), GREEDY)


def _draft(target: str, drafter: str, **options: object) -> LLM:
    return _llm(target, speculative_method="draft", draft_model=drafter, num_speculative_tokens=3, **options)


def test_greedy_batch_identical_with_the_target_as_drafter(target, plain):
    """Every draft accepted: each step emits k + 1 tokens and the drafter catches up on its last draft."""
    llm = _draft(target, target)
    _same(llm.generate_ids(_prompts(), GREEDY), plain)
    s = llm.engine.scheduler
    assert s.num_drafted > 0 and s.num_accepted == s.num_drafted
    assert llm.engine.kv.audit_blocks() == {}


def test_greedy_batch_identical_with_a_different_drafter(family, target, small_drafter, plain):
    llm = _draft(target, small_drafter)
    _same(llm.generate_ids(_prompts(), GREEDY), plain)
    s = llm.engine.scheduler
    # (the tiny random Gemma greedily repeats its prompt's last token, so any drafter guesses it)
    assert s.num_drafted > 0 and (s.num_accepted < s.num_drafted or family == "gemma3")
    assert llm.engine.kv.audit_blocks() == {}


def test_greedy_batch_1_identical(target, small_drafter, plain):
    llm = _draft(target, small_drafter)
    for prompt, want in zip(_prompts()[:3], plain):
        _same(llm.generate_ids([prompt], GREEDY), [want])


def test_mixed_batch_with_chunked_prefills_and_requests_that_draft_nothing(target):
    prompts = _prompts()
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2 if i % 3 == 0 else None,
                             repetition_penalty=1.3 if i % 3 == 1 else 1.0) for i in range(len(prompts))]
    want = _llm(target, prefill_chunk_size=5).generate_ids(prompts, params)
    llm = _draft(target, target, prefill_chunk_size=5)
    _same(llm.generate_ids(prompts, params), want)
    assert llm.engine.scheduler.num_accepted > 0


def test_preemption_recomputes_to_the_same_tokens(target, small_drafter, plain):
    llm = _draft(target, small_drafter, num_kv_blocks=48)
    _same(llm.generate_ids(_prompts(), GREEDY), plain)
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.kv.audit_blocks() == {}


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(target, small_drafter):
    prompts = _prompts()
    params = [SamplingParams(temperature=0.9, top_k=40, seed=60 + i, max_tokens=20, ignore_eos=True)
              for i in range(len(prompts))]
    llm = _draft(target, small_drafter)
    together = [o.token_ids for o in llm.generate_ids(prompts, params)]
    alone = [llm.generate_ids([p], [q])[0].token_ids for p, q in zip(prompts, params)]
    assert together == alone
    assert llm.engine.scheduler.num_drafted > 0


def test_a_drafter_with_another_vocabulary_is_refused_naming_both_sizes(target, family, tmp_path: Path):
    other = save_tiny(family, tmp_path / "other", vocab_size=256)
    with pytest.raises(EngineConfigError, match=r"^draft_model=.*256 tokens.*320"):
        _draft(target, str(other))
