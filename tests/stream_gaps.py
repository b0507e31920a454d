"""Measure whether one request stalls another's stream: a background client streams a long completion and
records when each chunk arrives; the test sends its own request in between and compares the stream's largest gap
while that request ran against the stream's own median gap (a ratio, not a wall-clock threshold)."""

from __future__ import annotations

import json
import statistics
import threading
import time
from dataclasses import dataclass, field

import httpx


@dataclass
class StreamWatch:
    """A streamed completion read on a thread; `arrivals` are the monotonic times of its chunks."""

    base_url: str
    max_tokens: int
    arrivals: list[float] = field(default_factory=list)
    error: BaseException | None = None
    ended: bool = False  # the stream reached its end (the test's window must close before that)

    def __post_init__(self) -> None:
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> StreamWatch:
        self._thread.start()
        deadline = time.monotonic() + 60
        while len(self.arrivals) < 20:  # streaming at full speed before the test's request goes in
            assert self.error is None, self.error
            assert time.monotonic() < deadline, "the watched stream did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)

    def _read(self) -> None:
        body = {"prompt": "Once upon a time", "max_tokens": self.max_tokens, "stream": True, "ignore_eos": True,
                "temperature": 0}
        try:
            with httpx.stream("POST", f"{self.base_url}/v1/completions", json=body, timeout=300) as r:
                for line in r.iter_lines():
                    if self._stop.is_set():
                        return
                    if line.startswith("data: {"):
                        self.arrivals.append(time.monotonic())
                        json.loads(line[6:])
            self.ended = True
        except BaseException as exc:  # noqa: BLE001 - reported to the test through `error`
            self.error = exc

    def wait_for_chunks_after(self, t: float, count: int) -> float:
        """Wait until `count` chunks have arrived after time `t` (the stream went on after a request ended); the
        arrival time of the last of them."""
        deadline = time.monotonic() + 120
        while sum(a > t for a in self.arrivals) < count:
            assert self.error is None, self.error
            assert not self.ended, "the watched stream ended before the window closed: make it longer"
            assert time.monotonic() < deadline, f"fewer than {count} chunks arrived in 120 s after the request"
            time.sleep(0.01)
        return [a for a in self.arrivals if a > t][count - 1]

    def gaps_during(self, start: float, end: float) -> tuple[float, float, int]:
        """(the largest gap between chunks that overlaps [start, end], the stream's median gap, chunks in it)."""
        assert not self.ended or self.arrivals[-1] > end, "the watched stream ended inside the window: make it longer"
        times = list(self.arrivals)
        gaps = [(a, b) for a, b in zip(times, times[1:])]
        inside = [b - a for a, b in gaps if b >= start and a <= end]
        if times and times[-1] < end:  # nothing arrived since the last chunk: that wait counts too
            inside.append(end - times[-1])
        median = statistics.median(b - a for a, b in gaps)
        return max(inside), median, sum(start <= t <= end for t in times)
