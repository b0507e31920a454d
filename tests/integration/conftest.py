"""Fixtures of the server tests: one real server per test module on the shared SmolLM2, and an openai client.

Imports are inside the fixtures: the GPU image runs some tests of this folder without the server stack.
"""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    from server_harness import running_server

    with running_server(smollm2_gguf, max_seq_len=1024) as running:
        yield running


@pytest.fixture()
def client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
