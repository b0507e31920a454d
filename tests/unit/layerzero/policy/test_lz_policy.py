"""Policy: precedence of every source, env parsing, yaml errors naming fields, rules, contextvars, thread safety."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from layerzero.policy import state as P
from layerzero.policy.settings import Settings
from layerzero.select.context import SelectionContext
from layerzero.select.kernel_spec import KernelSpec
from layerzero.select.reasons import POLICY_BLOCKED


def _spec(kernel_id: str, backend: str, *, reference: bool = False) -> KernelSpec:
    return KernelSpec(kernel_id=kernel_id, op="attention", backend=backend, impl=lambda *a, **k: None,
                      is_reference=reference)


TRITON = _spec("triton.attention", "triton")
XFORMERS = _spec("xformers.attention", "xformers")
REFERENCE = _spec("reference.attention", "reference", reference=True)
CTX = SelectionContext(op="attention", platform="cuda", device="cuda:0", sm=90, dtype=torch.float16, seq_q=128,
                       seq_k=128, head_dim=64)


@pytest.fixture(autouse=True)
def clean_policy(monkeypatch: pytest.MonkeyPatch):
    import os

    for name in list(os.environ):
        if name.startswith("LAYERZERO_"):
            monkeypatch.delenv(name)
    P.reset()
    yield
    monkeypatch.undo()
    P.reset()


def _yaml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "layerzero.yaml"
    path.write_text(text)
    return path


def test_defaults_come_from_appendix_b():
    policy = P.get_policy()
    assert policy.settings == Settings()
    assert policy.enabled and policy.fallback_enabled and not policy.strict_mode and not policy.deterministic
    assert set(policy.sources.values()) == {"default"}
    assert policy.locked_kernel(CTX) is None
    assert policy.adjust(TRITON, CTX) == 0.0 and policy.blocked(TRITON, CTX) is None


def test_file_over_defaults_env_over_file_configure_over_env_context_over_configure(tmp_path, monkeypatch):
    path = _yaml(tmp_path, "version: 1\nstrict_mode: true\ndeterministic: true\nenabled: true\n"
                           "prefer_sources: [triton]\n")
    monkeypatch.setenv("LAYERZERO_CONFIG", str(path))
    P.reset()
    policy = P.get_policy()
    assert policy.strict_mode and policy.deterministic and policy.settings.prefer_sources == ("triton",)
    assert policy.sources["strict_mode"] == f"file:{path}"
    assert policy.sources["fallback_enabled"] == "default"

    monkeypatch.setenv("LAYERZERO_STRICT", "0")
    monkeypatch.setenv("LAYERZERO_PREFER", "xformers")
    P.reset()
    policy = P.get_policy()
    assert not policy.strict_mode and policy.deterministic
    assert policy.settings.prefer_sources == ("xformers",)
    assert policy.sources["strict_mode"] == "env:LAYERZERO_STRICT"
    assert policy.sources["deterministic"] == f"file:{path}"

    P.configure(strict_mode=True, prefer_sources=["triton"])
    policy = P.get_policy()
    assert policy.strict_mode and policy.sources["strict_mode"] == "configure"
    assert policy.adjust(TRITON, CTX) == P.PREFER_BONUS and policy.adjust(XFORMERS, CTX) == 0.0

    with P.disabled():
        inner = P.get_policy()
        assert not inner.enabled and inner.sources["enabled"] == "context:lz.disabled()"
        assert inner.blocked(TRITON, CTX).code == POLICY_BLOCKED
        assert inner.blocked(REFERENCE, CTX) is None
    assert P.get_policy().enabled


def test_explicit_load_replaces_the_file_layer_and_stays_below_env(tmp_path, monkeypatch):
    monkeypatch.setenv("LAYERZERO_VERBOSE", "1")
    P.reset()
    first = _yaml(tmp_path, "log_selections: false\nstrict_mode: true\n")
    P.load(first)
    assert P.get_policy().strict_mode and P.get_policy().log_selections
    second = tmp_path / "other.yaml"
    second.write_text("fallback_enabled: false\n")
    P.load(second)
    policy = P.get_policy()
    assert not policy.strict_mode and not policy.fallback_enabled
    assert policy.sources["fallback_enabled"] == f"file:{second}"


def test_locks_per_op_with_precedence_and_unlock(tmp_path, monkeypatch):
    path = _yaml(tmp_path, "locks:\n  attention: a.file\n  rms_norm: r.file\n")
    monkeypatch.setenv("LAYERZERO_CONFIG", str(path))
    monkeypatch.setenv("LAYERZERO_LOCK_ATTENTION", "a.env")
    P.reset()
    rms = SelectionContext(op="rms_norm")
    assert P.get_policy().locked_kernel(CTX) == "a.env"
    assert P.get_policy().locked_kernel(rms) == "r.file"
    assert P.get_policy().sources["locks.attention"] == "env:LAYERZERO_LOCK_ATTENTION"
    P.lock("attention", "a.prog")
    assert P.get_policy().locked_kernel(CTX) == "a.prog"
    P.unlock("attention")
    assert P.get_policy().locked_kernel(CTX) is None
    assert P.get_policy().locked_kernel(rms) == "r.file"
    with P.disabled():
        assert P.get_policy().locked_kernel(rms) is None
    P.reset()
    assert P.get_policy().locked_kernel(CTX) == "a.env"


def test_env_parsing(monkeypatch):
    monkeypatch.setenv("LAYERZERO_DISABLED", "yes")
    monkeypatch.setenv("LAYERZERO_DETERMINISTIC", "TRUE")
    monkeypatch.setenv("LAYERZERO_FALLBACK", "off")
    monkeypatch.setenv("LAYERZERO_GRAPH_STRICT", "1")
    monkeypatch.setenv("LAYERZERO_PREFER", " triton, flash_attn,, ")
    monkeypatch.setenv("LAYERZERO_AVOID", "xformers")
    monkeypatch.setenv("LAYERZERO_LOCK_FUSED_ADD_RMS_NORM", "triton.fused_add_rms_norm")
    monkeypatch.setenv("LAYERZERO_TYPO", "1")
    monkeypatch.setenv("LAYERZERO_PERFDB_PATH", "/tmp/x.sqlite")
    P.reset()
    policy = P.get_policy()
    assert not policy.enabled and policy.sources["enabled"] == "env:LAYERZERO_DISABLED"
    assert policy.deterministic and not policy.fallback_enabled and policy.settings.graph_strict_mode
    assert policy.settings.prefer_sources == ("triton", "flash_attn")
    assert policy.adjust(XFORMERS, CTX) == P.AVOID_PENALTY
    assert policy.settings.locks == {"fused_add_rms_norm": "triton.fused_add_rms_norm"}
    assert policy.unknown_env == ("LAYERZERO_TYPO",)
    assert policy.settings.perfdb_path == "/tmp/x.sqlite"
    assert policy.sources["perfdb_path"] == "env:LAYERZERO_PERFDB_PATH"
    assert policy.blocked(TRITON, CTX) is not None and "LAYERZERO_DISABLED" in policy.blocked(TRITON, CTX).message


@pytest.mark.parametrize("name,value", [("LAYERZERO_DETERMINISTIC", "maybe"), ("LAYERZERO_LOCK_ATTENTION", " ")])
def test_bad_env_values_name_the_variable(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    with pytest.raises(P.PolicyError, match=name):
        P.reset()


@pytest.mark.parametrize(
    "text,fragment",
    [
        ("strict_mode: maybe\n", "strict_mode: expected true or false"),
        ("stict_mode: true\n", "unknown field 'stict_mode'"),
        ("version: 2\n", "version: unsupported policy version 2"),
        ("prefer_sources: triton\n", "prefer_sources: expected a list"),
        ("locks:\n  attention: 5\n", "locks.attention: expected a kernel id"),
        ("memory_headroom_mb: -1\n", "memory_headroom_mb: expected an integer >= 0"),
        ("perfdb:\n  tune_samples: 0\n", "perfdb.tune_samples: expected an integer >= 1"),
        ("cache:\n  size: 3\n", "cache.size: unknown field"),
        ("perfdb:\n  auto_tune: true\n", "perfdb.auto_tune: only False is supported"),
        ("cache:\n  enabled: false\n", "cache.enabled: only True is supported"),
        ("plan_mode: true\n", "plan_mode: only False is supported"),
        ("rules:\n  - match: {sm: '>=x'}\n    prefer: triton\n", "rules[0].match.sm: '>=x' is not a comparison"),
        ("rules:\n  - match: {seq_len: '>10'}\n", "rules[0]: a rule needs 'prefer' or 'avoid'"),
        ("rules:\n  - match: {colour: red}\n    prefer: x\n", "rules[0].match: unknown match field 'colour'"),
        ("rules:\n  - match: {causal: 1}\n    avoid: x\n", "rules[0].match.causal: expected true or false"),
        ("rules:\n  - match: {op: attention}\n    prefer: x\n    weight: 3\n", "rules[0]: unknown field 'weight'"),
        ("- a\n- b\n", "the top level must be a mapping"),
        ("strict_mode: [unclosed\n", "invalid YAML"),
    ],
)
def test_yaml_errors_name_the_file_and_field(tmp_path, text, fragment):
    path = _yaml(tmp_path, text)
    with pytest.raises(P.PolicyError) as info:
        P.load(path)
    assert str(path) in str(info.value) and fragment in str(info.value)


def test_allow_adaptation_false_means_strict():
    assert not P.get_policy().strict_mode
    P.configure(allow_adaptation=False)
    assert P.get_policy().strict_mode and not P.get_policy().settings.strict_mode


def test_configure_errors_name_the_field():
    before = P.version()
    with pytest.raises(P.PolicyError, match="deterministic: expected true or false"):
        P.configure(deterministic="yes")
    with pytest.raises(P.PolicyError, match="unknown field 'colour' in configure"):
        P.configure(colour="red")
    assert P.version() == before  # failed calls change nothing
    assert P.get_policy().settings == Settings()


def test_spec_example_rules_match_on_sm_op_dtype_and_shapes():
    P.configure(rules=[
        {"match": {"sm": ">=90", "operation": "attention*"}, "prefer": "triton.*"},
        {"match": {"seq_len": ">16384"}, "avoid_sources": ["xformers"]},
        {"match": {"dtype": ["float32"], "head_dim": ">=64,<=128"}, "avoid": "triton"},
    ])
    policy = P.get_policy()
    assert policy.adjust(TRITON, CTX) == P.PREFER_BONUS
    assert policy.adjust(TRITON, CTX.with_(sm=80)) == 0.0
    assert policy.adjust(TRITON, CTX.with_(op="rms_norm")) == 0.0
    assert policy.adjust(TRITON, CTX.with_(sm=None)) == 0.0  # CPU: an unset field never matches
    assert policy.adjust(XFORMERS, CTX) == 0.0
    assert policy.adjust(XFORMERS, CTX.with_(seq_k=20000)) == P.AVOID_PENALTY
    fp32 = CTX.with_(dtype=torch.float32)
    assert policy.adjust(TRITON, fp32) == P.PREFER_BONUS + P.AVOID_PENALTY
    assert policy.adjust(TRITON, fp32.with_(head_dim=256)) == P.PREFER_BONUS
    assert policy.to_dict()["settings"]["rules"][0]["match"] == {"sm": ">=90", "op": "attention*"}


def test_prefer_context_nests_and_beats_everything():
    P.configure(avoid_sources=["triton"])
    assert P.get_policy().adjust(TRITON, CTX) == P.AVOID_PENALTY
    with P.prefer("triton"):
        assert P.get_policy().adjust(TRITON, CTX) == P.CONTEXT_PREFER_BONUS + P.AVOID_PENALTY
        with P.prefer("xformers.*"):
            assert P.get_policy().context_prefer == ("xformers.*", "triton")
            assert P.get_policy().adjust(XFORMERS, CTX) == P.CONTEXT_PREFER_BONUS
        assert P.get_policy().context_prefer == ("triton",)
    assert P.get_policy().context_prefer == ()
    with pytest.raises(P.PolicyError):
        with P.prefer():
            pass


def test_key_tracks_settings_and_context_version_tracks_global_changes():
    base_key, base_version = P.get_policy().key, P.version()
    P.configure(strict_mode=True)
    assert P.get_policy().key != base_key and P.version() == base_version + 1
    P.configure(strict_mode=False)
    assert P.get_policy().key == base_key
    with P.prefer("triton"):
        assert P.get_policy().key != base_key
    with P.disabled():
        assert P.get_policy().key != base_key
    assert P.version() == base_version + 2
    P.lock("attention", "x")
    P.unlock("attention")
    assert P.version() == base_version + 4


def test_context_managers_are_isolated_across_threads():
    inside, checked = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def holder():
        with P.disabled(), P.prefer("triton"):
            inside.set()
            checked.wait(5)
            seen["holder"] = (P.get_policy().enabled, P.get_policy().context_prefer)

    def observer():
        inside.wait(5)
        seen["observer"] = (P.get_policy().enabled, P.get_policy().context_prefer)
        checked.set()

    threads = [threading.Thread(target=holder), threading.Thread(target=observer)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert seen == {"holder": (False, ("triton",)), "observer": (True, ())}
    assert P.get_policy().enabled


def test_concurrent_configuration_is_consistent():
    errors: list[BaseException] = []
    start = P.version()

    def worker(i: int):
        try:
            for j in range(50):
                P.lock(f"op{i}", f"k{j}")
                policy = P.get_policy()
                assert policy.settings.locks[f"op{i}"] == f"k{j}"
                with P.prefer(f"b{i}"):
                    assert P.get_policy().context_prefer == (f"b{i}",)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors
    assert P.version() == start + 200
    assert P.get_policy().settings.locks == {f"op{i}": "k49" for i in range(4)}
