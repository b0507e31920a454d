"""Fuzz the running server over its own OpenAPI document (schemathesis): no input gets a 5xx,
every status and content type is one the document declares, and the server is healthy after.

Schema-valid bodies (positive) and schema-breaking ones (negative) are generated for every
operation; schemathesis' pytest plugin does not load under pytest 9, so the strategies are driven
with hypothesis directly.
"""

from __future__ import annotations

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, status_code_conformance

from server_harness import running_server

pytestmark = pytest.mark.slow

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance]
EXAMPLES = 40  # per operation and mode: about 550 requests in all


@pytest.fixture(scope="module")
def fuzz_server(smollm2_gguf):
    """A short context keeps every generation the fuzzer asks for under a second or two."""

    with running_server(smollm2_gguf, max_seq_len=32, max_batch_size=16) as running:
        yield running


def _operations(base_url: str) -> list:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    return [result.ok() for result in schema.get_all_operations()]


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_input_gets_a_server_error(fuzz_server, mode):
    operations = _operations(fuzz_server.base_url)
    assert len(operations) >= 9
    if mode is GenerationMode.NEGATIVE:  # only a JSON body can break its schema (any path segment is a string)
        operations = [op for op in operations if op.body]
    for operation in operations:
        @settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck))
        @given(case=operation.as_strategy(generation_mode=mode))
        def call(case) -> None:
            case.call_and_validate(base_url=fuzz_server.base_url, checks=CHECKS, timeout=60)

        call()


def test_server_is_healthy_and_clean_after_fuzzing(fuzz_server):
    fuzz_server.wait_idle()
    assert httpx.get(f"{fuzz_server.base_url}/health").status_code == 200
    assert fuzz_server.audit_blocks() == {}
