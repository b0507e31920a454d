"""model_type -> the torch model class of each family declared in infer/families/catalog.py."""

from __future__ import annotations

from infer.families.catalog import family
from infer.models.base import CausalLM
from infer.models.gemma3 import Gemma3ForCausalLM
from infer.models.llama import LlamaForCausalLM
from infer.models.phi3 import Phi3ForCausalLM
from infer.models.qwen3 import Qwen3ForCausalLM

MODEL_CLASSES: dict[str, type[CausalLM]] = {
    "llama": LlamaForCausalLM,
    "mistral": LlamaForCausalLM,
    "qwen3": Qwen3ForCausalLM,
    "gemma3_text": Gemma3ForCausalLM,
    "phi3": Phi3ForCausalLM,
}


def model_class(model_type: str) -> type[CausalLM]:
    """The family's torch class; ValueError naming the supported families."""
    return MODEL_CLASSES[family(model_type).model_type]
