"""RequestStream.whole(): a request's outputs all at once when it ends (the same outputs iteration gives), nothing
before; a reader that leaves early aborts the request, and its later outputs change nothing."""

from __future__ import annotations

import asyncio
import os

from engine_fakes import VOCAB, FakeTokenizer
from infer import wire as m
from infer.engine.config import EngineConfig
from infer.frontend.client import EngineClient
from infer.sampling.params import SamplingParams

PARAMS = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def _client() -> tuple[EngineClient, list[object]]:
    """An EngineClient whose messages to the core are kept in a list instead of sent (no socket, no core)."""
    info = m.CoreInfo("ipc://unused", EngineConfig(device="cpu"), None, "", FakeTokenizer(), VOCAB, None,  # type: ignore[arg-type]
                      0.0, 0.0, os.getpid())
    client = EngineClient(info, FakeTokenizer(), 8)  # type: ignore[arg-type]
    client._loop = asyncio.get_running_loop()
    sent: list[object] = []
    client._send = sent.append  # type: ignore[method-assign]
    return client, sent


def _step(request_id: str, token: int, finish: str | None = None) -> m.CoreOutputs:
    if finish is None:
        return m.CoreOutputs(m.CoreStep([request_id], [token]), 0, 1)
    end = m.CoreOutput(request_id, token, finish, prompt_tokens=2, completion_tokens=3)
    return m.CoreOutputs(m.CoreStep(outputs=[end]), 0, 0)


async def _until_done(task: asyncio.Task, steps: int = 10) -> None:
    for _ in range(steps):
        await asyncio.sleep(0)
    assert task.done()


def test_whole_returns_every_output_once_the_request_ends():
    async def main() -> None:
        client, _ = _client()
        stream = client.submit("a", [1, 2], PARAMS, incremental_text=False)
        whole = asyncio.create_task(stream.whole())
        client._deliver(_step("a", 5))
        client._deliver(_step("a", 6))
        for _ in range(5):
            await asyncio.sleep(0)
        assert not whole.done()  # nothing until the end
        client._deliver(_step("a", 7, "length"))
        await _until_done(whole)
        outputs = whole.result()
        assert [o.token_id for o in outputs] == [5, 6, 7]
        assert [o.finished for o in outputs] == [False, False, True]
        assert outputs[-1].text_delta == " t5 t6 t7" and outputs[-1].finish_reason == "length"
        assert stream.finished and client.num_live == 0

    asyncio.run(main())


def test_whole_after_the_end_returns_at_once():
    async def main() -> None:
        client, _ = _client()
        stream = client.submit("a", [1, 2], PARAMS)
        for token, finish in ((5, None), (6, None), (7, "length")):
            client._deliver(_step("a", token, finish))
        outputs = await asyncio.wait_for(stream.whole(), 1)
        assert "".join(o.text_delta for o in outputs) == " t5 t6 t7"

    asyncio.run(main())


def test_a_reader_that_leaves_aborts_and_later_outputs_are_harmless():
    async def main() -> None:
        client, sent = _client()
        stream = client.submit("a", [1, 2], PARAMS)
        whole = asyncio.create_task(stream.whole())
        client._deliver(_step("a", 5))
        await asyncio.sleep(0)
        whole.cancel()
        await asyncio.gather(whole, return_exceptions=True)
        client.flush()
        assert any(isinstance(msg, m.Abort) and msg.request_ids == ["a"] for msg in sent)
        client._deliver(m.CoreOutputs(m.CoreStep(outputs=[m.CoreOutput("a", None, "abort")]), 0, 0))
        assert client.num_live == 0

    asyncio.run(main())
