"""The project's pinned dependencies as each platform resolves them: a Mac (darwin arm64) gets no package that has
no macOS wheel, Linux keeps every pin, and infer imports and runs on the CPU with triton absent."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
LINUX_ONLY = {"triton"}  # published for Linux alone (pip on a Mac stops at them)
DARWIN = {"sys_platform": "darwin", "platform_system": "Darwin", "platform_machine": "arm64", "os_name": "posix"}
LINUX = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix"}


def _requirements(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    return [Requirement(line) for line in lines]


def _resolved(env: dict[str, str], extras: tuple[str, ...] = ("test", "mlx")) -> set[str]:
    """Names of the requirements `pip install -e '.[test,mlx]'` (make setup) installs on the platform."""
    return {r.name for r in _requirements(extras) if r.marker is None or r.marker.evaluate(env | {"extra": ""})}


def test_a_mac_installs_no_linux_only_package():
    on_mac = _resolved(DARWIN)
    assert not on_mac & LINUX_ONLY, f"a Mac would need {on_mac & LINUX_ONLY}, which have no macOS wheels"
    assert {"torch", "mlx", "llguidance", "fastapi"} <= on_mac


def test_linux_keeps_every_pin():
    on_linux = _resolved(LINUX)
    assert LINUX_ONLY <= on_linux and "mlx" in on_linux
    assert all(str(r.specifier).startswith("==") for r in _requirements(("test", "mlx"))), "every dependency is pinned"


@pytest.mark.slow
def test_infer_runs_on_the_cpu_without_triton(tmp_path):
    script = """
import sys
sys.modules["triton"] = None  # import triton now raises ImportError, as on a Mac
import layerzero as lz, torch
from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
path = save_tiny_with_tokenizer("llama", __import__("pathlib").Path(sys.argv[1]), seed=1)
out = LLM(str(path), device="cpu", dtype="float32", max_seq_len=64).generate_ids(
    [[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
assert len(out[0].token_ids) == 4
assert not lz.which("rms_norm", torch.ones(2, 8), torch.ones(8), eps=1e-6)["kernel_id"].startswith("triton")
print("ok")
"""
    env_path = f"{ROOT / 'src'}:{ROOT / 'tests'}"
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": env_path, "PATH": "/usr/bin:/bin"}, cwd=ROOT)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
