"""Readback on CUDA: the copies run on their own stream, after the work queued before them, and read what was sampled
even when the main stream has moved on and reused the memory."""

from __future__ import annotations

import pytest
import torch

from infer.transfer import Readback

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_readback_waits_for_the_step_and_keeps_its_source():
    device = torch.device("cuda")
    readback = Readback(device, 8, (2, 3))
    torch.cuda._sleep(20_000_000)  # the step's work, still running when the copies are queued
    ids = torch.arange(5, device=device) * 7
    scores = torch.full((2, 3), 1.5, device=device)
    readback.start(ids, scores)
    del ids, scores  # the next step's allocations may take this memory once the copies are done, not before
    for _ in range(4):
        torch.full((5,), -1, dtype=torch.int64, device=device)
        torch.zeros((2, 3), device=device)
    assert torch.cuda.current_stream() != readback.stream
    assert readback.read() == [0, 7, 14, 21, 28]
    got = readback.read_scores()
    assert got is not None and got.tolist() == [[1.5] * 3] * 2


def test_main_stream_work_after_start_does_not_wait_for_the_copies():
    """The main stream's next work is ordered after the sampling, not after the read-back copies."""
    device = torch.device("cuda")
    readback = Readback(device, 4)
    readback.start(torch.ones(4, dtype=torch.int64, device=device))
    assert readback.stream is not None
    with torch.cuda.stream(readback.stream):
        torch.cuda._sleep(50_000_000)  # a slow copy stream
    after = torch.cuda.Event()
    torch.full((4,), 3, device=device)
    after.record()
    after.synchronize()
    assert not readback.stream.query()  # the main stream finished while the copy stream still runs
    assert readback.read() == [1, 1, 1, 1]
