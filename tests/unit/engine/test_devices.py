"""engine/devices.py: the CUDA device count without torch where it is certain, torch where it is not."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from infer.engine import devices


@pytest.mark.parametrize("env, visible", [
    (None, 4), ("", 0), ("-1", 0), ("2", 1), ("0,1,2,3", 4), ("3,1", 2), ("1,7,0", 1), ("0, 2", 2), ("x,1", 0),
    ("GPU-8f2e", None), ("0,MIG-1", None), ("1,1", None),
])
def test_visible_count_reads_cuda_visible_devices_as_cuda_does(env, visible) -> None:
    assert devices.visible_count(4, env) == visible


def _fake_torch(monkeypatch, tmp_path: Path, version_py: str | None) -> None:
    if version_py is not None:
        (tmp_path / "version.py").write_text(version_py)
    spec = SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else real(name, *a))


@pytest.mark.parametrize("text, build", [
    ("cuda: Optional[str] = '13.0'\nhip: Optional[str] = None\n", {"cuda": "13.0", "hip": None}),
    ("cuda: Optional[str] = None\nhip: Optional[str] = None\n", {"cuda": None, "hip": None}),
    ("cuda = None\nhip = \"6.4.1\"\n", {"cuda": None, "hip": "6.4.1"}),
    ("cuda: Optional[str] = '12.8'\n", None),  # says nothing of hip: not a version file we know
    (None, None),
])
def test_torch_build_reads_the_version_file_without_importing_torch(monkeypatch, tmp_path, text, build) -> None:
    _fake_torch(monkeypatch, tmp_path, text)
    assert devices.torch_build() == build


@pytest.fixture
def nvidia_host(monkeypatch, tmp_path):
    """A host with NVIDIA's driver node, a CUDA 13.0 build of torch and NVML counting 2 GPUs on a CUDA 13.0 driver;
    torch must not be asked."""
    node = tmp_path / "nvidiactl"
    node.touch()
    monkeypatch.setattr(devices, "GPU_DRIVER_NODES", (str(node),))
    monkeypatch.setattr(devices, "NVIDIA_NODE", str(node))
    monkeypatch.setattr(devices, "torch_build", lambda: {"cuda": "13.0", "hip": None})
    monkeypatch.setattr(devices, "nvml_gpus", lambda: (2, 13000))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return monkeypatch


def test_nvml_answers_on_an_nvidia_host(nvidia_host) -> None:
    assert devices.certain_cuda_devices() == 2
    nvidia_host.setenv("CUDA_VISIBLE_DEVICES", "1")
    assert devices.certain_cuda_devices() == 1
    nvidia_host.setenv("CUDA_VISIBLE_DEVICES", "")
    assert devices.certain_cuda_devices() == 0


@pytest.mark.parametrize("change", ["old driver", "no nvml", "rocm build", "no nvidia node", "uuid", "odd version"])
def test_torch_decides_what_the_probe_cannot(nvidia_host, change) -> None:
    if change == "old driver":  # torch's CUDA 13 on a CUDA 12 driver: torch says whether it runs
        nvidia_host.setattr(devices, "nvml_gpus", lambda: (2, 12080))
    elif change == "no nvml":
        nvidia_host.setattr(devices, "nvml_gpus", lambda: None)
    elif change == "rocm build":
        nvidia_host.setattr(devices, "torch_build", lambda: {"cuda": None, "hip": "6.4"})
    elif change == "odd version":
        nvidia_host.setattr(devices, "torch_build", lambda: {"cuda": "custom", "hip": None})
    elif change == "no nvidia node":
        nvidia_host.setattr(devices, "NVIDIA_NODE", "/nonexistent/nvidiactl")
    else:
        nvidia_host.setenv("CUDA_VISIBLE_DEVICES", "GPU-8f2e")
    assert devices.certain_cuda_devices() is None
    import torch

    nvidia_host.setattr(torch.cuda, "is_available", lambda: True)
    nvidia_host.setattr(torch.cuda, "device_count", lambda: 3)
    assert devices.cuda_device_count() == 3


def test_a_cpu_build_of_torch_sees_no_cuda_whatever_the_host_has(nvidia_host) -> None:
    nvidia_host.setattr(devices, "torch_build", lambda: {"cuda": None, "hip": None})
    assert devices.certain_cuda_devices() == 0


def test_device_auto_on_an_nvidia_host_is_cuda_without_importing_torch(tmp_path) -> None:
    """The launcher's question, in a fresh interpreter: "auto" resolves to cuda and torch stays unloaded."""
    node = tmp_path / "nvidiactl"
    node.touch()
    code = (f"import sys; from infer.engine import devices; devices.GPU_DRIVER_NODES = ({str(node)!r},); "
            f"devices.NVIDIA_NODE = {str(node)!r}; devices.nvml_gpus = lambda: (8, 13000); "
            "devices.torch_build = lambda: {'cuda': '13.0', 'hip': None}; "
            "from infer.engine.config import EngineConfig; "
            "print(EngineConfig().resolved_device, devices.cuda_device_count(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}).stdout
    assert out.split() == ["cuda", "8", "False"]


def test_nvml_is_none_where_the_library_is_missing(monkeypatch) -> None:
    def missing(name: str):
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(devices.ctypes, "CDLL", missing)
    devices.nvml_gpus.cache_clear()
    try:
        assert devices.nvml_gpus() is None
    finally:
        devices.nvml_gpus.cache_clear()
