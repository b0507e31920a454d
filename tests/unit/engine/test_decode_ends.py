"""Which token ends a decoding request, decided for the decode table's rows as arrays (OutputProcessor.process_decode):
EOS unless ignore_eos, max_tokens, max_seq_len, and the same ends for rows that take the per-request path."""

from __future__ import annotations

import pytest

from engine_fakes import EOS, FakeRunner, FakeTokenizer, run_all
from infer.engine.config import EngineConfig
from infer.build.in_process import Engine
from infer.kv.kv_manager import KVCacheManager
from infer.runners.step import StepInput
from infer.sampling.params import SamplingParams


class ScriptedEosRunner(FakeRunner):
    """FakeRunner's cache checks and tokens, but the request seeded s samples EOS as its eos_at[s]-th token."""

    def __init__(self, block_size: int, eos_at: dict[int, int]) -> None:
        super().__init__(block_size)
        self.eos_at = eos_at

    def sample(self, step: StepInput, masks: object):  # type: ignore[no-untyped-def]
        done = super().sample(step, masks)
        tokens = done.result().token_ids  # the same list the next step's previous-row inputs read
        for i, slot in enumerate(step.sampling_slots):
            seed, sampled = self.slots[slot]
            if self.eos_at.get(seed) == sampled:
                tokens[i] = EOS
        return done


@pytest.mark.parametrize("options", [{}, {"use_prefix_caching": True}, {"use_chunked_prefill": False}])
def test_eos_length_and_context_ends(options):
    config = EngineConfig(max_seq_len=40, max_batch_size=8, **options)
    runner = ScriptedEosRunner(4, eos_at={0: 4, 1: 4, 3: 2, 4: 6})
    engine = Engine(config, runner, KVCacheManager(64, 4, prefix_caching=bool(config.use_prefix_caching)),
                    FakeTokenizer())
    requests = {  # request id -> (params, prompt length, expected finish reason and completion tokens)
        "eos": (SamplingParams(temperature=0, max_tokens=10, seed=0), 5, ("stop", 4)),
        "ignores_eos": (SamplingParams(temperature=0, max_tokens=6, seed=1, ignore_eos=True), 5, ("length", 6)),
        "max_tokens": (SamplingParams(temperature=0, max_tokens=3, seed=2), 7, ("length", 3)),
        "eos_with_logprobs": (SamplingParams(temperature=0, max_tokens=10, seed=3, logprobs=1), 6, ("stop", 2)),
        "max_seq_len": (SamplingParams(temperature=0, max_tokens=20, seed=4), 35, ("length", 5)),
    }
    for i, (rid, (params, n, _)) in enumerate(requests.items()):
        engine.add_request([1 + (7 * i + j) % 900 for j in range(n)], params, request_id=rid)
    outputs = run_all(engine)
    for rid, (_, _, (reason, tokens)) in requests.items():
        last = outputs[rid][-1]
        assert (last.finish_reason, last.completion_tokens) == (reason, tokens), rid
        assert sum(o.finished for o in outputs[rid]) == 1 and len(outputs[rid]) == tokens, rid
    assert engine.kv.audit_blocks() == {}
