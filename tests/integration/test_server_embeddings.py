"""POST /v1/embeddings through the openai client against `infer serve`'s app on a tiny Qwen 3: floats and base64 equal
LLM.embed, token-id inputs, `dimensions`, usage, and the errors that name their field."""

from __future__ import annotations

import base64
import struct

import httpx
import openai
import pytest

from checkpoints import save_tiny_with_tokenizer
from infer import LLM
from server_harness import MODEL, running_server

TEXTS = ["The cat sat on the mat.", "yes no maybe"]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = save_tiny_with_tokenizer("qwen3", tmp_path_factory.mktemp("qwen3"), seed=2)
    want = LLM(str(path), dtype="float32", max_seq_len=256).embed(TEXTS)
    with running_server(path, device="cpu", dtype="float32", max_seq_len=256, max_batch_size=8) as server:
        yield server, want


def test_floats_and_base64_equal_the_offline_embeddings(served):
    server, want = served
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    floats = client.embeddings.create(model=MODEL, input=TEXTS)
    assert [d.index for d in floats.data] == [0, 1]
    for got, expected in zip(floats.data, want):
        assert got.embedding == pytest.approx(expected, abs=1e-6)
    assert floats.usage.prompt_tokens == floats.usage.total_tokens > 0
    raw = httpx.post(f"{server.base_url}/v1/embeddings", json={"model": MODEL, "input": TEXTS[0],
                                                                "encoding_format": "base64"}).json()
    blob = base64.b64decode(raw["data"][0]["embedding"])
    assert list(struct.unpack(f"<{len(blob) // 4}f", blob)) == pytest.approx(want[0], abs=1e-6)
    sdk_base64 = client.embeddings.create(model=MODEL, input=TEXTS[0], encoding_format="base64")  # the SDK decodes
    assert len(sdk_base64.data) == 1


def test_token_ids_and_dimensions(served):
    server, want = served
    client = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)
    ids = server.state.built.tokenizer.encode(TEXTS[1])
    by_ids = client.embeddings.create(model=MODEL, input=[ids]).data[0].embedding
    assert by_ids == pytest.approx(want[1], abs=1e-6)
    cut = client.embeddings.create(model=MODEL, input=TEXTS[0], dimensions=8).data[0].embedding
    assert len(cut) == 8 and sum(v * v for v in cut) == pytest.approx(1.0, abs=1e-5)


@pytest.mark.parametrize("body, field", [
    ({"input": "x", "dimensions": 100000}, "dimensions"),
    ({"input": []}, "input"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
    ({"input": "x", "pooling": "mean"}, "pooling"),
])
def test_bad_requests_name_the_field(served, body, field):
    server, _ = served
    response = httpx.post(f"{server.base_url}/v1/embeddings", json={"model": MODEL, **body})
    assert 400 <= response.status_code < 500 and field in response.text
