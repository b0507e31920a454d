"""Response bodies and stream events are encoded by msgspec: what json.dumps took still encodes, and parses back."""

from __future__ import annotations

import json

import numpy as np
import pytest

from infer.server.responses import json_text, sse
from infer.server.responses_stream import sse_event


def test_a_chunk_parses_back_to_what_was_sent():
    chunk = {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": "m", "system_fingerprint": None,
             "choices": [{"index": 0, "text": "é\u2028\r\n\"\\", "logprobs": {"token_logprobs": [-0.25, -9999.0]},
                          "finish_reason": None}]}
    assert json.loads(json_text(chunk)) == chunk
    event = sse(chunk)
    assert event.startswith("data: ") and event.endswith("\n\n") and "\n" not in event[:-2]  # one SSE line
    assert sse("[DONE]") == "data: [DONE]\n\n"


def test_numpy_numbers_encode_as_json_numbers_and_nan_as_null():
    assert json.loads(json_text({"a": np.float64(1.5), "b": np.float32(0.25), "c": np.int64(7), "d": float("nan")})) \
        == {"a": 1.5, "b": 0.25, "c": 7, "d": None}


def test_what_json_cannot_hold_is_refused():
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        json_text({"a": object()})


def test_a_responses_event_names_its_type_on_its_own_line():
    event = sse_event({"type": "response.output_text.delta", "delta": "hi"})
    assert event.splitlines()[0] == "event: response.output_text.delta"
    assert json.loads(event.splitlines()[1].removeprefix("data: ")) == {"type": "response.output_text.delta",
                                                                         "delta": "hi"}
