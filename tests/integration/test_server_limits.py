"""What a careless or hostile client gets from the real server: a body over the size cap is a 413 before a byte of
it is sent, a stalled body a 408, stalled headers a closed connection; constraints no output can satisfy and
constraints past llguidance's limits are 400s naming the field; a 20,000-way guided_choice is served;
continuous_usage_stats puts the usage on every chunk; /openapi.json describes the SSE events as objects."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from server_harness import running_server

pytestmark = pytest.mark.slow

BODY_LIMIT_MB = 4
STALL_S = 1.0  # header and body timeouts: short, so the tests that wait for them finish quickly
DEADLINE_S = 2.5  # the whole body's


@pytest.fixture(scope="module")
def server(smollm2_gguf):
    from infer.server.limits import ServerLimits

    limits = ServerLimits(max_request_body_mb=BODY_LIMIT_MB, header_timeout_s=STALL_S, body_timeout_s=STALL_S,
                          body_deadline_s=DEADLINE_S)
    with running_server(smollm2_gguf, max_seq_len=512, limits=limits) as running:
        yield running


def _raw(base_url: str, data: bytes) -> bytes:
    """Send `data` on a fresh connection and read until the server closes it."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(data)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


def _headers(length: int) -> bytes:
    return (f"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode()


def test_a_body_over_the_limit_is_413_before_any_of_it_is_sent(server):
    reply = _raw(server.base_url, _headers(30_000_000))  # the headers only: the server answers without the body
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413"), reply[:300]
    err = json.loads(body)["error"]
    assert err["param"] == "body" and "--max-request-body-mb" in err["message"] and "28.6 MiB" in err["message"]


def test_a_chunked_body_is_cut_off_where_it_passes_the_limit(server):
    def chunks():
        yield b'{"prompt": "'
        for _ in range(3 * BODY_LIMIT_MB * 16):
            yield b"a" * 65536

    r = httpx.post(f"{server.base_url}/v1/completions", content=chunks(), headers={"content-type": "application/json"},
                   timeout=60)
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"


def test_a_stalled_body_is_408(server):
    reply = _raw(server.base_url, _headers(100) + b'{"prompt": ')  # 11 of 100 bytes, then nothing
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:300]
    assert "--body-timeout-s" in json.loads(body)["error"]["message"]


def test_a_trickled_body_is_408_at_the_whole_body_deadline(server):
    """One byte every 0.2 s never stalls for --body-timeout-s, yet the body's time runs out and the connection
    closes (the rest of the body is never waited for)."""
    host, port = server.base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=0.2) as sock:
        sock.sendall(_headers(1000))
        start, reply = time.monotonic(), b""
        while time.monotonic() - start < 10:
            try:
                sock.sendall(b" ")
                chunk = sock.recv(65536)
            except TimeoutError:
                continue
            except OSError:  # the server closed while we sent
                break
            if not chunk:
                break
            reply += chunk
        elapsed = time.monotonic() - start
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), reply[:300]
    assert "--body-deadline-s" in json.loads(body)["error"]["message"]
    assert DEADLINE_S <= elapsed < DEADLINE_S + 3


def test_stalled_headers_close_the_connection(server):
    assert _raw(server.base_url, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n") == b""  # no blank line: unfinished
    assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(("field", "value"), [
    ("guided_regex", "[^\\s\\S]"),
    ("guided_json", {"$ref": "#"}),
    ("guided_grammar", "start: start"),
])
def test_a_constraint_no_output_can_satisfy_is_a_400_naming_the_field(server, field, value):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 4, field: value}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field and "no output can satisfy it" in err["message"]


def test_a_20000_way_guided_choice_is_served_and_a_larger_one_refused_as_a_limit(server):
    choices = [f"option {i}" for i in range(20_000)]
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Pick one:", "max_tokens": 8, "temperature": 0,
                                                               "guided_choice": choices}, timeout=120)
    assert r.status_code == 200, r.text[:500]
    assert r.json()["choices"][0]["text"] in choices
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Pick one:", "max_tokens": 8,
                                                               "guided_choice": [f"w{i}" for i in range(200_000)]},
                   timeout=120)
    assert r.status_code == 400, r.text[:500]
    err = r.json()["error"]
    assert err["param"] == "guided_choice" and "beyond llguidance's limits" in err["message"], err


@pytest.mark.parametrize("route", ["completions", "chat/completions"])
def test_continuous_usage_stats_puts_the_usage_on_every_chunk(server, route):
    body = {"max_tokens": 6, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            **({"prompt": "Hi"} if route == "completions" else {"messages": [{"role": "user", "content": "Hi"}]})}
    with httpx.stream("POST", f"{server.base_url}/v1/{route}", json=body, timeout=60) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    usages = [c["usage"] for c in chunks]
    assert all(u is not None for u in usages)
    completion = [u["completion_tokens"] for u in usages]
    assert completion == sorted(completion) and completion[-1] == 6
    assert {u["prompt_tokens"] for u in usages} == {usages[-1]["prompt_tokens"]}
    assert all(u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] for u in usages)


def test_openapi_describes_server_sent_events_as_objects(server):
    doc = httpx.get(f"{server.base_url}/openapi.json", timeout=10).json()
    for path in ("/v1/completions", "/v1/chat/completions"):
        content = doc["paths"][path]["post"]["responses"]["200"]["content"]
        schema = content["text/event-stream"]["schema"]
        assert schema["type"] == "object" and schema["required"] == ["data"], schema
        assert {"413", "408"} <= set(doc["paths"][path]["post"]["responses"])


CAP = 8


@pytest.fixture(scope="module")
def capped(smollm2_gguf):
    from infer.server.limits import ServerLimits

    with running_server(smollm2_gguf, max_seq_len=512, limits=ServerLimits(max_connections=CAP)) as running:
        yield running


def _open(base_url: str, data: bytes) -> socket.socket:
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(data)
    return sock


def test_trickling_connections_past_the_cap_never_lock_others_out(capped):
    """Four times the cap in connections that send half their headers: each new connection replaces the oldest,
    and /health and a completion still answer at once."""
    socks = [_open(capped.base_url, b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n") for _ in range(4 * CAP)]
    try:
        start = time.monotonic()
        assert httpx.get(f"{capped.base_url}/health", timeout=5).status_code == 200
        r = httpx.post(f"{capped.base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=5)
        assert r.status_code == 200 and time.monotonic() - start < 5
    finally:
        for sock in socks:
            sock.close()


def test_past_the_cap_with_every_connection_serving_a_new_one_is_refused_with_503(capped):
    body = json.dumps({"prompt": "Once", "max_tokens": 400, "ignore_eos": True, "stream": True}).encode()
    request = _headers(len(body)) + body
    socks = [_open(capped.base_url, request) for _ in range(CAP)]
    try:
        for sock in socks:
            assert sock.recv(64).startswith(b"HTTP/1.1 200")  # streaming: each connection is serving
        r = httpx.get(f"{capped.base_url}/health", timeout=5)
        assert r.status_code == 503 and "--max-connections" in r.json()["error"]["message"]
    finally:
        for sock in socks:
            sock.close()
    capped.wait_idle()
    assert httpx.get(f"{capped.base_url}/health", timeout=5).status_code == 200
