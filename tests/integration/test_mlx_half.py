"""The MLX runner in float16 and bfloat16 against the torch model in the same dtype, not float32: on tiny Llama 3 and
Gemma 3 checkpoints and on a Llama GGUF whose projections stay 4-bit, every position's logits are as far from the
float32 model's as the torch model's in that dtype are (at most 1.8x, measured 0.8-1.5x); before the 4-bit path ran
its matmuls on float32 rows on MLX's CPU backend it was 2.3-3.4x. Greedy tokens in float16 equal the torch runner's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType

mx = pytest.importorskip("mlx.core")

from checkpoints import save_tiny, save_tiny_with_tokenizer, write_llama_gguf  # noqa: E402
from infer import LLM, SamplingParams  # noqa: E402
from infer.loader.model_loader import load_model  # noqa: E402
from infer.models.forward_batch import ForwardBatch  # noqa: E402
from infer.runners.mlx.attention import step_layout  # noqa: E402
from infer.runners.mlx.model import MlxModel, cache_arrays  # noqa: E402
from infer.runners.mlx.weights import load_torch_model  # noqa: E402
from infer.runners.step import StepInput, StepKind  # noqa: E402

DTYPES = {"float16": (mx.float16, torch.float16), "bfloat16": (mx.bfloat16, torch.bfloat16)}
PROMPTS = [[3, 17, 9, 250, 4, 4, 100, 7, 1, 2, 3, 5, 8], [11], [(7 * j) % 311 + 1 for j in range(40)]]
Q4 = {name: GGMLQuantizationType.Q4_0 for name in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up",
                                                   "ffn_down")}
BOUND, FLOOR = 1.8, 1e-3  # MLX's distance from float32 <= BOUND x torch's in the same dtype + FLOOR


@pytest.fixture(scope="module", params=["llama", "gemma3", "llama-q4-gguf"])
def checkpoint(request, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp(request.param)
    if request.param == "llama-q4-gguf":
        return write_llama_gguf(folder / "q4.gguf", kinds=Q4)[0]
    return save_tiny(request.param, folder)


def _mlx_logits(model: MlxModel, dtype, prompt: list[int]) -> np.ndarray:
    caches = cache_arrays(model.config, 32, 4, dtype)
    n = len(prompt)
    table = [31 - b for b in range(-(-n // 4))]
    step = StepInput(StepKind.PREFILL, token_ids=prompt, positions=list(range(n)), query_lens=[n], context_lens=[n],
                     slot_mapping=[table[p // 4] * 4 + p % 4 for p in range(n)], block_tables=[table])
    hidden = model(mx.array(prompt), step_layout(step, 32, 4), caches)
    return np.array(model.logits(hidden).astype(mx.float32))


def _torch_logits(path: Path, dtype: torch.dtype, prompt: list[int]) -> np.ndarray:
    model = load_model(path, dtype, "cpu", 512).model
    with torch.no_grad():
        return model.compute_logits(model(torch.tensor(prompt), ForwardBatch.for_prompts([len(prompt)]))).numpy()


@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_are_as_close_to_float32_as_torch_in_the_same_dtype(checkpoint, dtype):
    mx_dtype, torch_dtype = DTYPES[dtype]
    model = MlxModel(load_torch_model(checkpoint, "auto", "auto", 512), mx_dtype, "auto")
    if checkpoint.suffix == ".gguf":
        assert model.quantized_linears == 4 * model.config.num_hidden_layers  # qkv, o, gate_up, down stay 4-bit
    for prompt in PROMPTS:
        exact = _torch_logits(checkpoint, torch.float32, prompt)
        theirs = np.abs(_torch_logits(checkpoint, torch_dtype, prompt) - exact).max()
        ours = np.abs(_mlx_logits(model, mx_dtype, prompt) - exact).max()
        assert ours <= BOUND * theirs + FLOOR, (dtype, len(prompt), ours, theirs)


def test_float16_greedy_tokens_equal_the_torch_runner(tmp_path):
    path = str(save_tiny_with_tokenizer("llama", tmp_path, seed=3))
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    options = dict(dtype="float16", max_seq_len=128, max_batch_size=4, block_size=4)
    want = [o.token_ids for o in LLM(path, runner="torch", device="cpu", **options).generate_ids(PROMPTS, greedy)]
    assert [o.token_ids for o in LLM(path, runner="mlx", **options).generate_ids(PROMPTS, greedy)] == want
