"""Scheduler: admission limits, static vs continuous, policies, the fairness rule, preemption by recomputation."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings, strategies as st

from engine_fakes import fake_engine, run_all
from infer.runners.step import StepKind
from infer.sampling.params import SamplingParams


def _params(n: int, **kw: object) -> SamplingParams:
    return SamplingParams(temperature=1.0, max_tokens=n, ignore_eos=True, seed=7, **kw)  # type: ignore[arg-type]


def _submit(engine, lengths: list[tuple[int, int]]) -> list[str]:
    rng = random.Random(0)
    return [
        engine.add_request([rng.randrange(1, 1000) for _ in range(p)], _params(g), request_id=f"r{i}").request_id
        for i, (p, g) in enumerate(lengths)
    ]


def _tokens(outputs: dict[str, list]) -> dict[str, list[int]]:
    return {rid: [o.token_id for o in outs if o.token_id is not None] for rid, outs in outputs.items()}


WORK = [(13, 9), (3, 20), (30, 5), (7, 7), (21, 12), (5, 30)]


@pytest.mark.parametrize("options", [{}, {"use_chunked_prefill": False}, {"use_prefix_caching": True}])
def test_preemption_recomputes_to_the_same_tokens_and_leaks_nothing(options):
    roomy, _ = fake_engine(num_blocks=256)
    _submit(roomy, WORK)
    expected = _tokens(run_all(roomy))
    tight, _ = fake_engine(num_blocks=16, prefill_chunk_size=5, **options)  # 64 slots for ~160 tokens of work
    _submit(tight, WORK)
    got = run_all(tight)
    assert tight.scheduler.num_preemptions > 0
    assert _tokens(got) == expected
    assert all(sum(o.finished for o in outs) == 1 and outs[-1].finish_reason == "length" for outs in got.values())
    assert tight.kv.audit_blocks() == {}


def test_static_batching_admits_only_into_an_empty_batch():
    engine, runner = fake_engine(batching_mode="static", max_batch_size=2)
    _submit(engine, [(4, 3), (4, 6), (4, 2)])
    run_all(engine)
    kinds = [k for k, _ in runner.log]
    assert kinds == [StepKind.PREFILL] + [StepKind.DECODE] * 5 + [StepKind.PREFILL] + [StepKind.DECODE]


def test_continuous_batching_admits_while_others_decode():
    engine, runner = fake_engine(max_batch_size=2)
    _submit(engine, [(4, 3), (4, 6), (4, 2)])
    run_all(engine)
    second_prefill = [i for i, (k, _) in enumerate(runner.log) if k is StepKind.PREFILL][1]
    assert second_prefill < 6  # the third request starts as soon as the first finishes


def test_batch_size_and_token_budget_are_respected():
    engine, runner = fake_engine(max_batch_size=3, max_num_batched_tokens=300, max_seq_len=256)
    _submit(engine, [(100, 2)] * 5 + [(10, 2)] * 4)
    run_all(engine)
    for kind, lens in runner.log:
        assert len(lens) <= 3
        assert kind is StepKind.DECODE or sum(lens) <= 300


def test_decode_round_robin_alternates_prefill_and_decode():
    engine, runner = fake_engine(scheduler_policy="decode_round_robin", max_batch_size=8, use_chunked_prefill=False)
    engine.add_request([5, 6], _params(6))
    engine.step()
    engine.step()
    for i in range(3):
        engine.add_request([7, 8, 9], _params(40), request_id=f"late{i}")
    for _ in range(8):
        engine.step()
    kinds = [k for k, _ in runner.log]
    assert all(not (a is b is StepKind.PREFILL) for a, b in zip(kinds, kinds[1:]))


@pytest.mark.parametrize("policy", ["fcfs", "prefill_first", "decode_round_robin"])
def test_fairness_rule_bounds_the_wait_of_every_decoding_sequence(policy: str):
    """Without chunked prefill a step is prefill or decode: the fairness rule forces a decode step in time."""
    engine, runner = fake_engine(scheduler_policy=policy, fairness_steps=3, max_batch_size=64, num_blocks=512,
                                 use_chunked_prefill=False)
    engine.add_request([1, 2, 3], _params(30), request_id="long")
    for i in range(20):  # a new arrival before every step keeps prefill always possible
        engine.add_request([4, 5, 6], _params(1), request_id=f"short{i}")
        engine.step()
    served = [step for step, (kind, lens) in enumerate(runner.log) if kind is StepKind.DECODE and lens]
    gaps = [b - a for a, b in zip([0, *served], served)]
    assert served and max(gaps) <= 3


def test_fcfs_blocks_behind_a_request_that_does_not_fit_and_prefill_first_overtakes_boundedly():
    for policy, overtakes in (("fcfs", False), ("prefill_first", True)):
        engine, runner = fake_engine(scheduler_policy=policy, num_blocks=12, fairness_steps=2, max_seq_len=48)
        engine.add_request(list(range(1, 31)), _params(10), request_id="big")  # 8 of 12 blocks after one token
        engine.step()
        engine.add_request(list(range(100, 120)), _params(5), request_id="mid")  # does not fit beside big
        engine.add_request([1, 2], _params(5), request_id="small")  # fits
        engine.step()
        assert (runner.log[-1][0] is StepKind.PREFILL) == overtakes
        run_all(engine)
        assert engine.kv.audit_blocks() == {}


def test_max_tokens_zero_scores_the_prompt_without_generating():
    engine, _ = fake_engine()
    engine.add_request([3, 4, 5], SamplingParams(max_tokens=0), request_id="score")
    (out,) = run_all(engine)["score"]
    assert out.finished and out.finish_reason == "length" and out.token_id is None and out.completion_tokens == 0


def test_abort_of_waiting_and_running_requests_frees_blocks():
    engine, _ = fake_engine(max_batch_size=1)
    _submit(engine, [(5, 50), (5, 50)])
    engine.step()
    engine.abort("r0")
    engine.abort("r1")
    outs = engine.step()
    assert {o.request_id: o.finish_reason for o in outs} == {"r0": "abort", "r1": "abort"}
    assert not engine.has_unfinished() and engine.kv.audit_blocks() == {}


@settings(max_examples=40, deadline=None)
@given(
    work=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 25)), min_size=1, max_size=8),
    num_blocks=st.integers(16, 64),  # max_seq_len=64 always fits, as kv_layout guarantees
    policy=st.sampled_from(["fcfs", "prefill_first", "decode_round_robin"]),
    mode=st.sampled_from(["continuous", "static"]),
    max_batch=st.integers(1, 6),
)
def test_any_workload_finishes_with_the_same_tokens_and_no_leak(work, num_blocks, policy, mode, max_batch):
    reference, _ = fake_engine(num_blocks=512, max_seq_len=64)
    _submit(reference, work)
    expected = _tokens(run_all(reference))
    engine, _ = fake_engine(
        num_blocks=num_blocks, scheduler_policy=policy, batching_mode=mode, max_batch_size=max_batch, max_seq_len=64
    )
    _submit(engine, work)
    got = run_all(engine)
    assert _tokens(got) == expected
    assert all(sum(o.finished for o in outs) == 1 for outs in got.values())
    assert engine.kv.audit_blocks() == {}


def test_requests_sharing_a_prefix_wait_for_the_first_to_cache_it():
    """Arriving together, the followers are admitted once the leader's prefill has cached the shared blocks:
    the shared part is computed once, and each follower's tokens equal those of a run without caching."""
    rng = random.Random(1)
    shared = [rng.randrange(1, 1000) for _ in range(24)]  # 6 blocks of 4
    prompts = [shared + [rng.randrange(1, 1000) for _ in range(3)] for _ in range(4)]

    def run(caching: bool):
        engine, runner = fake_engine(num_blocks=128, prefill_chunk_size=8, use_prefix_caching=caching)
        for i, p in enumerate(prompts):
            engine.add_request(p, _params(5), request_id=f"r{i}")
        outputs = run_all(engine)
        computed = sum(sum(lens) for kind, lens in runner.log if kind is StepKind.PREFILL)
        return _tokens(outputs), {rid: outs[-1].cached_tokens for rid, outs in outputs.items()}, computed, engine

    plain, _, plain_computed, _ = run(False)
    tokens, cached, computed, engine = run(True)
    assert tokens == plain
    assert cached == {"r0": 0, "r1": 24, "r2": 24, "r3": 24}
    assert plain_computed - computed == 3 * 24  # prefill steps also carry decode rows: compare the difference
    assert engine.kv.prefix_hits == 3 * 24 and engine.kv.prefix_queries == 4 * 27
    assert engine.kv.audit_blocks() == {}
