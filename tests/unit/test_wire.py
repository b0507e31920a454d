"""The messages between the API server and the engine core survive msgpack unchanged, and serving metrics from
several API servers add up."""

from __future__ import annotations

import math

from infer import wire as m
from infer.frontend.metrics import ServingMetrics
from infer.frontend.outputs import StepOutput
from infer.sampling.logprobs import TokenLogprob
from infer.sampling.params import ProbeStop, SamplingParams
from infer.structured.constraint import Constraint


def test_a_request_round_trips_with_every_sampling_field():
    params = SamplingParams(temperature=0.5, top_p=0.9, top_k=7, repetition_penalty=1.1, max_tokens=9, stop=["\n"],
                            seed=3, ignore_eos=True, logprobs=2, prompt_logprobs=1,
                            structured=Constraint.json_schema({"type": "object"}), probes=["a"], probe_prompt=True,
                            probe_stop=ProbeStop("a", above=0.5))
    msg = m.Add([m.CoreRequest("r-1", [1, 2, 3], params)])
    assert m.decode_to_core(m.encode(msg)) == msg


def test_outputs_round_trip_with_logprobs_and_probe_scores():
    lp = TokenLogprob(5, -0.25, [(5, -0.25), (6, -1.5)])
    out = m.CoreOutput("r", 5, "length", completion_tokens=3, logprob=lp, prompt_logprobs=[None, lp],
                       probes=[0.5, math.nan], prompt_probes={"a": [None, 0.25]}, queue_seconds=0.01)
    step = m.CoreStep(["p", "q"], [11, 12], [[0.25], None], [out])
    back = m.decode_from_core(m.encode(m.Outputs(m.CoreOutputs(step, 2, 7))))
    assert isinstance(back, m.Outputs) and back.step.num_waiting == 2 and back.step.num_running == 7
    assert back.step.emitted.request_ids == ["p", "q"] and back.step.emitted.token_ids == [11, 12]
    assert back.step.emitted.probes == [[0.25], None]
    got = back.step.emitted.outputs[0]
    assert got.logprob == lp and got.prompt_logprobs == [None, lp] and got.finished
    assert got.probes[0] == 0.5 and math.isnan(got.probes[1]) and got.prompt_probes == {"a": [None, 0.25]}
    for msg in (m.Abort(["a", "b"], "stop"), m.Call(1, "metrics", [{"x": 1}]), m.Heartbeat({"x": 1})):
        assert m.decode_to_core(m.encode(msg)) == msg


def test_metrics_of_several_servers_add_up():
    a, b = ServingMetrics(), ServingMetrics()
    a.observe(StepOutput("r", 1, "x", False), now=1.0, submitted=0.5, last_token=None)
    b.observe(StepOutput("s", 2, "y", True, "stop", prompt_tokens=4), now=2.0, submitted=1.0, last_token=1.9)
    total = ServingMetrics.merged([a.snapshot(), b.snapshot(), {}])
    assert total.generation_tokens == 2 and total.prompt_tokens == 4 and total.finished == {"stop": 1}
    assert total.ttft.count == 1 and total.itl.count == 1 and total.e2e.count == 1
    assert math.isclose(total.ttft.total, 0.5) and math.isclose(total.itl.total, 0.1)
