"""The decode table (persistent per-row decode state) equals a from-scratch rebuild from the requests and the KV
manager after any sequence of joins, leaves, preemptions, aborts and advances, and its steps compute the same
tokens as the per-request rows of speculation-free decoding did."""

from __future__ import annotations

import random

from hypothesis import given, settings, strategies as st

from engine_fakes import fake_engine
from infer.engine.request import RequestState
from infer.engine.scheduler import Scheduler
from infer.sampling.params import SamplingParams

OPTIONS = [{}, {"use_prefix_caching": True}, {"use_chunked_prefill": False}, {"max_batch_size": 3},
           {"batching_mode": "static", "max_batch_size": 4}, {"use_prefix_caching": True, "prefill_chunk_size": 5}]


def _check(scheduler: Scheduler) -> None:
    table = scheduler.table
    assert table is not None
    decoding = [r for r in scheduler.running if r.state is RequestState.DECODE]
    assert sorted(map(id, table.requests)) == sorted(map(id, decoding))
    for request in decoding:
        assert table.row_of(request) == table.rebuild(request, scheduler.kv), request.request_id


@settings(max_examples=80, deadline=None)
@given(work=st.lists(st.tuples(st.integers(1, 20), st.integers(1, 25)), min_size=1, max_size=9),
       num_blocks=st.integers(14, 48), options=st.sampled_from(OPTIONS),
       aborts=st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), max_size=4),
       shared_prefix=st.booleans())
def test_the_decode_table_equals_a_rebuild_after_every_step(work, num_blocks, options, aborts, shared_prefix):
    engine, _ = fake_engine(num_blocks=num_blocks, block_size=4, **options)
    rng = random.Random(len(work))
    head = [rng.randrange(1, 1000) for _ in range(8)] if shared_prefix else []
    ids = [engine.add_request(head + [rng.randrange(1, 1000) for _ in range(p)],
                              SamplingParams(temperature=1.0, max_tokens=g, ignore_eos=True, seed=i)).request_id
           for i, (p, g) in enumerate(work)]
    for step in range(2000):
        if not engine.has_unfinished():
            break
        for at, which in aborts:
            if at == step and which < len(ids):
                engine.abort(ids[which])
        engine.step()
        _check(engine.scheduler)
    assert not engine.has_unfinished()
    assert engine.scheduler.table is not None and len(engine.scheduler.table) == 0
    assert engine.kv.audit_blocks() == {}
