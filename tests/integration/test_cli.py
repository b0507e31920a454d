"""`infer generate` as a user runs it: help text, streamed answer, clear errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from infer.cli import build_parser

FLAGS = ["--model", "--chat", "--system", "--max-tokens", "--temperature", "--top-p", "--top-k",
         "--repetition-penalty", "--stop", "--seed", "--ignore-eos", "--dtype", "--device", "--max-seq-len"]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "infer.cli", *args], capture_output=True, text=True, timeout=300)


def test_help_explains_every_flag():
    sub = build_parser()._subparsers._group_actions[0].choices["generate"]  # type: ignore[union-attr]
    text = sub.format_help()
    for flag in FLAGS:
        assert flag in text
    for action in sub._actions:
        assert action.help, f"{action.option_strings} has no help"


def test_invalid_value_is_a_clear_error_before_loading():
    result = _run("generate", "hi", "--temperature", "-1")
    assert result.returncode == 2
    assert "temperature" in result.stderr and "Traceback" not in result.stderr


def test_missing_model_path_is_a_clear_error():
    result = _run("generate", "hi", "--model", "/nonexistent/model.gguf")
    assert result.returncode == 2 and "does not exist" in result.stderr


@pytest.mark.slow
def test_generate_streams_an_answer_from_the_bundled_model():
    result = _run("generate", "--chat", "What is the capital of France?", "--temperature", "0", "--max-tokens", "24")
    assert result.returncode == 0, result.stderr
    assert "Paris" in result.stdout
    assert "loaded SmolLM2-135M-Instruct" in result.stderr and "tok/s" in result.stderr
