"""register_kernel and the `layerzero.kernels` entry points: failures become reasons and roll back, never crash."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import layerzero as lz
from layerzero.extend import plugins
from layerzero.kernels import get_registry
from layerzero.policy import state as policy
from layerzero.select.reasons import BACKEND_IMPORT_FAILED
from layerzero.tools.inspect import which

MODULES = {
    "lzp_good": """
        from layerzero.select.kernel_spec import KernelSpec

        CALLS = []

        def rms(x, weight, *, eps, weight_offset):
            return x

        def register():
            CALLS.append(1)
            return [KernelSpec(kernel_id="lzp_good.rms_norm", op="rms_norm", backend="lzp_good", impl=rms)]
    """,
    "lzp_deco": """
        from layerzero.extend.plugins import register_kernel

        @register_kernel(op="silu_and_mul", kernel_id="lzp_deco.silu_and_mul", priority=1)
        def silu_and_mul(x):
            return x
    """,
    "lzp_broken": """
        import a_module_that_is_not_installed
    """,
    "lzp_raises": """
        from layerzero.extend.plugins import register_kernel

        def register():
            register_kernel(op="rope", kernel_id="lzp_raises.rope")(lambda x, cos, sin, *, interleaved: x)
            raise RuntimeError("half way through")
    """,
    "lzp_junk": """
        def register():
            return [42]

        def duplicate():
            from layerzero.select.kernel_spec import KernelSpec
            return [KernelSpec(kernel_id="reference.rms_norm", op="rms_norm", backend="lzp_junk", impl=print)]
    """,
}
ENTRY_POINTS = """
[layerzero.backends]
good = lzp_good:register
deco = lzp_deco
broken = lzp_broken:register
raises = lzp_raises:register
junk = lzp_junk:register
duplicate = lzp_junk:duplicate
missing = lzp_good:no_such_function
"""
USER_IDS = ("test_plugins.rms", "lzp_good.rms_norm", "lzp_deco.silu_and_mul", "lzp_raises.rope")


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch):
    for name in list(os.environ):
        if name.startswith("LAYERZERO_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("LAYERZERO_PERFDB", "off")
    policy.reset()
    registry = get_registry()
    monkeypatch.setattr(registry, "load_errors", dict(registry.load_errors))
    monkeypatch.setattr(plugins, "_statuses", dict(plugins._statuses))
    yield
    for kernel_id in USER_IDS:
        if registry.get(kernel_id) is not None:
            registry.unregister(kernel_id)
    for name in MODULES:
        sys.modules.pop(name, None)
    monkeypatch.undo()
    policy.reset()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name, source in MODULES.items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
    dist = tmp_path / "lz_test_plugins-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: lz-test-plugins\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text(ENTRY_POINTS)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def test_register_kernel_accepts_spec_names_and_dispatch_uses_the_kernel():
    calls = []

    @lz.register_kernel(operation="rms_norm", kernel_id="test_plugins.rms", platform="cpu",
                        supported_dtypes=[torch.float32], is_cuda_graph_safe=True, priority=95)
    def my_rms(x, weight, *, eps, weight_offset):
        calls.append(x.shape)
        return get_registry().reference("rms_norm").impl(x, weight, eps=eps, weight_offset=weight_offset)

    spec = get_registry().get("test_plugins.rms")
    assert spec.impl is my_rms and spec.backend == "test_plugins" and spec.platforms == frozenset({"cpu"})
    assert spec.dtypes == frozenset({torch.float32}) and spec.graph_safe and spec.priority == 95
    x, w = torch.randn(3, 16), torch.randn(16)
    assert which("rms_norm", x, w, eps=1e-6, weight_offset=0.0)["kernel_id"] == "test_plugins.rms"
    torch.testing.assert_close(lz.rms_norm(x, w), get_registry().reference("rms_norm").impl(x, w, eps=1e-6,
                                                                                              weight_offset=0.0))
    assert calls == [(3, 16)]
    assert which("rms_norm", x.double(), w.double(), eps=1e-6, weight_offset=0.0)["kernel_id"] != "test_plugins.rms"


def test_register_kernel_rejects_bad_declarations():
    with pytest.raises(TypeError, match="op="):
        plugins.register_kernel(kernel_id="test_plugins.rms")
    with pytest.raises(TypeError, match="unknown option 'fastness'"):
        plugins.register_kernel(op="rms_norm", kernel_id="test_plugins.rms", fastness=3)(print)
    with pytest.raises(TypeError, match="unknown option 'impl'"):
        plugins.register_kernel(op="rms_norm", kernel_id="test_plugins.rms", impl=print)(print)
    plugins.register_kernel(op="rms_norm", kernel_id="test_plugins.rms")(print)
    with pytest.raises(ValueError, match="already registered"):
        plugins.register_kernel(op="rms_norm", kernel_id="test_plugins.rms")(print)
    plugins.register_kernel(op="rms_norm", kernel_id="test_plugins.rms", replace=True, priority=1)(repr)
    assert get_registry().get("test_plugins.rms").impl is repr


def test_entry_points_load_good_plugins_and_turn_failures_into_reasons(site):
    registry = get_registry()
    loaded = plugins.load_entry_points()
    assert [s.kernel_id for s in loaded] == ["lzp_good.rms_norm"]
    statuses = {s.name: s for s in plugins.plugin_statuses() if s.value.startswith("lzp_")}
    assert statuses["good"].ok and statuses["good"].kernel_ids == ("lzp_good.rms_norm",)
    assert statuses["good"].distribution == "lz-test-plugins"
    assert statuses["deco"].ok and statuses["deco"].kernel_ids == ("lzp_deco.silu_and_mul",)
    assert registry.get("lzp_good.rms_norm") is not None and registry.get("lzp_deco.silu_and_mul") is not None

    expected = {
        "broken": "ModuleNotFoundError", "raises": "half way through", "junk": "expected KernelSpec items, got int",
        "duplicate": "'reference.rms_norm' is already registered", "missing": "no_such_function",
    }
    for name, fragment in expected.items():
        status = statuses[name]
        assert not status.ok and status.reason.code == BACKEND_IMPORT_FAILED and fragment in status.reason.message
        assert registry.load_errors[f"plugin:{name}"] == status.reason
    assert registry.get("lzp_raises.rope") is None  # rolled back
    assert registry.get("reference.rms_norm").backend == "reference"  # not hijacked

    plugins.load_entry_points()  # already seen: not loaded again
    assert sys.modules["lzp_good"].CALLS == [1]


def test_failed_plugins_show_in_readiness_and_doctor(site, capsys):
    from layerzero.tools.doctor import doctor
    from layerzero.tools.readiness import readiness_check

    plugins.load_entry_points()
    check = next(c for c in readiness_check().checks if c.name == "plugins")
    assert check.status == "fail" and "broken" in check.detail
    text = str(doctor(file=sys.stdout))
    assert "good = lzp_good:register: 1 kernel(s)" in text
    assert "broken = lzp_broken:register: [BACKEND_IMPORT_FAILED]" in text
    assert "plugin:broken: failed to load" in text
    capsys.readouterr()
