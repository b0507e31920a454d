"""A core step's outputs: plain decode tokens as two columns (request ids, token ids), whole CoreOutputs for the
rest (a first output, an end, logprobs), and the caller's StepOutputs the same either way."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from engine_fakes import FakeRunner, FakeTokenizer, fake_engine, run_all
from infer.engine.config import EngineConfig
from infer.build.in_process import Engine
from infer.kv.kv_manager import KVCacheManager
from infer.sampling.params import SamplingParams
from omniscience.bank import ProbeLayout


def _core_steps(engine, **params):
    """Every step_core() of two requests, the plain one and one asking `params` of each token."""
    engine.add_request([3, 4, 5, 6, 7], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), "plain")
    engine.add_request([8, 9, 10], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, **params), "asks")
    steps = []
    while engine.has_unfinished():
        steps.append(engine.step_core())
    return steps


def test_plain_tokens_travel_as_columns_and_the_rest_whole():
    engine, _ = fake_engine(core_only=True, max_batch_size=4)
    steps = _core_steps(engine, logprobs=1)
    whole = {rid: [o for s in steps for o in s.outputs if o.request_id == rid] for rid in ("plain", "asks")}
    columns = [rid for s in steps for rid in s.request_ids]
    assert len(columns) == 4 and set(columns) == {"plain"}  # tokens 2-5 of 6: not the first, not the end
    assert [o.finish_reason for o in whole["plain"]] == [None, "length"] and whole["plain"][0].prompt_tokens == 5
    assert len(whole["asks"]) == 6  # a row asking logprobs is never plain (the fake runner reads back none)
    assert all(len(s.request_ids) == len(s.token_ids) for s in steps)


def test_step_outputs_count_tokens_through_the_columns():
    engine, _ = fake_engine(max_batch_size=4)
    engine.add_request([3, 4, 5, 6, 7], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True), "plain")
    outs = run_all(engine)["plain"]
    assert [o.completion_tokens for o in outs] == [1, 2, 3, 4, 5, 6]
    assert {o.prompt_tokens for o in outs} == {5} and [o.finished for o in outs] == [False] * 5 + [True]
    assert "".join(o.text_delta for o in outs) == "".join(f" t{o.token_id}" for o in outs)


class ProbedRunner(FakeRunner):
    """FakeRunner with two loaded probes whose scores are the row's index + 0.5 and ten times that."""

    def __init__(self, block_size: int) -> None:
        super().__init__(block_size)
        self.probes = SimpleNamespace(layout=ProbeLayout(probes=(), columns={"a": 0, "b": 1}, version=1))

    def sample(self, step, masks):  # type: ignore[no-untyped-def]
        done = super().sample(step, masks)
        result = done.result()
        if step.probes:
            rows = np.arange(len(result.token_ids), dtype=np.float32)[:, None] + 0.5
            result.probe_layout, result.probe_scores = self.probes.layout, np.hstack([rows, 10 * rows])
        return done


def test_probe_scores_ride_the_columns_beside_rows_without_them():
    engine = Engine(EngineConfig(max_seq_len=256, max_batch_size=4), ProbedRunner(4), KVCacheManager(64, 4),
                    FakeTokenizer())  # type: ignore[arg-type]
    params = SamplingParams(temperature=0, max_tokens=5, ignore_eos=True)
    engine.add_request([3, 4, 5], params, "plain")
    engine.add_request([6, 7, 8, 9], SamplingParams(temperature=0, max_tokens=5, ignore_eos=True, probes=["b"]),
                       "probed")
    columns, outs = [], []
    while engine.has_unfinished():
        step = engine.step_core()
        if step.probes:
            columns.append(dict(zip(step.request_ids, step.probes)))
        outs += engine.text.process_step(step)
    assert columns and all(c["plain"] is None and len(c["probed"]) == 1 for c in columns)
    probed = [o for o in outs if o.request_id == "probed"]
    assert len(probed) == 5 and all(set(o.probe_dict()) == {"b"} and o.probe_dict()["b"] % 5 == 0 for o in probed)
    assert all(o.probes is None for o in outs if o.request_id == "plain")
