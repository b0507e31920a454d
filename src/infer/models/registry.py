"""model_type -> model class and the chat templates it may use (picked by the tokenizer's special tokens)."""

from __future__ import annotations

from dataclasses import dataclass

from infer.models.base import CausalLM
from infer.models.gemma3 import Gemma3ForCausalLM
from infer.models.llama import LlamaForCausalLM
from infer.models.phi3 import Phi3ForCausalLM
from infer.models.qwen3 import Qwen3ForCausalLM


@dataclass(frozen=True)
class ModelSpec:
    model_cls: type[CausalLM]
    # (template name, a special token whose presence in the vocabulary selects it), in order
    chat_templates: tuple[tuple[str, str], ...]


# Mistral's [INST] format where the vocabulary has the token, else Llama's; llama.cpp writes Mistral as "llama"
LLAMA_TEMPLATES = (("mistral", "[INST]"), ("llama3", "<|eot_id|>"), ("chatml", "<|im_start|>"))

REGISTRY: dict[str, ModelSpec] = {
    "llama": ModelSpec(LlamaForCausalLM, LLAMA_TEMPLATES),
    "mistral": ModelSpec(LlamaForCausalLM, LLAMA_TEMPLATES),
    "qwen3": ModelSpec(Qwen3ForCausalLM, (("qwen3", "<|im_start|>"),)),
    "gemma3_text": ModelSpec(Gemma3ForCausalLM, (("gemma3", "<start_of_turn>"),)),
    "phi3": ModelSpec(Phi3ForCausalLM, (("phi3", "<|assistant|>"),)),
}


def model_spec(model_type: str) -> ModelSpec:
    if model_type not in REGISTRY:
        raise ValueError(f"model_type {model_type!r} is not supported (supported: {', '.join(REGISTRY)})")
    return REGISTRY[model_type]
