"""doctor / `python -m layerzero`: hardware, backends with reasons, kernels per op, the policy with its sources."""

from __future__ import annotations

import io
import json
import os
import runpy
import sys

import pytest
import torch

from layerzero.perf import tables as dispatch_table

from layerzero.__main__ import main
from layerzero.kernels import get_registry
from layerzero.policy import state as policy
from layerzero.tools.doctor import doctor
from layerzero.tools.readiness import readiness_check


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith("LAYERZERO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LAYERZERO_PERFDB", "off")
    policy.reset()
    yield
    monkeypatch.undo()
    policy.reset()


def test_doctor_prints_hardware_backends_kernels_and_policy_sources(tmp_path, monkeypatch):
    config = tmp_path / "layerzero.yaml"
    config.write_text("avoid_sources: [xformers]\nlocks:\n  rms_norm: reference.rms_norm\n")
    monkeypatch.setenv("LAYERZERO_CONFIG", str(config))
    monkeypatch.setenv("LAYERZERO_DETERMINISTIC", "1")
    policy.reset()
    policy.configure(strict_mode=True)
    out = io.StringIO()
    report = doctor(file=out)
    text = out.getvalue()
    assert text == str(report) + "\n"

    assert f"torch capability {torch.backends.cpu.get_cpu_capability()}" in text
    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability(0)
        assert f"cuda:0: {torch.cuda.get_device_name(0)}, sm_{major * 10 + minor}" in text
    else:
        assert "CUDA: no device" in text
    assert f"torch {torch.__version__}" in text

    registry = get_registry()
    for backend in {s.backend for s in registry.all()}:
        assert f"\n  {backend}: " in text
    for spec in registry.all():
        reason = registry.availability(spec)
        if reason is not None:
            assert f"[{reason.code}] {reason.message}" in text
    for op in registry.ops():
        line = next(line for line in text.splitlines() if line.startswith(f"  {op}: "))
        assert all(s.kernel_id in line for s in registry.kernels(op))

    assert f"config file: {config}" in text
    assert f'avoid_sources = ["xformers"]  [file:{config}]' in text
    assert "deterministic = true  [env:LAYERZERO_DETERMINISTIC]" in text
    assert "strict_mode = true  [configure]" in text
    assert f"locks.rms_norm [file:{config}]" in text
    assert "fallback_enabled = true  [default]" in text
    assert "[warn] perfdb" in text  # LAYERZERO_PERFDB=off in this test


def test_doctor_reports_an_invalid_policy_instead_of_crashing(monkeypatch):
    monkeypatch.setenv("LAYERZERO_STRICT", "maybe")
    monkeypatch.setattr(policy, "_base", None)  # re-read the environment on next use
    out = io.StringIO()
    report = doctor(file=out)
    assert "invalid: PolicyError: environment variable LAYERZERO_STRICT='maybe'" in out.getvalue()
    assert not report.readiness["ok"]


def test_cli_subcommands(capsys):
    assert main(["kernels", "rms_norm"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == len(get_registry().kernels("rms_norm")) and all(line.startswith("rms_norm") for line in lines)
    assert main(["readiness", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True
    policy.lock("rms_norm", "nobody.rms_norm")
    assert main(["readiness"]) == 1
    assert "NOT READY" in capsys.readouterr().out


def test_python_m_layerzero_doctor_json(monkeypatch, capsys):
    monkeypatch.setattr(sys, "argv", ["python -m layerzero", "doctor", "--json"])
    monkeypatch.delitem(sys.modules, "layerzero.__main__", raising=False)
    with pytest.raises(SystemExit) as exited:
        runpy.run_module("layerzero", run_name="__main__")
    assert exited.value.code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["hardware"]["cpu"]["cores"] == os.cpu_count()
    assert report["kernels"]["attention"] and report["policy"]["sources"]["enabled"] == "default"
    assert report["backends"]["reference"]["available"] == report["backends"]["reference"]["kernels"]


def test_readiness_checks_an_installed_dispatch_table():
    x, w = torch.randn(4, 32), torch.randn(32)
    table = dispatch_table.solve([("rms_norm", (x, w), {"eps": 1e-6, "weight_offset": 0.0})])
    dispatch_table.use(table)
    try:
        check = next(c for c in readiness_check().checks if c.name == "dispatch_table")
        assert check.status == "pass" and "1 plan(s)" in check.detail
        table.hardware_signature = "cuda_sm90_elsewhere"
        check = next(c for c in readiness_check().checks if c.name == "dispatch_table")
        assert check.status == "fail" and "cuda_sm90_elsewhere" in check.detail
    finally:
        dispatch_table.use(None)
    assert next(c for c in readiness_check().checks if c.name == "dispatch_table").status == "warn"
