"""Speculative decoding (n-gram) through the engine: greedy tokens and text identical to plain decoding for tiny
Llama / Qwen / Gemma in float32, alone and in mixed batches (with requests that draft nothing), under preemption,
with stops and length limits inside an accepted run; seeded sampling reproducible whatever shares the batch;
drafts and acceptances counted; rejected positions give their blocks back."""

from __future__ import annotations

import json
import random

import httpx
import pytest

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from server_harness import running_server


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory) -> str:
    return str(save_tiny_with_tokenizer(request.param, tmp_path_factory.mktemp(request.param) / "model", seed=2))


def _prompts() -> list[list[int]]:
    """Prompts that repeat themselves, so lookups find continuations, and one that does not."""
    rng = random.Random(7)
    out = []
    for length, repeats in ((6, 3), (11, 2), (4, 5), (9, 2), (3, 1), (20, 1)):
        piece = [rng.randrange(1, 320) for _ in range(length)]
        out.append(piece * repeats + piece[: length // 2])
    return out


def _llm(path: str, **options: object) -> LLM:
    return LLM(path, device="cpu", dtype="float32", max_seq_len=192, max_batch_size=8, block_size=4, **options)


def _spec(path: str, **options: object) -> LLM:
    """Speculation at every batch size (the default stops drafting from 2 running requests on)."""
    options = {"speculative_disable_by_batch_size": 0, **options}
    return _llm(path, speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=3, **options)


GREEDY = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)


@pytest.fixture(scope="module")
def plain(checkpoint) -> list:
    return _llm(checkpoint).generate_ids(_prompts(), GREEDY)


def _same(got: list, want: list) -> None:
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert [o.text for o in got] == [o.text for o in want]
    assert [o.finish_reason for o in got] == [o.finish_reason for o in want]


def test_greedy_batch_is_identical_and_drafts_are_accepted(checkpoint, plain):
    llm = _spec(checkpoint)
    _same(llm.generate_ids(_prompts(), GREEDY), plain)
    scheduler = llm.engine.scheduler
    assert scheduler.num_drafted > 0 and 0 < scheduler.num_accepted <= scheduler.num_drafted
    stats = llm.engine.stats()
    assert (stats.spec_drafted, stats.spec_accepted) == (scheduler.num_drafted, scheduler.num_accepted)
    assert llm.engine.kv.audit_blocks() == {}


def test_greedy_batch_1_is_identical(checkpoint, plain):
    llm = _spec(checkpoint)
    for prompt, want in zip(_prompts(), plain):
        _same(llm.generate_ids([prompt], GREEDY), [want])


def test_mixed_batch_with_requests_that_draft_nothing(checkpoint):
    """Logprobs and a repetition penalty verify per token (k = 0) beside requests that speculate, and
    chunked prefills of late arrivals share the verify steps."""
    prompts = _prompts()
    params = [SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, logprobs=2 if i % 3 == 0 else None,
                             repetition_penalty=1.3 if i % 3 == 1 else 1.0) for i in range(len(prompts))]
    want = _llm(checkpoint, prefill_chunk_size=5).generate_ids(prompts, params)
    llm = _spec(checkpoint, prefill_chunk_size=5)
    _same(llm.generate_ids(prompts, params), want)
    assert llm.engine.scheduler.num_accepted > 0


def test_preemption_recomputes_to_the_same_tokens(checkpoint, plain):
    llm = _spec(checkpoint, num_kv_blocks=48)
    _same(llm.generate_ids(_prompts(), GREEDY), plain)
    assert llm.engine.scheduler.num_preemptions > 0 and llm.engine.scheduler.num_accepted > 0
    assert llm.engine.kv.audit_blocks() == {}


@pytest.mark.parametrize("max_tokens", [1, 2, 5, 7])
def test_length_limits_inside_an_accepted_run(checkpoint, max_tokens):
    params = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    want = _llm(checkpoint).generate_ids(_prompts(), params)
    got = _spec(checkpoint).generate_ids(_prompts(), params)
    _same(got, want)
    assert all(len(o.token_ids) == max_tokens for o in got)


def test_stop_strings_and_eos_inside_an_accepted_run(checkpoint, plain):
    """Stops taken from the plain outputs' middles: the text ends where plain decoding ends it."""
    stops = [o.text[len(o.text) // 2 : len(o.text) // 2 + 3] for o in plain if len(o.text) > 8]
    params = SamplingParams(temperature=0, max_tokens=40, stop=stops)
    want = _llm(checkpoint).generate_ids(_prompts(), params)
    _same(_spec(checkpoint).generate_ids(_prompts(), params), want)
    assert any(o.finish_reason == "stop" for o in want)


def test_seeded_sampling_is_reproducible_whatever_shares_the_batch(checkpoint):
    prompts = _prompts()
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=40 + i, max_tokens=25, ignore_eos=True)
              for i in range(len(prompts))]
    llm = _spec(checkpoint)
    together = [o.token_ids for o in llm.generate_ids(prompts, params)]
    alone = [llm.generate_ids([p], [q])[0].token_ids for p, q in zip(prompts, params)]
    assert together == alone


def test_server_streams_the_same_text_and_reports_acceptance(checkpoint):
    """Over HTTP: a streamed greedy completion with speculation equals the plain one, chunk by chunk of tokens,
    and /metrics counts drafted and accepted tokens."""

    prompt = _prompts()[0]
    body = {"model": "smollm2", "prompt": prompt, "max_tokens": 30, "temperature": 0, "ignore_eos": True}
    want = _llm(checkpoint).generate_ids([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    with running_server(checkpoint, device="cpu", dtype="float32", max_seq_len=192, max_batch_size=8, block_size=4,
                        speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=3,
                        speculative_disable_by_batch_size=0) as server:
        whole = httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=60).json()
        assert whole["choices"][0]["text"] == want.text
        assert whole["usage"]["completion_tokens"] == 30
        streamed = ""
        with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body | {"stream": True}, timeout=60) as r:
            for line in r.iter_lines():
                if line.startswith("data: {"):
                    streamed += json.loads(line[6:])["choices"][0]["text"]
        assert streamed == want.text
        metrics = httpx.get(f"{server.base_url}/metrics").text
    values = {line.split("{")[0]: float(line.split()[-1]) for line in metrics.splitlines() if line.startswith("infer:spec")}
    assert values["infer:spec_decode_num_draft_tokens_total"] > 0
    assert 0 < values["infer:spec_decode_num_accepted_tokens_total"] <= values["infer:spec_decode_num_draft_tokens_total"]
    assert 0 < values["infer:spec_decode_draft_acceptance_rate"] <= 1
    assert values["infer:spec_decode_mean_accepted_length"] > 1


def test_drafting_stops_while_the_batch_is_at_the_threshold(checkpoint):
    """--speculative-disable-by-batch-size: at 2 running requests no drafts (the default), alone it drafts again."""
    gated = _spec(checkpoint, speculative_disable_by_batch_size=2)
    prompts = _prompts()[:2]
    gated.generate_ids(prompts, GREEDY)
    assert gated.engine.scheduler.num_drafted == 0
    gated.generate_ids(prompts[:1], GREEDY)
    assert gated.engine.scheduler.num_drafted > 0
