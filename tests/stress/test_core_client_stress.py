"""Stress: hundreds of requests through the engine client and the core loop over ZMQ, with random arrivals,
aborts and preemption (the core loop on the fake runner, in a thread here instead of its own process).

Bounded in count and time. Checks no deadlock (everything ends within a timeout), exactly one
terminal output per request, the same tokens as an uncontended run, no starvation (the fairness
rule holds for every decoding sequence) and no leaked KV blocks.
"""

from __future__ import annotations

import asyncio
import os
import random
import tempfile
import threading

import pytest

from engine_fakes import VOCAB, FakeTokenizer, fake_engine, run_all
from infer.frontend.client import EngineClient
from infer.engine.core_loop import CoreLoop
from infer.wire import CoreInfo
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
                                 max_batch_size=12, max_waiting_requests=NUM_REQUESTS, core_only=True)
    address = f"ipc://{tempfile.mkdtemp()}/core.sock"
    core = CoreLoop(engine, address, read_probe_set=lambda: pytest.fail("no probe reload here"))
    info = CoreInfo(address, engine.config, None, "", FakeTokenizer(), VOCAB, None, 0.0, 0.0, os.getpid())  # type: ignore[arg-type]
    engine_client = EngineClient(info, FakeTokenizer(), NUM_REQUESTS)  # type: ignore[arg-type]

    async def client(rid: str, ids: list[int], params: SamplingParams, abort: bool, delay: float) -> tuple[str, list]:
        await asyncio.sleep(delay)
        outs = []
        async for out in engine_client.submit(rid, ids, params):
            outs.append(out)
            if abort and len(outs) == 2:
                break  # leaving the stream aborts the request
        return rid, outs

    async def main() -> dict[str, list]:
        await engine_client.start()
        try:
            rng = random.Random(2)
            tasks = [client(*w, delay=rng.random() * 0.05) for w in work]
            results = dict(await asyncio.wait_for(asyncio.gather(*tasks), timeout=120))
            for _ in range(200):  # aborts of left streams land at the core's next steps
                if await engine_client.call("idle"):
                    break
                await asyncio.sleep(0.05)
            assert await engine_client.call("audit_blocks") == {}
            return results
        finally:
            await engine_client.close()

    thread = threading.Thread(target=core.run)
    thread.start()
    try:
        results = asyncio.run(main())
    finally:
        core.stop()
        thread.join(timeout=10)
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
