"""The overlapped step loop: step N+1 launches before N's tokens are read, with the same tokens as without."""

from __future__ import annotations

from engine_fakes import fake_engine, run_all

from infer import SamplingParams


def _tokens(outputs: dict[str, list]) -> dict[str, list[int]]:
    return {rid: [o.token_id for o in outs if o.token_id is not None] for rid, outs in outputs.items()}


def _run(penalty: float, n: int = 4, max_tokens: int = 12, **options: object):
    engine, runner = fake_engine(**options)
    for i in range(n):
        engine.add_request([1 + i, 2, 3], SamplingParams(max_tokens=max_tokens + i, repetition_penalty=penalty,
                                                         ignore_eos=True), f"r{i}")
    outputs = run_all(engine)
    assert engine.kv.audit_blocks() == {}
    return engine, runner, outputs


def test_decode_steps_take_their_tokens_from_the_previous_step_on_the_device():
    _, runner, _ = _run(1.0)
    fed = [rows for rows in runner.prev_rows if any(r >= 0 for r in rows)]
    assert fed, "no step was launched before its predecessor was read"


def test_overlap_gives_the_same_tokens_and_steps_as_the_synchronous_loop():
    # a repetition penalty needs host-side history, which turns overlap off (the fake runner ignores it)
    _, fast_runner, fast = _run(1.0)
    _, slow_runner, slow = _run(1.01)
    assert not any(r >= 0 for rows in slow_runner.prev_rows for r in rows)
    assert _tokens(fast) == _tokens(slow)
    assert fast_runner.log == slow_runner.log  # max_tokens is known ahead: no wasted step


def test_each_request_finishes_once_with_its_budget():
    _, _, outputs = _run(1.0, n=5, max_tokens=7)
    for i in range(5):
        outs = outputs[f"r{i}"]
        assert sum(o.finished for o in outs) == 1 and outs[-1].finished
        assert len([o for o in outs if o.token_id is not None]) == 7 + i


def test_overlap_under_preemption_keeps_tokens_and_frees_every_block():
    _, _, roomy = _run(1.0, n=6, max_tokens=20, num_blocks=64)
    engine, _, tight = _run(1.0, n=6, max_tokens=20, num_blocks=14)
    assert engine.scheduler.num_preemptions > 0
    assert _tokens(tight) == _tokens(roomy)


def test_a_stop_found_late_drops_the_in_flight_token():
    engine, runner = fake_engine()
    free = engine.add_request([5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True), "free")
    run_all(engine)
    stop_after = free.output_token_ids[4]  # end the same request at its 5th token through a stop string
    engine2, runner2 = fake_engine()
    engine2.add_request([5, 6, 7], SamplingParams(max_tokens=30, ignore_eos=True, stop=[f" t{stop_after}"]), "cut")
    outs = run_all(engine2)["cut"]
    assert outs[-1].finished and outs[-1].finish_reason == "stop"
    assert [o.token_id for o in outs] == free.output_token_ids[:5]
    assert engine2.kv.audit_blocks() == {}
    assert len(runner2.log) == 6  # prefill, 4 decodes, and one decode launched before the stop was seen


def test_a_short_request_ending_leaves_a_long_one_unchanged():
    engine, _ = fake_engine()
    a = engine.add_request([9, 9], SamplingParams(max_tokens=40, ignore_eos=True), "a")
    run_all(engine)
    engine2, _ = fake_engine()
    engine2.add_request([9, 9], SamplingParams(max_tokens=40, ignore_eos=True), "a")
    engine2.add_request([1, 2], SamplingParams(max_tokens=3, ignore_eos=True), "b")
    outputs = run_all(engine2)
    assert _tokens(outputs)["a"] == a.output_token_ids
    assert len(_tokens(outputs)["b"]) == 3


def test_prev_rows_equal_a_lookup_by_request(monkeypatch):
    """Unchanged decode-table rows map row to row without a lookup; every step's answer equals finding each row's
    request in the in-flight step (a pending token: its row there; none: -1)."""
    from infer.engine.overlap import InFlight

    original, checked = InFlight.prev_rows, []

    def checking(self, batch):
        got = original(self, batch)
        if self.step is not None:
            where = {id(r): i for i, r in enumerate(self.step[0].requests)}
            want = [where[id(r)] if r.pending_tokens else -1 for r in batch.requests]
            assert got == (want if any(i >= 0 for i in want) else None)
            checked.append(got)
        return got

    monkeypatch.setattr(InFlight, "prev_rows", checking)
    _run(1.0, n=6, max_tokens=10)
    assert any(rows and rows == list(range(len(rows))) for rows in checked)
