"""Scheduling policies as objects: each policy's two answers, the names the config accepts, and a new policy
plugged in as one class changes what the scheduler runs."""

from __future__ import annotations

from engine_fakes import fake_engine
from infer.engine.config import SCHEDULER_POLICIES
from infer.engine.policy import POLICIES, DecodeRoundRobin, Policy, PrefillFirst
from infer.runners.step import StepKind
from infer.sampling.params import SamplingParams


def test_the_config_accepts_exactly_the_policies_there_are():
    assert SCHEDULER_POLICIES == tuple(POLICIES) == ("fcfs", "prefill_first", "decode_round_robin")


def test_each_policy_answers_its_two_questions():
    fcfs, first, round_robin = Policy(3), PrefillFirst(3), DecodeRoundRobin(3)
    assert fcfs.prefills(True) and fcfs.prefills(False) and not fcfs.overtakes(0)
    assert first.overtakes(0) and first.overtakes(2) and not first.overtakes(3)
    assert round_robin.prefills(False) and not round_robin.prefills(True) and not round_robin.overtakes(0)


class NoPromptsWhileDecoding(Policy):
    """A policy the scheduler does not know: prompt work only once nothing decodes (the fairness rule still holds)."""

    def prefills(self, last_had_prefill: bool) -> bool:
        return False


def test_a_new_policy_is_one_class():
    engine, runner = fake_engine(max_batch_size=8, use_chunked_prefill=True)
    engine.scheduler.policy = NoPromptsWhileDecoding(4)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    engine.add_request([5, 6, 7], params, request_id="first")
    engine.step()  # the first prompt: nothing decodes yet, so the policy is not asked
    engine.add_request([8, 9], params, request_id="second")
    for _ in range(4):
        engine.step()
    # while "first" decodes, "second" is never scheduled: every step since has one row of one token
    assert [lens for _, lens in runner.log[1:]] == [[1]] * 4
    while engine.has_unfinished():
        engine.step()
    assert runner.log[-1][0] is StepKind.DECODE and engine.kv.audit_blocks() == {}
