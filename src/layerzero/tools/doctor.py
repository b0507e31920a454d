"""`doctor()` / `python -m layerzero doctor`: detected hardware, installed libraries, each backend's availability
with reasons, registered kernels per op, plugins, capabilities descriptors, the policy in force with the source
of each setting, and the readiness checks that did not pass."""

from __future__ import annotations

import json
import os
import platform
import sys
from collections import defaultdict
from dataclasses import dataclass
from importlib import metadata
from typing import Any, TextIO

import torch

from layerzero.extend import capabilities

from layerzero.extend import plugins
from layerzero.kernels import get_registry
from layerzero.perf.measure import cpu_info
from layerzero.policy.sources import ENV_CONFIG
from layerzero.policy.state import get_policy
from layerzero.tools.readiness import PASS, readiness_check

LIBRARIES = ("torch", "triton", "tokenizers", "transformers", "pyyaml", "flash-attn", "flashinfer-python",
             "liger-kernel", "xformers")
CPU_FEATURES = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
                "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "asimd", "sve")


def hardware() -> dict[str, Any]:
    """CPU model, cores, ISA features and torch's CPU capability; every CUDA device with its sm."""
    model, flags = cpu_info()
    features = [f for f in CPU_FEATURES if f in flags]
    devices = []
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            major, minor = torch.cuda.get_device_capability(index)
            devices.append({"index": index, "name": props.name, "sm": major * 10 + minor,
                            "memory_gb": round(props.total_memory / 2**30, 1)})
    return {
        "cpu": {"model": model, "cores": os.cpu_count(), "features": features,
                "torch_capability": torch.backends.cpu.get_cpu_capability()},
        "cuda": {"available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda, "devices": devices},
    }


def software() -> dict[str, str | None]:
    """Python and the versions of the libraries layerzero uses or can wrap (None: not installed)."""
    out: dict[str, str | None] = {"python": platform.python_version(), "torch": torch.__version__}
    for name in LIBRARIES:
        if name in out:
            continue
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def backends() -> tuple[dict[str, dict[str, Any]], dict[str, list[dict[str, Any]]]]:
    """(per backend: kernel counts and distinct unavailability reasons, per op: kernels with availability)."""
    registry = get_registry()
    by_backend: dict[str, dict[str, Any]] = defaultdict(lambda: {"kernels": 0, "available": 0, "reasons": []})
    by_op: dict[str, list[dict[str, Any]]] = {}
    for op in registry.ops():
        by_op[op] = []
        for spec in sorted(registry.kernels(op), key=lambda s: (-s.priority, s.kernel_id)):
            reason = registry.availability(spec)
            entry = by_backend[spec.backend]
            entry["kernels"] += 1
            entry["available"] += reason is None
            if reason is not None and reason.to_dict() not in entry["reasons"]:
                entry["reasons"].append(reason.to_dict())
            by_op[op].append({"kernel_id": spec.kernel_id, "priority": spec.priority,
                              "available": reason is None, "reason": None if reason is None else str(reason)})
    return dict(sorted(by_backend.items())), by_op


def _policy() -> dict[str, Any]:
    try:
        policy = get_policy()
    except Exception as exc:  # an invalid layerzero.yaml or LAYERZERO_* value is a finding here
        return {"error": f"{type(exc).__name__}: {exc}"}
    return {**policy.to_dict(), "config_file": os.environ.get(ENV_CONFIG)}


@dataclass(frozen=True)
class DoctorReport:
    """Everything doctor found; `str()` is the printed form, `to_dict()` the JSON one."""

    hardware: dict[str, Any]
    software: dict[str, str | None]
    backends: dict[str, dict[str, Any]]
    load_errors: dict[str, dict[str, str]]
    kernels: dict[str, list[dict[str, Any]]]
    plugins: list[dict[str, Any]]
    capabilities: list[dict[str, Any]]
    policy: dict[str, Any]
    readiness: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def __str__(self) -> str:
        return "\n".join(_render(self))


def _render(r: DoctorReport) -> list[str]:
    cpu, cuda = r.hardware["cpu"], r.hardware["cuda"]
    lines = ["LayerZero doctor", "", "Hardware",
             f"  CPU: {cpu['model']} ({cpu['cores']} cores), torch capability {cpu['torch_capability']}",
             f"  CPU features: {' '.join(cpu['features']) or 'unknown'}"]
    if cuda["devices"]:
        lines += [f"  cuda:{d['index']}: {d['name']}, sm_{d['sm']}, {d['memory_gb']} GB" for d in cuda["devices"]]
    else:
        lines.append(f"  CUDA: no device (torch built with CUDA {cuda['torch_cuda']})" if cuda["torch_cuda"]
                     else "  CUDA: no device (CPU-only torch build)")
    lines += ["", "Libraries", "  " + ", ".join(f"{k} {v or '(not installed)'}" for k, v in r.software.items())]
    lines += ["", "Backends"]
    for name, info in r.backends.items():
        state = "available" if info["available"] == info["kernels"] else \
            f"{info['available']}/{info['kernels']} available"
        lines.append(f"  {name}: {info['kernels']} kernel(s), {state}")
        lines += [f"    - [{reason['code']}] {reason['message']}" for reason in info["reasons"]]
    lines += [f"  {name}: failed to load - [{reason['code']}] {reason['message']}"
              for name, reason in r.load_errors.items()]
    lines += ["", "Kernels per op"]
    for op, kernels in r.kernels.items():
        lines.append(f"  {op}: " + ", ".join(k["kernel_id"] + ("" if k["available"] else " (unavailable)")
                                            for k in kernels))
    lines += ["", "Plugins (entry points 'layerzero.backends')"]
    lines += [f"  {p['name']} = {p['value']}: " + (f"{len(p['kernel_ids'])} kernel(s)" if p["ok"] else
                                                    f"[{p['reason']['code']}] {p['reason']['message']}")
              for p in r.plugins] or ["  none"]
    lines += ["", "Capabilities descriptors"]
    lines += [f"  {c['backend']}: " + ("valid" if c["ok"] else f"rejected - {c['error']}") for c in r.capabilities] \
        or ["  none applied"]
    lines += ["", "Policy"] + _render_policy(r.policy)
    lines += ["", f"Readiness: {'OK' if r.readiness['ok'] else 'NOT READY'}"]
    lines += [f"  [{c['status']}] {c['name']}: {c['detail']}" for c in r.readiness["checks"] if c["status"] != PASS]
    return lines


def _render_policy(policy: dict[str, Any]) -> list[str]:
    if "error" in policy:
        return [f"  invalid: {policy['error']}"]
    lines = [f"  key {policy['key']}, config file: {policy['config_file'] or '(none: LAYERZERO_CONFIG unset)'}"]
    sources = policy["sources"]
    for name, value in policy["settings"].items():
        lines.append(f"  {name} = {json.dumps(value)}  [{sources.get(name, 'default')}]")
    lines += [f"  {name} [{source}]" for name, source in sorted(sources.items()) if name.startswith("locks.")]
    if policy["unknown_env"]:
        lines.append(f"  unrecognised variables: {', '.join(policy['unknown_env'])}")
    return lines


def doctor(file: TextIO | None = None, *, as_json: bool = False) -> DoctorReport:
    """Collect the report, print it (text or JSON) to `file` (default stdout) and return it."""
    by_backend, by_op = backends()
    report = DoctorReport(
        hardware=hardware(),
        software=software(),
        backends=by_backend,
        load_errors={name: reason.to_dict() for name, reason in sorted(get_registry().load_errors.items())},
        kernels=by_op,
        plugins=[p.to_dict() for p in plugins.plugin_statuses()],
        capabilities=[c.to_dict() for c in capabilities.statuses()],
        policy=_policy(),
        readiness=readiness_check().to_dict(),
    )
    out = file or sys.stdout
    print(json.dumps(report.to_dict(), indent=2, default=str) if as_json else str(report), file=out)
    return report
