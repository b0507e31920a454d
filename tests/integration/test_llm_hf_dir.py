"""`LLM` on an HF directory (config.json + sharded safetensors + tokenizer files), as a user would point it."""

from __future__ import annotations

import pytest

from checkpoints import save_tiny
from infer import LLM, SamplingParams
from infer.loader.tokenizer import Tokenizer
from infer.models.chat_template import ChatTemplateError


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, smollm2_gguf):
    tok = Tokenizer.from_path(smollm2_gguf)
    path = save_tiny("llama", tmp_path_factory.mktemp("hfdir"), sharded=True, vocab_size=tok.vocab_size,
                     eos_token_id=2, bos_token_id=1)
    tok.hf.save_pretrained(path)
    return path


def test_generate_and_chat_from_an_hf_directory(hf_dir):
    llm = LLM(str(hf_dir), max_seq_len=256, kv_cache_backend="contiguous", max_batch_size=4)
    assert llm.chat_template_name() == "chatml"
    outs = llm.generate(["Hello", "The sky"], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
    assert [len(o.token_ids) for o in outs] == [6, 6]
    reply = llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(temperature=0.7, seed=1, max_tokens=4))[0]
    assert reply.finish_reason in ("stop", "length")
    assert llm.engine.kv.audit_blocks() == {}


def test_a_tokenizer_without_chat_markers_fails_naming_the_template_folder(hf_dir, monkeypatch):
    llm = LLM(str(hf_dir), max_seq_len=64, max_batch_size=1)
    monkeypatch.setattr(llm.tokenizer, "has_token", lambda token: False)
    with pytest.raises(ChatTemplateError, match="templates"):
        llm.chat([{"role": "user", "content": "Hi"}])


def test_bad_engine_option_names_the_field(hf_dir):
    from infer.engine.config import EngineConfigError

    with pytest.raises(EngineConfigError, match="^kv_cache_backend="):
        LLM(str(hf_dir), kv_cache_backend="ring")
