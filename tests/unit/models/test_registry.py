"""Each family's chat template is picked by its marker token: Mistral's [INST] format for Mistral checkpoints and for
Mistral GGUFs (written as "llama"), else Llama's templates; Phi-3's by <|assistant|>."""

from __future__ import annotations

import pytest

from infer.families.chat_template import chat_template_name
from infer.families.catalog import SUPPORTED_MODEL_TYPES
from infer.models.registry import MODEL_CLASSES


class Vocabulary:
    """A tokenizer as the template choice sees it: which tokens it has."""

    def __init__(self, *tokens: str) -> None:
        self.tokens = set(tokens)

    def has_token(self, token: str) -> bool:
        return token in self.tokens


@pytest.mark.parametrize(("model_type", "tokens", "template"), [
    ("mistral", ("[INST]", "[/INST]", "</s>"), "mistral"),
    ("llama", ("[INST]", "[/INST]", "</s>"), "mistral"),
    ("mistral", ("<|im_start|>",), "chatml"),
    ("llama", ("<|eot_id|>",), "llama3"),
    ("phi3", ("<|user|>", "<|assistant|>", "<|end|>"), "phi3"),
])
def test_marker_tokens_pick_the_template(model_type: str, tokens: tuple[str, ...], template: str) -> None:
    assert chat_template_name(model_type, Vocabulary(*tokens)) == template


def test_the_registry_has_a_class_for_every_declared_family() -> None:
    assert tuple(MODEL_CLASSES) == SUPPORTED_MODEL_TYPES
