"""Fixtures of the server tests: one real server per test module on the shared SmolLM2, and an openai client."""

from __future__ import annotations

import openai
import pytest

from server_harness import running_server


@pytest.fixture(scope="module")
def server(smollm2_llm):
    with running_server(smollm2_llm) as running:
        yield running


@pytest.fixture()
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)
