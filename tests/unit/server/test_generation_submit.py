"""A Generation's requests: submitted all together, then sent to the core at once (not after the response is set
up), with text decoded per token only for a streamed response."""

from __future__ import annotations

from types import SimpleNamespace

from infer.sampling.params import SamplingParams
from infer.server.generation import Generation, expand


class Recorder:
    """What Generation uses of an engine client, recorded in call order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def submit(self, request_id: str, prompt: list[int], params: SamplingParams, probe_names: tuple[str, ...] = (),
               incremental_text: bool = True) -> SimpleNamespace:
        self.calls.append(("submit", incremental_text))
        return SimpleNamespace(request_id=request_id)

    def flush(self) -> None:
        self.calls.append(("flush",))

    def abort(self, request_id: str) -> None:
        self.calls.append(("abort",))


def test_every_choice_is_submitted_then_flushed_at_once():
    for stream in (False, True):
        engine = Recorder()
        jobs = expand([[1, 2, 3]], SamplingParams(max_tokens=4), 2)
        Generation(engine, jobs, "cmpl", stream=stream)  # type: ignore[arg-type]
        assert engine.calls == [("submit", stream), ("submit", stream), ("flush",)]
