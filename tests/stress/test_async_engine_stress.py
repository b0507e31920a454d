"""Stress: hundreds of requests through the AsyncEngine thread with random arrivals, aborts and preemption.

Bounded in count and time. Checks no deadlock (everything ends within a timeout), exactly one
terminal output per request, the same tokens as an uncontended run, no starvation (the fairness
rule holds for every decoding sequence) and no leaked KV blocks.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from engine_fakes import fake_engine, run_all
from infer.engine.async_engine import AsyncEngine
from infer.runners.step import StepKind
from infer.sampling.params import SamplingParams

NUM_REQUESTS = 200
FAIRNESS = 4


def _work(seed: int) -> list[tuple[str, list[int], SamplingParams, bool]]:
    rng = random.Random(seed)
    return [
        (f"r{i}", [rng.randrange(1, 1000) for _ in range(rng.randint(1, 40))],
         SamplingParams(temperature=1.0, seed=i, max_tokens=rng.randint(1, 24), ignore_eos=True), rng.random() < 0.1)
        for i in range(NUM_REQUESTS)
    ]


@pytest.mark.parametrize("policy", ["fcfs", "prefill_first", "decode_round_robin"])
def test_random_load_finishes_fairly_with_the_same_tokens(policy: str):
    work = _work(1)
    reference, _ = fake_engine(num_blocks=4096, max_seq_len=64)
    for rid, ids, params, _ in work:
        reference.add_request(ids, params, request_id=rid)
    expected = {rid: [o.token_id for o in outs if o.token_id is not None] for rid, outs in run_all(reference).items()}

    engine, runner = fake_engine(num_blocks=24, max_seq_len=64, scheduler_policy=policy, fairness_steps=FAIRNESS,
                                 max_batch_size=12, max_waiting_requests=NUM_REQUESTS)
    async_engine = AsyncEngine(engine, NUM_REQUESTS)

    async def client(rid: str, ids: list[int], params: SamplingParams, abort: bool, delay: float) -> tuple[str, list]:
        await asyncio.sleep(delay)
        outs = []
        async for out in async_engine.submit(rid, ids, params):
            outs.append(out)
            if abort and len(outs) == 2:
                break  # leaving the stream aborts the request
        return rid, outs

    async def main() -> dict[str, list]:
        rng = random.Random(2)
        tasks = [client(*w, delay=rng.random() * 0.05) for w in work]
        return dict(await asyncio.wait_for(asyncio.gather(*tasks), timeout=120))

    async_engine.start()
    try:
        results = asyncio.run(main())
        deadline = 200
        while engine.has_unfinished() and deadline:  # aborts of left streams land at the next steps
            deadline -= 1
            asyncio.run(asyncio.sleep(0.05))
    finally:
        async_engine.shutdown()
    assert engine.kv.audit_blocks() == {} and not engine.has_unfinished()
    for rid, ids, params, abort in work:
        outs = results[rid]
        tokens = [o.token_id for o in outs if o.token_id is not None]
        if abort and len(outs) == 2:
            assert tokens == expected[rid][: len(tokens)]
            continue
        assert sum(o.finished for o in outs) == 1 and outs[-1].finished and outs[-1].finish_reason == "length"
        assert tokens == expected[rid]
    assert engine.scheduler.num_preemptions > 0
    _assert_fair(runner.served)


def _assert_fair(served: list[tuple[StepKind, list[int]]]) -> None:
    """A running request's consecutive decode services are at most FAIRNESS steps apart."""
    last: dict[int, int] = {}
    for step, (kind, seeds) in enumerate(served):
        for seed in seeds:
            if kind is StepKind.DECODE and seed in last:
                assert step - last[seed] <= FAIRNESS, f"request seed={seed} waited {step - last[seed]} steps"
            last[seed] = step
