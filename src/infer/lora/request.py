"""`LoRARequest`: which adapter an offline `LLM.generate` call runs, by vLLM's names so scripts carry over."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LoRARequest:
    """A PEFT adapter directory served under `lora_name`. `lora_int_id` is the caller's id for it (vLLM's); the
    engine keys adapters by name and gives each its own id, so two requests naming one adapter share its KV."""

    lora_name: str
    lora_int_id: int
    lora_path: str

    def __post_init__(self) -> None:
        if not isinstance(self.lora_name, str) or not self.lora_name:
            raise ValueError(f"LoRARequest.lora_name must be a non-empty string, got {self.lora_name!r}")
        if not isinstance(self.lora_int_id, int) or self.lora_int_id < 1:
            raise ValueError(f"LoRARequest.lora_int_id must be an integer >= 1, got {self.lora_int_id!r}")
