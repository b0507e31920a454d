"""What each model family is, declared once: read by the config parser, the GGUF loader, the chat-template choice
and the model registry (infer/models/registry.py maps each declared family to its torch class). Torch-free: the API
server reads it to pick a chat template."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """One `model_type` of an HF config.json and how infer reads it."""

    model_type: str
    # (template name, a special token whose presence in the vocabulary selects it), in order
    chat_templates: tuple[tuple[str, str], ...]
    gguf_architecture: str | None = None  # llama.cpp's `general.architecture`, where it writes this family
    sliding_every_layer: bool = False  # the config's sliding_window, when set, covers every layer


# Mistral's [INST] format where the vocabulary has the token, else Llama's; llama.cpp writes Mistral as "llama"
LLAMA_TEMPLATES = (("mistral", "[INST]"), ("llama3", "<|eot_id|>"), ("chatml", "<|im_start|>"))

FAMILIES: dict[str, Family] = {f.model_type: f for f in (
    Family("llama", LLAMA_TEMPLATES, gguf_architecture="llama"),
    Family("mistral", LLAMA_TEMPLATES, sliding_every_layer=True),
    Family("qwen3", (("qwen3", "<|im_start|>"),), gguf_architecture="qwen3"),
    Family("gemma3_text", (("gemma3", "<start_of_turn>"),), gguf_architecture="gemma3"),
    Family("phi3", (("phi3", "<|assistant|>"),), gguf_architecture="phi3", sliding_every_layer=True),
)}
SUPPORTED_MODEL_TYPES = tuple(FAMILIES)
GGUF_ARCHITECTURES = {f.gguf_architecture: f.model_type for f in FAMILIES.values() if f.gguf_architecture}


def family(model_type: str) -> Family:
    """The declared family; ValueError naming the supported ones."""
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not supported (supported: {', '.join(FAMILIES)})")
    return FAMILIES[model_type]
