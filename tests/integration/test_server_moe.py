"""Mixtures of experts served by `infer serve` on the CPU and read through the openai client: a tiny Qwen 3 MoE
checkpoint directory, a Mixtral GGUF as llama.cpp writes it (float32, and with its experts stored Q4_0 and kept so),
streamed and whole, with the engine's greedy tokens."""

from __future__ import annotations

import openai
import pytest
from gguf import GGMLQuantizationType as Q
from transformers import AutoModelForCausalLM

from checkpoints import save_tiny_with_tokenizer, write_moe_gguf
from infer import LLM, SamplingParams
from server_harness import serve_process

PROMPT = "The cat sat"


def _served_text(base_url: str, model: str) -> tuple[str, str]:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused", max_retries=0, timeout=120)
    whole = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0,
                                      extra_body={"ignore_eos": True}).choices[0].text
    stream = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0, stream=True,
                                       extra_body={"ignore_eos": True})
    return whole, "".join(chunk.choices[0].text for chunk in stream if chunk.choices)


@pytest.mark.parametrize("form", ["qwen3_moe-dir", "mixtral-gguf", "mixtral-gguf-quantized"])
def test_served_moe_answers_as_the_engine(form, tmp_path):
    family, quantized = form.split("-")[0], form.endswith("quantized")
    overrides = {"sliding_window": None, "intermediate_size": 64} if family == "mixtral" else {}
    directory = save_tiny_with_tokenizer(family, tmp_path / "model", seed=5, **overrides)
    path = directory
    if "gguf" in form:
        hf = AutoModelForCausalLM.from_pretrained(directory)
        kinds = {name: Q.Q4_0 for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")} if quantized else None
        path = write_moe_gguf(hf, tmp_path / "mixtral.gguf", directory, kinds)
    with LLM(str(path), max_seq_len=256) as llm:
        want = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].text
    with serve_process("--model", str(path), "--max-seq-len", "256", "--api-server-count", "1") as served:
        listed = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused").models.list().data[0].id
        whole, streamed = _served_text(served.base_url, listed)
    assert whole == streamed == want and len(want) > 0
