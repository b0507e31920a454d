"""vLLM's --generation-config: which generation_config.json is read, which of its fields become the server's
sampling defaults, and a bad file refused naming it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer.loader.generation_config import generation_config_file, sampling_defaults

QWEN3 = {"bos_token_id": 151643, "do_sample": True, "eos_token_id": [151645, 151643], "pad_token_id": 151643,
         "temperature": 0.6, "top_k": 20, "top_p": 0.95, "transformers_version": "4.51.0"}


def _folder(path: Path, config: dict) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "generation_config.json").write_text(json.dumps(config))
    return path


def test_auto_reads_the_model_directory_and_keeps_the_sampling_fields(tmp_path):
    model = _folder(tmp_path / "model", QWEN3)
    assert sampling_defaults("auto", model) == {"temperature": 0.6, "top_p": 0.95, "top_k": 20}
    assert generation_config_file("auto", model) == model / "generation_config.json"


def test_vllm_reads_nothing_and_a_folder_reads_its_own(tmp_path):
    model = _folder(tmp_path / "model", QWEN3)
    other = _folder(tmp_path / "other", {"temperature": 0.2, "min_p": 0.05, "repetition_penalty": 1.1, "top_k": None})
    assert sampling_defaults("vllm", model) == {} and generation_config_file("vllm", model) is None
    assert sampling_defaults(str(other), model) == {"temperature": 0.2, "min_p": 0.05, "repetition_penalty": 1.1}


def test_a_gguf_file_or_a_directory_without_the_file_gives_no_defaults(tmp_path):
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert sampling_defaults("auto", gguf) == {} and sampling_defaults("auto", tmp_path) == {}


@pytest.mark.parametrize(("text", "match"), [
    (json.dumps({"top_p": 0}), "top_p"), (json.dumps({"temperature": "hot"}), "temperature"), ("{not json", "cannot read"),
])
def test_a_bad_file_is_refused_naming_it_and_the_field(tmp_path, text, match):
    (tmp_path / "generation_config.json").write_text(text)
    with pytest.raises(ValueError, match=match) as info:
        sampling_defaults("auto", tmp_path)
    assert "generation_config.json" in str(info.value) and "--generation-config" in str(info.value)
