"""A model's recommended sampling settings from its generation_config.json, as vLLM's `--generation-config` reads
them: the server's defaults for requests that leave those fields out."""

from __future__ import annotations

import json
from pathlib import Path

from infer.sampling.params import SamplingParams

SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")  # what vLLM takes from the file


def generation_config_file(setting: str, model_path: Path) -> Path | None:
    """The generation_config.json `setting` names: the model directory's ("auto"), none ("vllm"), or a folder's;
    None when there is no such file (a GGUF file has none)."""
    if setting == "vllm":
        return None
    file = (model_path if setting == "auto" else Path(setting).expanduser()) / "generation_config.json"
    return file if file.is_file() else None


def sampling_defaults(setting: str, model_path: Path) -> dict[str, float | int]:
    """The sampling fields the generation config sets (temperature, top_p, top_k, min_p, repetition_penalty);
    ValueError naming the file and the field when it is not valid JSON or a value is out of range."""
    file = generation_config_file(setting, model_path)
    if file is None:
        return {}
    try:
        data = json.loads(file.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"--generation-config: cannot read {file}: {exc}") from None
    found = {k: data[k] for k in SAMPLING_KEYS if isinstance(data, dict) and data.get(k) is not None}
    try:
        SamplingParams(**found)  # type: ignore[arg-type]
    except ValueError as exc:
        raise ValueError(f"--generation-config: {file}: {exc}") from None
    return found
