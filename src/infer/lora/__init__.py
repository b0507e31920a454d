"""LoRA adapters: many PEFT fine-tunes served over one base model, mixed in one batch (docs/lora.md)."""

from infer.lora.adapter import LoRAError
from infer.lora.request import LoRARequest

__all__ = ["LoRAError", "LoRARequest"]
