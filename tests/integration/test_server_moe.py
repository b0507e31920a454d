"""Mixtures of experts served by `infer serve` on the CPU and read through the openai client: a tiny Qwen 3 MoE
checkpoint directory and a Mixtral GGUF as llama.cpp writes it, streamed and whole, with the engine's greedy tokens."""

from __future__ import annotations

import openai
import pytest
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


@pytest.mark.parametrize("form", ["qwen3_moe-dir", "mixtral-gguf"])
def test_served_moe_answers_as_the_engine(form, tmp_path):
    family = form.split("-")[0]
    directory = save_tiny_with_tokenizer(family, tmp_path / "model", seed=5,
                                         **({"sliding_window": None} if family == "mixtral" else {}))
    path = directory
    if form.endswith("gguf"):
        hf = AutoModelForCausalLM.from_pretrained(directory)
        path = write_moe_gguf(hf, tmp_path / "mixtral.gguf", tokenizer_dir=directory)
    with LLM(str(path), max_seq_len=256) as llm:
        want = llm.generate(PROMPT, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))[0].text
    with serve_process("--model", str(path), "--max-seq-len", "256", "--api-server-count", "1") as served:
        listed = openai.OpenAI(base_url=f"{served.base_url}/v1", api_key="unused").models.list().data[0].id
        whole, streamed = _served_text(served.base_url, listed)
    assert whole == streamed == want and len(want) > 0
