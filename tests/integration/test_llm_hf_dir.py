"""`LLM` on an HF directory (config.json + sharded safetensors + tokenizer files), as a user would point it."""

from __future__ import annotations

import pytest

from checkpoints import save_tiny
from infer import LLM, SamplingParams
from infer.loader.tokenizer import Tokenizer
from infer.families.chat_template import ChatTemplateError


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, smollm2_gguf):
    tok = Tokenizer.from_path(smollm2_gguf)
    path = save_tiny("llama", tmp_path_factory.mktemp("hfdir"), sharded=True, vocab_size=tok.vocab_size,
                     eos_token_id=2, bos_token_id=1)
    tok.to_transformers().save_pretrained(path)
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


@pytest.fixture(scope="module")
def tiny_llm(hf_dir):
    return LLM(str(hf_dir), max_seq_len=128, max_batch_size=8, block_size=4)


GREEDY8 = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_contiguous_and_paged_engines_agree(hf_dir, tiny_llm):
    contiguous = LLM(str(hf_dir), max_seq_len=128, max_batch_size=4, kv_cache_backend="contiguous")
    prompts = [[5, 6, 7], [9] * 11, [100, 200]]
    assert [o.token_ids for o in contiguous.generate_ids(prompts, GREEDY8)] == \
           [o.token_ids for o in tiny_llm.generate_ids(prompts, GREEDY8)]


def test_bad_prompts_are_rejected_before_anything_is_queued(tiny_llm):
    vocab = tiny_llm.runner.vocab_size
    for bad in ([], [vocab], [-1], [1] * 200):
        with pytest.raises(ValueError):
            tiny_llm.generate_ids([[5, 6], bad], GREEDY8)
    assert not tiny_llm.engine.has_unfinished()
    tiny_llm.engine.add_request([5], GREEDY8, request_id="dup")
    with pytest.raises(ValueError, match="already in use"):
        tiny_llm.engine.add_request([6], GREEDY8, request_id="dup")
    tiny_llm.engine.abort("dup")
    assert [o.finish_reason for o in tiny_llm.engine.step()] == ["abort"]


def test_abort_ends_waiting_and_running_requests_with_one_final_output(tiny_llm):
    engine = tiny_llm.engine
    running = engine.add_request([5, 6, 7], GREEDY8)
    engine.step()  # prefill: now running, holding blocks
    waiting = engine.add_request([8, 9], GREEDY8)
    engine.abort(running.request_id)
    engine.abort(waiting.request_id)
    assert engine.kv.audit_blocks()  # nothing is freed until the next step
    outs = engine.step()
    finals = {o.request_id: o.finish_reason for o in outs if o.finished}
    assert finals == {running.request_id: "abort", waiting.request_id: "abort"}
    assert running.finished and waiting.finished
    assert not engine.has_unfinished() and engine.kv.audit_blocks() == {}


def test_closing_a_stream_early_frees_its_blocks(tiny_llm):
    stream = tiny_llm.stream([5, 6, 7], SamplingParams(temperature=0, max_tokens=50, ignore_eos=True))
    next(stream)
    stream.close()
    assert not tiny_llm.engine.has_unfinished() and tiny_llm.engine.kv.audit_blocks() == {}


def test_a_failing_step_fails_its_batch_and_the_engine_keeps_serving(tiny_llm, monkeypatch):
    engine = tiny_llm.engine
    request = engine.add_request([5, 6, 7], GREEDY8)
    monkeypatch.setattr(tiny_llm.runner, "forward", lambda step: (_ for _ in ()).throw(RuntimeError("boom")))
    (out,) = engine.step()
    assert out.finished and out.finish_reason == "error" and "boom" in out.error
    assert request.state.value == "failed" and engine.kv.audit_blocks() == {}
    monkeypatch.undo()
    assert len(tiny_llm.generate_ids([[5, 6, 7]], GREEDY8)[0].token_ids) == 8
