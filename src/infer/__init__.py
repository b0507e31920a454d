"""infer: an LLM inference runtime with its own Llama 3 / Qwen 3 / Gemma 3 models."""

from typing import Any

__all__ = ["LLM", "LoRARequest", "RequestOutput", "SamplingParams"]


def __getattr__(name: str) -> Any:
    # lazy, so `infer --help` and light submodule imports do not load torch models and tokenizers
    if name in ("LLM", "RequestOutput"):
        from infer import llm

        return getattr(llm, name)
    if name == "LoRARequest":
        from infer.lora.request import LoRARequest

        return LoRARequest
    if name == "SamplingParams":
        from infer.sampling.params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'infer' has no attribute {name!r}")
