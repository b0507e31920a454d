"""`--api-server-count`'s default: one API server on the CPU, one per 4 host cores (at most 4) on CUDA."""

from __future__ import annotations

from infer.engine.config import EngineConfig
from infer.server.launch import MAX_DEFAULT_API_SERVERS, api_servers_for


def test_the_cpu_serves_from_one_process_and_an_explicit_count_wins(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 64)
    assert api_servers_for(EngineConfig(device="cpu"), None) == 1
    assert api_servers_for(EngineConfig(device="cpu"), 3) == 3


def test_cuda_takes_one_per_four_host_cores_up_to_the_cap(monkeypatch):
    config = EngineConfig(device="cpu")
    monkeypatch.setattr(type(config), "resolved_device", property(lambda self: "cuda:0"))
    for cores, expected in ((2, 1), (8, 2), (16, 4), (128, MAX_DEFAULT_API_SERVERS)):
        monkeypatch.setattr("os.cpu_count", lambda: cores)
        assert api_servers_for(config, None) == expected
    assert api_servers_for(config, 1) == 1
