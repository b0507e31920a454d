"""The access policy on a bare app: Host names on a loopback bind (DNS rebinding), the API key (constant-time,
open paths), CORS preflights and headers, and every refusal in OpenAI's error shape."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from infer.server.access import AccessPolicy, host_name, is_loopback
from infer.server.access_middleware import install_access

UI = "http://ui.example:3000"


def _client(policy: AccessPolicy, base_url: str = "http://localhost:8000") -> TestClient:
    app = FastAPI()

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/chat/completions")
    async def chat() -> dict[str, str]:
        return {"object": "chat.completion"}

    install_access(app, policy)
    return TestClient(app, base_url=base_url)


def _error(response, status: int) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    return error


@pytest.mark.parametrize(("host", "name", "loopback"), [
    ("localhost:8000", "localhost", True), ("LOCALHOST", "localhost", True), ("127.0.0.1:80", "127.0.0.1", True),
    ("127.8.9.10", "127.8.9.10", True), ("[::1]:8000", "::1", True), ("::1", "::1", True),
    ("0.0.0.0", "0.0.0.0", False), ("evil.example:8000", "evil.example", False), ("192.168.1.5", "192.168.1.5", False),
    ("localhost.evil.example", "localhost.evil.example", False), ("[::]", "::", False),
])
def test_host_names_and_loopback(host, name, loopback):
    assert host_name(host) == name and is_loopback(host) is loopback


@pytest.mark.parametrize("host", ["localhost:8000", "127.0.0.1:8000", "[::1]:8000", "localhost"])
def test_a_loopback_bind_serves_loopback_host_names(host):
    assert _client(AccessPolicy()).get("/health", headers={"host": host}).status_code == 200


@pytest.mark.parametrize("host", ["evil.example:8000", "evil.example", "192.168.1.5:8000", "0.0.0.0:8000"])
def test_a_loopback_bind_refuses_other_host_names_as_dns_rebinding_would_send_them(host):
    error = _error(_client(AccessPolicy()).get("/health", headers={"host": host}), 421)
    assert host in error["message"] and error["param"] == "Host" and error["code"] == "invalid_host"


def test_allowed_hosts_add_names_and_star_turns_the_check_off():
    named = _client(AccessPolicy(allowed_hosts=("My-Box.lan:8000",)))
    assert named.get("/health", headers={"host": "my-box.lan:9999"}).status_code == 200
    assert named.get("/health", headers={"host": "localhost"}).status_code == 200
    _error(named.get("/health", headers={"host": "other.lan"}), 421)
    assert _client(AccessPolicy(allowed_hosts=("*",))).get("/health", headers={"host": "any.example"}).status_code == 200


def test_a_public_bind_checks_host_names_only_when_allowed_hosts_are_given():
    assert _client(AccessPolicy(bind_host="0.0.0.0")).get("/health", headers={"host": "10.0.0.7:8000"}).status_code == 200
    limited = _client(AccessPolicy(bind_host="0.0.0.0", allowed_hosts=("api.example",)))
    assert limited.get("/health", headers={"host": "api.example"}).status_code == 200
    _error(limited.get("/health", headers={"host": "10.0.0.7:8000"}), 421)


def test_the_api_key_guards_every_route_but_the_open_ones():
    client = _client(AccessPolicy(api_key="s3cret"))
    assert client.get("/health").status_code == 200  # open
    missing = client.post("/v1/chat/completions")
    error = _error(missing, 401)
    assert error["code"] == "invalid_api_key" and "Authorization: Bearer" in error["message"]
    assert missing.headers["www-authenticate"] == "Bearer"
    for wrong in ("Bearer s3cre", "Bearer s3cret2", "Basic s3cret", "s3cret", "Bearer "):
        assert "Incorrect" in _error(client.post("/v1/chat/completions", headers={"authorization": wrong}), 401)["message"]
    for right in ("Bearer s3cret", "bearer s3cret", "Bearer  s3cret "):
        assert client.post("/v1/chat/completions", headers={"authorization": right}).status_code == 200
    _error(client.get("/v1/no/such/route"), 401)  # which routes exist is not told without the key
    assert client.get("/v1/no/such/route", headers={"authorization": "Bearer s3cret"}).status_code == 404


def test_the_key_is_compared_in_constant_time(monkeypatch):
    import hmac

    compared = []
    monkeypatch.setattr(hmac, "compare_digest", lambda a, b: compared.append((a, b)) or a == b)
    _client(AccessPolicy(api_key="s3cret")).post("/v1/chat/completions", headers={"authorization": "Bearer nope"})
    assert compared == [(b"nope", b"s3cret")]


def test_without_allowed_origins_a_browser_preflight_is_not_granted():
    response = _client(AccessPolicy()).options("/v1/chat/completions", headers={
        "origin": UI, "access-control-request-method": "POST"})
    assert response.status_code == 405 and "access-control-allow-origin" not in response.headers


def test_a_cors_preflight_is_answered_before_the_key_and_grants_the_origin():
    client = _client(AccessPolicy(api_key="s3cret", allowed_origins=(UI,)))
    preflight = client.options("/v1/chat/completions", headers={
        "origin": UI, "access-control-request-method": "POST",
        "access-control-request-headers": "authorization, content-type"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == UI
    assert "authorization" in preflight.headers["access-control-allow-headers"]
    refused = _client(AccessPolicy(allowed_origins=(UI,))).options("/v1/chat/completions", headers={
        "origin": "http://evil.example", "access-control-request-method": "POST"})
    assert "evil.example" in _error(refused, 400)["message"]
    # the answers themselves, a 401 included, carry the header so the page can read them
    assert client.post("/v1/chat/completions", headers={"origin": UI}).headers["access-control-allow-origin"] == UI
    ok = client.post("/v1/chat/completions", headers={"origin": UI, "authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == UI


def test_any_origin():
    client = _client(AccessPolicy(allowed_origins=("*",)))
    preflight = client.options("/v1/chat/completions", headers={"origin": "https://a.example",
                                                                "access-control-request-method": "POST"})
    assert preflight.status_code == 200 and preflight.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(("options", "flag"), [
    ({"api_key": ""}, "--api-key"), ({"api_key": "  "}, "--api-key"),
    ({"allowed_origins": ("http://ui.example/",)}, "--allowed-origins"),
    ({"allowed_origins": ("ui.example",)}, "--allowed-origins"),
    ({"allowed_hosts": ("http://box/",)}, "--allowed-hosts"),
])
def test_a_bad_setting_is_refused_naming_its_flag(options, flag):
    with pytest.raises(ValueError, match=flag):
        AccessPolicy(**options)
