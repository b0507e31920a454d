"""Probe scores over HTTP with the official openai client: per completion token, streamed chunks that concatenate
to the whole, prompt scores, n > 1, logprobs and stop strings beside them, the probe routes, reload and errors."""

from __future__ import annotations

import json

import httpx
import pytest

from probe_sets import Spec, write_probe_set
from server_harness import MODEL

pytestmark = pytest.mark.slow
SPECS = [Spec("mood", 12, "sigmoid"), Spec("topic", 20, "tanh", count=2)]
NAMES = ["mood", "topic.p0", "topic.p1"]


@pytest.fixture(scope="module")
def probe_server(smollm2_gguf, tmp_path_factory):
    from server_harness import running_server

    folder = tmp_path_factory.mktemp("probes")
    path = write_probe_set(folder, 576, SPECS, scale=0.005)
    with running_server(smollm2_gguf, max_seq_len=512, probes=str(path)) as running:
        running.folder = folder
        yield running


@pytest.fixture()
def probe_client(probe_server):
    import openai

    return openai.OpenAI(base_url=f"{probe_server.base_url}/v1", api_key="unused", max_retries=0, timeout=120)


def _extra(**kw) -> dict:
    return {"extra_body": {"probes": True, **kw}}


def test_completion_carries_a_score_per_completion_token(probe_client):
    out = probe_client.completions.create(model=MODEL, prompt="I loved this film because", max_tokens=9, temperature=0,
                                          **_extra(probe_prompt=True))
    choice = out.choices[0].model_extra
    assert list(choice["probes"]) == NAMES
    assert all(len(v) == out.usage.completion_tokens == 9 for v in choice["probes"].values())
    assert all(len(v) == out.usage.prompt_tokens for v in choice["prompt_probes"].values())
    assert all(0 <= s <= 1 for s in choice["probes"]["mood"]) and all(-1 <= s <= 1 for s in choice["probes"]["topic.p0"])


def test_prompt_scores_cover_every_position_on_a_warm_prefix_cache(probe_client):
    """Prefix caching is on by default: a prompt seen before is read from the cache, except by a request that asks
    for its prompt positions' scores, which computes them all (and gets the same scores as on a cold cache)."""
    prompt = "The committee met on a grey Tuesday to weigh the merits of the proposal, " * 3
    cold = probe_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                           **_extra(probe_prompt=True))
    plain = probe_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0)
    assert plain.usage.prompt_tokens_details.cached_tokens > 0  # the cache is warm
    warm = probe_client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0,
                                           **_extra(probe_prompt=True))
    assert warm.usage.prompt_tokens_details.cached_tokens == 0
    for name in NAMES:
        scores = warm.choices[0].model_extra["prompt_probes"][name]
        assert len(scores) == warm.usage.prompt_tokens
        assert scores == pytest.approx(cold.choices[0].model_extra["prompt_probes"][name], abs=1e-5)


@pytest.mark.parametrize("route", ["completions", "chat"])
def test_streamed_chunks_concatenate_to_the_whole(probe_client, route):
    """Stop strings, logprobs and n = 2 beside the probes; every completion token scored once, in order."""
    common = dict(model=MODEL, max_tokens=24, temperature=0.8, seed=7, n=2, stop=[" the"], logprobs=True,
                  extra_body={"probes": ["mood", "topic.p1"], "probe_prompt": True})
    if route == "completions":
        create, extra = probe_client.completions.create, dict(prompt="Tell me about the sea. The sea", logprobs=1)
    else:
        create, extra = probe_client.chat.completions.create, dict(messages=[{"role": "user", "content": "Describe the sea."}])
    whole = create(**{**common, **extra})
    chunks = list(create(**{**common, **extra}, stream=True, stream_options={"include_usage": True}))
    streamed: dict[int, dict[str, list]] = {0: {}, 1: {}}
    prompt: dict[int, dict] = {}
    for chunk in chunks:
        for c in chunk.choices:
            fields = c.model_extra
            for name, values in fields["probes"].items():
                streamed[c.index].setdefault(name, []).extend(values)
            if "prompt_probes" in fields:
                assert c.index not in prompt
                prompt[c.index] = fields["prompt_probes"]
    assert sum(len(streamed[i]["mood"]) for i in (0, 1)) == whole.usage.completion_tokens
    for c in whole.choices:
        fields = c.model_extra
        assert list(fields["probes"]) == ["mood", "topic.p1"]
        for name in ("mood", "topic.p1"):
            assert streamed[c.index][name] == pytest.approx(fields["probes"][name], abs=1e-6)
            assert prompt[c.index][name] == pytest.approx(fields["prompt_probes"][name], abs=1e-6)
        assert len(fields["prompt_probes"]["mood"]) == whole.usage.prompt_tokens


def test_probe_routes_and_reload(probe_server, probe_client):
    base = probe_server.base_url
    listed = httpx.get(f"{base}/v1/probes").json()
    assert [p["name"] for p in listed["data"]] == NAMES and listed["version"] == 1
    assert listed["data"][0]["layer"] == 12 and listed["data"][0]["activation"] == "sigmoid"
    assert len(listed["data"][0]["sha256"]) == 64
    assert str(probe_server.folder) not in json.dumps(listed) and set(listed) == {"object", "version", "data"}
    assert set(listed["data"][0]) == {"name", "layer", "activation", "sha256", "version"}  # no host file paths

    def scores() -> list[float]:
        out = probe_client.completions.create(model=MODEL, prompt="The sky is", max_tokens=4, temperature=0, **_extra())
        return out.choices[0].model_extra["probes"]["mood"]

    before = scores()
    write_probe_set(probe_server.folder, 576, SPECS, seed=4, scale=0.005)  # same names, new weights, same YAML path
    reloaded = httpx.post(f"{base}/v1/probes/reload")
    assert reloaded.status_code == 200 and reloaded.json()["version"] == 2
    assert reloaded.json()["data"][0]["sha256"] != listed["data"][0]["sha256"]
    after = scores()
    assert after != pytest.approx(before, abs=1e-4)

    (probe_server.folder / "mood-4.safetensors").write_bytes(b"broken")
    failed = httpx.post(f"{base}/v1/probes/reload")
    assert failed.status_code == 400 and "unchanged" in failed.json()["error"]["message"]
    assert httpx.get(f"{base}/v1/probes").json()["version"] == 2 and scores() == pytest.approx(after, abs=1e-6)
    assert httpx.post(f"{base}/v1/probes/reload", json={"path": "/etc/passwd"}).status_code == 400
    write_probe_set(probe_server.folder, 576, SPECS, seed=4, scale=0.005)
    weights = probe_server.folder / "mood-4.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])  # a whole header, its data cut short
    truncated = httpx.post(f"{base}/v1/probes/reload")
    assert truncated.status_code == 400, truncated.text
    assert "mood-4.safetensors" in truncated.json()["error"]["message"] and "truncated" in truncated.json()["error"]["message"]
    write_probe_set(probe_server.folder, 576, SPECS, seed=4, scale=0.005)  # leave a good file for other tests


def test_probe_stop_finishes_with_content_filter(probe_client):
    out = probe_client.completions.create(model=MODEL, prompt="The sky is", max_tokens=12, temperature=0,
                                          extra_body={"probe_stop": {"name": "mood", "above": -1.0}})
    assert out.choices[0].finish_reason == "content_filter" and out.usage.completion_tokens == 1
    assert "probes" not in out.choices[0].model_extra


@pytest.mark.parametrize("body, param", [
    ({"probes": ["nope"]}, "probes"),
    ({"probes": "yes"}, "probes"),
    ({"probe_prompt": True}, "probe_prompt"),
    ({"probe_stop": {"name": "mood"}}, "probe_stop"),
    ({"probe_stop": {"name": "nope", "below": 0.5}}, "probe_stop"),
    ({"probe_stop": {"name": "mood", "above": 0.5, "color": 1}}, "probe_stop.color"),
])
def test_bad_probe_fields_are_400s_naming_the_field(probe_server, body, param):
    for route, extra in (("completions", {"prompt": "Hi"}), ("chat/completions", {"messages": [{"role": "user", "content": "Hi"}]})):
        r = httpx.post(f"{probe_server.base_url}/v1/{route}", json={"max_tokens": 2, **extra, **body})
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param


def test_a_server_without_probes_refuses_them(server):
    r = httpx.post(f"{server.base_url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "probes": True})
    assert r.status_code == 400 and "no probe set" in r.json()["error"]["message"]
    assert httpx.get(f"{server.base_url}/v1/probes").json()["data"] == []
    assert httpx.post(f"{server.base_url}/v1/probes/reload").status_code == 400
