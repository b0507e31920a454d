"""The CLI's answers to careless use: --show-probes writes no colour codes into a pipe or under NO_COLOR, a truncated
probe file stops `infer serve` with an error naming it, and --quantization on an already-quantized GGUF is refused
before loading; `infer generate` reports decode tok/s beside the overall rate."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from probe_sets import Spec, write_probe_set

pytestmark = pytest.mark.slow

ESC = "\x1b["


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer.cli", *args], capture_output=True, text=True, timeout=300,
                          env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def probes_yaml(tmp_path_factory):
    return write_probe_set(tmp_path_factory.mktemp("probes"), 576, [Spec("mood", 12, "sigmoid")], scale=0.005)


@pytest.mark.parametrize("env", [{}, {"NO_COLOR": "1"}])
def test_show_probes_writes_no_colour_codes_into_a_pipe(probes_yaml, env):
    result = _run("generate", "The sky is", "--max-tokens", "4", "--temperature", "0", "--probes", str(probes_yaml),
                  "--show-probes", env=env)
    assert result.returncode == 0, result.stderr
    assert ESC not in result.stdout and ESC not in result.stderr
    assert "no shading" in result.stderr and "mood" in result.stderr  # the mean scores are still printed


def test_generate_prints_decode_tok_s_beside_the_overall_rate():
    result = _run("generate", "The sky is", "--max-tokens", "8", "--temperature", "0", "--ignore-eos")
    assert result.returncode == 0, result.stderr
    assert "first token after" in result.stderr and "decode" in result.stderr and "over the other 7 tokens" in result.stderr


def test_a_truncated_probe_file_stops_serve_naming_the_file(tmp_path):
    yaml = write_probe_set(tmp_path, 576, [Spec("mood", 12, "sigmoid")], scale=0.005)
    weights = tmp_path / "mood-0.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    result = _run("serve", "--max-seq-len", "256", "--probes", str(yaml))
    assert result.returncode != 0
    assert "mood-0.safetensors" in result.stderr and "truncated" in result.stderr, result.stderr[-2000:]
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("scheme", ["int8", "fp8"])
def test_quantizing_an_already_quantized_gguf_is_refused(scheme):
    result = _run("generate", "Hi", "--max-tokens", "2", "--quantization", scheme)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"quantization={scheme!r}" in result.stderr and "quantized already" in result.stderr
    assert "Traceback" not in result.stderr
