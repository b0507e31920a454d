"""benchmarks/model_shapes.py: real shapes load through our loader and transformers; roofline arithmetic."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import model_shapes as ms  # noqa: E402

from infer import LLM, SamplingParams  # noqa: E402
from infer.loader.model_loader import build_model, read_config  # noqa: E402
from infer.loader.tokenizer import Tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("shapes")


@pytest.mark.parametrize("name", list(ms.SHAPES))
def test_model_dir_loads_config_and_tokenizer(root: Path, name: str):
    path = ms.write_model_dir(name, root)
    cfg = read_config(path)
    tok = Tokenizer.from_path(path)
    d = ms.SHAPES[name]
    assert cfg.vocab_size == tok.vocab_size == d["vocab_size"]
    eos = d["eos_token_id"]
    assert set(eos if isinstance(eos, list) else [eos]) <= tok.eos_token_ids
    assert tok.encode("t3 t17", add_special_tokens=False) == [3, 17]
    assert tok.kind in ("PreTrainedTokenizerFast", "TokenizersBackend")


@pytest.mark.parametrize("name", ms.GPU_SHAPES)
def test_transformers_reads_the_same_shape(name: str):
    cfg, hf = ms.model_config(name), ms.hf_config(name)
    shape = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_key_value_heads", "head_dim", "vocab_size")
    assert [getattr(hf, k) for k in shape] == [getattr(cfg, k) for k in shape]
    assert hf.tie_word_embeddings == cfg.tie_word_embeddings
    if name == "gemma-3-1b":
        assert tuple(hf.layer_types) == cfg.layer_types


@pytest.mark.parametrize("name", ms.GPU_SHAPES)
def test_weight_bytes_match_the_meta_model(name: str):
    cfg = ms.model_config(name)
    model = build_model(cfg, torch.bfloat16, "meta", 8192)
    stored = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied head is one parameter
    untied_table = 0 if cfg.tie_word_embeddings else cfg.vocab_size * cfg.hidden_size * 2
    assert ms.weight_bytes(cfg) == stored - untied_table + cfg.hidden_size * 2  # the table is read one row a token
    if name == "llama-3.2-1b":
        assert ms.weight_bytes(cfg) == pytest.approx(2.47e9, rel=0.01)


def test_sliding_layers_read_at_most_their_window():
    cfg = ms.model_config("gemma-3-1b")
    assert sum(cfg.is_sliding(i) for i in range(cfg.num_hidden_layers)) == 22
    assert ms.visible_tokens(cfg, 4096) == 22 * 512 + 4 * 4096
    assert ms.kv_read_bytes(cfg, 4096) == 2 * (22 * 512 + 4 * 4096) * 256 * 2
    assert ms.prefill_flops(cfg, 1) == ms.flops_per_token(cfg, 1)  # a one-token prompt is one decode step


def test_tiny_shape_generates_with_dummy_weights(root: Path):
    llm = LLM(str(ms.write_model_dir("tiny-llama", root)), load_format="dummy", device="cpu", max_seq_len=256)
    out = llm.generate([[5, 6, 7]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    assert len(out[0].token_ids) == 4
