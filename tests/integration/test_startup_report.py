"""`infer serve` says where its start-up time goes: one line per phase, with seconds."""

from __future__ import annotations

import re

import pytest

from server_harness import serve_process

pytestmark = pytest.mark.slow

PHASES = ("core process up", "engine code imported", "weights loaded", "tokenizer loaded", "KV cache allocated",
          "warm-up", "structured output prepared", "API server 0 up")


def test_each_start_up_phase_is_one_line_with_its_seconds():
    with serve_process("--max-seq-len", "512") as served:
        served.proc.terminate()
        served.proc.wait(timeout=60)
        out = served.output()
    for name in PHASES:
        assert re.search(rf"start-up: {name} in \d+\.\d\ds", out), (name, out)
    assert re.search(r"KV cache allocated in [\d.]+s \(\d+ blocks of 16 tokens, [\d.]+ GiB\)", out), out


def test_an_hf_directory_s_tokenizer_is_read_by_a_child_while_the_core_starts(tmp_path):
    """The core starts a child reading the tokenizer before it imports torch (loader/tokenizer_prefetch.py) and
    takes the child's tokenizer; the server then answers with it."""
    import httpx

    from checkpoints import save_tiny_qwen3_chat

    path = save_tiny_qwen3_chat(tmp_path / "qwen3")
    with serve_process("--model", str(path), "--max-seq-len", "256") as served:
        reply = httpx.post(f"{served.base_url}/tokenize", json={"prompt": "hello world"}, timeout=60)
        served.proc.terminate()
        served.proc.wait(timeout=60)
        out = served.output()
    assert reply.status_code == 200 and reply.json()["tokens"], reply.text
    assert re.search(r"start-up: tokenizer loaded in \d+\.\d\ds \(read meanwhile by a child process\)", out), out
