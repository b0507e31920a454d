"""A real server started with an API key and a browser origin: every /v1 route (as the app lists them) is a 401
without the key and served with it, /health, /metrics and /version stay open, the openai client authenticates,
a browser's preflight works, and a foreign Host name is refused."""

from __future__ import annotations

from importlib.metadata import version

import httpx
import openai
import pytest
from starlette.routing import Route

from server_harness import MODEL, running_server

from infer.server.access import AccessPolicy
from infer.server.app import create_app
from infer.server.limits import ServerLimits

pytestmark = pytest.mark.slow

KEY = "test-key-4f1d"
UI = "http://ui.example:3000"
AUTH = {"authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def guarded(smollm2_gguf):
    access = AccessPolicy(api_key=KEY, allowed_origins=(UI,))
    with running_server(smollm2_gguf, max_seq_len=256, limits=ServerLimits(access=access)) as running:
        yield running


def _routes(routes: list) -> list[tuple[str, str]]:
    """(method, path) of every route, path parameters filled in; an included router's routes too (FastAPI keeps
    them behind one entry that holds the original router)."""
    out = []
    for route in routes:
        if isinstance(route, Route):
            path = route.path_format.replace("{model_id}", MODEL)
            out += [(method, path) for method in sorted(route.methods or ()) if method != "HEAD"]
        elif hasattr(route, "original_router"):
            out += _routes(route.original_router.routes)
    return out


def test_every_v1_route_needs_the_key(guarded):
    v1 = [(m, p) for m, p in _routes(create_app(guarded.state).routes) if p.startswith("/v1/")]
    assert {"/v1/completions", "/v1/chat/completions", "/v1/models"} <= {p for _, p in v1}
    with httpx.Client(base_url=guarded.base_url, timeout=60) as http:
        for method, path in v1:
            body = {"json": {}} if method == "POST" else {}
            without = http.request(method, path, **body)
            assert without.status_code == 401, (method, path, without.text)
            assert without.json()["error"]["code"] == "invalid_api_key"
            wrong = http.request(method, path, headers={"authorization": "Bearer nope"}, **body)
            assert wrong.status_code == 401 and "Incorrect" in wrong.json()["error"]["message"]
            assert http.request(method, path, headers=AUTH, **body).status_code != 401, (method, path)


def test_health_metrics_and_version_stay_open(guarded):
    assert httpx.get(f"{guarded.base_url}/health").status_code == 200
    assert "infer:num_requests_running" in httpx.get(f"{guarded.base_url}/metrics").text
    assert httpx.get(f"{guarded.base_url}/version").json() == {"version": version("infer")}
    for path in ("/tokenize", "/openapi.json", "/no/such/route"):
        assert httpx.get(f"{guarded.base_url}{path}").status_code == 401


def test_the_openai_client_authenticates_with_the_key(guarded):
    client = openai.OpenAI(base_url=f"{guarded.base_url}/v1", api_key=KEY, max_retries=0)
    assert client.completions.create(model=MODEL, prompt="Hi", max_tokens=2, temperature=0).choices[0].text is not None
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{guarded.base_url}/v1", api_key="wrong", max_retries=0).models.list()


def test_a_browser_on_the_allowed_origin_can_call(guarded):
    preflight = httpx.options(f"{guarded.base_url}/v1/chat/completions", headers={
        "origin": UI, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == UI
    answer = httpx.post(f"{guarded.base_url}/v1/chat/completions", headers={"origin": UI, **AUTH}, timeout=60,
                        json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == UI


def test_a_foreign_host_name_is_refused(guarded):
    port = guarded.base_url.rsplit(":", 1)[1]
    refused = httpx.get(f"{guarded.base_url}/health", headers={"host": f"rebound.example:{port}"})
    assert refused.status_code == 421 and "rebound.example" in refused.json()["error"]["message"]
    for host in (f"localhost:{port}", f"127.0.0.1:{port}"):
        assert httpx.get(f"{guarded.base_url}/health", headers={"host": host}).status_code == 200
