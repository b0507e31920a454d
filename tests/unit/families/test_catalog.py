"""Each family declared once: its chat template is picked by its marker token (Mistral's [INST] format for Mistral
checkpoints and for Mistral GGUFs, written as "llama", else Llama's templates; Phi-3's by <|assistant|>), and the torch
model of every family is built from the declaration, weight names included."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors import safe_open

from checkpoints import save_tiny
from infer.families.chat_template import chat_template_name
from infer.families.catalog import FAMILIES, SUPPORTED_MODEL_TYPES
from infer.families.config import config_from_hf
from infer.loader.model_loader import build_model
from infer.models.moe import SparseMLP


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


@pytest.mark.parametrize("model_type", SUPPORTED_MODEL_TYPES)
def test_every_family_builds_the_blocks_it_declares(model_type: str, tmp_path) -> None:
    """The torch model reads the declaration: QK-norm, sandwich norms, norm offset, fused checkpoint names, local rope,
    sparse layers; and its weight map names exactly the tensors transformers writes for the same config."""
    fam = FAMILIES[model_type]
    checkpoint = save_tiny({"gemma3_text": "gemma3"}.get(model_type, model_type), tmp_path)
    cfg = config_from_hf(json.loads((checkpoint / "config.json").read_text()))
    model = build_model(cfg, torch.float32, "cpu", 64, deferred=True)
    block = model.blocks[0]
    assert (block.attn.q_norm is not None) == fam.qk_norm
    assert (block.post_attn_norm is not None) == (block.post_mlp_norm is not None) == fam.sandwich_norms
    assert block.input_norm.weight_offset == model.final_norm.weight_offset == fam.norm_offset
    assert {b.rope_kind for b in model.blocks} == ({"local", "global"} if fam.local_rope else {"global"})
    assert any(isinstance(b.mlp, SparseMLP) for b in model.blocks) == (fam.moe is not None)
    with safe_open(checkpoint / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert set(model.weight_map()) == names
