"""How many CUDA devices this process sees, answered without importing torch where the answer is certain: the
launcher, which hosts API server 0, resolves `device="auto"` and never loads torch (~450 MB, 2-4 s of a GPU host's
start-up) for it. The driver's device node, torch's build (its version.py, read as text) and NVIDIA's management
library (NVML: it counts GPUs without creating a CUDA context) answer; where one of them cannot, torch does."""

from __future__ import annotations

import ctypes
import functools
import importlib.util
import os
import re
from pathlib import Path

GPU_DRIVER_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")  # NVIDIA's driver, WSL2's GPU, ROCm's
NVIDIA_NODE = "/dev/nvidiactl"


def gpu_driver_present() -> bool:
    """Whether a GPU driver's device node exists; without one torch.cuda.is_available() is False."""
    return any(os.path.exists(node) for node in GPU_DRIVER_NODES)


def torch_build() -> dict[str, str | None] | None:
    """The toolkits installed torch was built for, from its version.py: {"cuda": "13.0" or None, "hip": ...}; None
    where torch or its version file is not found, or does not say."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:
        text = (Path(next(iter(spec.submodule_search_locations))) / "version.py").read_text()
    except OSError:
        return None
    out: dict[str, str | None] = {}
    for name in ("cuda", "hip"):
        found = re.search(rf"^{name}\s*(?::[^=]*)?=\s*(None|'([^']*)'|\"([^\"]*)\")\s*$", text, re.MULTILINE)
        if found is None:
            return None
        out[name] = found.group(2) or found.group(3) or None
    return out


@functools.cache  # the host's GPUs and driver do not change under a process; `device` is resolved many times
def nvml_gpus() -> tuple[int, int] | None:
    """(GPUs on the host, the driver's CUDA version as 1000 * major + 10 * minor) from NVML, or None where NVML
    cannot be loaded or asked."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return None
    if nvml.nvmlInit_v2() != 0:
        return None
    try:
        count, version = ctypes.c_uint(), ctypes.c_int()
        if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) or nvml.nvmlSystemGetCudaDriverVersion_v2(
                ctypes.byref(version)):
            return None
        return count.value, version.value
    finally:
        nvml.nvmlShutdown()


def visible_count(gpus: int, cuda_visible_devices: str | None) -> int | None:
    """How many of the host's `gpus` CUDA_VISIBLE_DEVICES leaves to CUDA, which reads its comma-separated indices up
    to the first one that is not a valid device; None for what only CUDA can resolve (UUIDs, MIG names, a repeat)."""
    if cuda_visible_devices is None:
        return gpus
    seen: set[int] = set()
    for item in cuda_visible_devices.split(","):
        item = item.strip()
        if item.startswith(("GPU-", "MIG-")):
            return None
        if not item.isdigit() or int(item) >= gpus:
            break
        if int(item) in seen:
            return None
        seen.add(int(item))
    return len(seen)


def certain_cuda_devices() -> int | None:
    """The CUDA devices torch would see, where known without torch: 0 without a driver node or with a build of
    torch for neither CUDA nor ROCm, NVML's count on an NVIDIA host whose driver runs torch's CUDA; else None."""
    if not gpu_driver_present():
        return 0
    build = torch_build()
    if build is None:
        return None
    if build["cuda"] is None:
        return 0 if build["hip"] is None else None
    if not os.path.exists(NVIDIA_NODE):
        return None
    host = nvml_gpus()
    if host is None:
        return None
    gpus, driver = host
    visible = visible_count(gpus, os.environ.get("CUDA_VISIBLE_DEVICES"))
    major = re.match(r"\d+", build["cuda"])
    if major is None or (visible and driver // 1000 < int(major.group())):  # torch's CUDA needs a newer driver
        return None
    return visible


def cuda_device_count() -> int:
    """torch.cuda.device_count() where CUDA is usable, else 0; without importing torch where the answer is certain."""
    known = certain_cuda_devices()
    if known is not None:
        return known
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
