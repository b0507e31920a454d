"""`infer serve` says where its start-up time goes: one line per phase, with seconds."""

from __future__ import annotations

import re

import pytest

from server_harness import serve_process

pytestmark = pytest.mark.slow

PHASES = ("core process up", "weights loaded", "tokenizer loaded", "KV cache allocated", "warm-up",
          "structured output prepared", "API server 0 up")


def test_each_start_up_phase_is_one_line_with_its_seconds():
    with serve_process("--max-seq-len", "512") as served:
        served.proc.terminate()
        served.proc.wait(timeout=60)
        out = served.output()
    for name in PHASES:
        assert re.search(rf"start-up: {name} in \d+\.\d\ds", out), (name, out)
    assert re.search(r"KV cache allocated in [\d.]+s \(\d+ blocks of 16 tokens, [\d.]+ GiB\)", out), out
