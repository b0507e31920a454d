"""The MLX runner on the bundled SmolLM2 GGUF (strict mode on): greedy tokens with every weight dequantized equal the
torch runner's on real chat prompts; with quantization="auto" every linear weight stays 4-bit (Q4_1 as MLX's affine
groups), the head 8-bit (Q8_0), and greedy tokens equal the torch runner's keeping the same weights quantized. Both
runners compute in the MLX runner's default dtype (float16 on a Mac), so a Mac compares like with like."""

from __future__ import annotations

import pytest

mx = pytest.importorskip("mlx.core")

from infer import LLM, SamplingParams  # noqa: E402

pytestmark = pytest.mark.slow

QUESTIONS = ["What is the capital of France?", "Name three colours of the rainbow.", "Write a haiku about the sea."]
GREEDY = SamplingParams(temperature=0, max_tokens=20)


@pytest.fixture(autouse=True)
def _strict_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")


def _dtype() -> str:
    """What the MLX runner computes in by default (float16 on Metal, float32 on MLX's CPU backend): the torch runner
    it is compared with runs in the same dtype."""
    from infer.build.mlx_builder import mlx_dtype_name
    from infer.engine.config import EngineConfig

    return mlx_dtype_name(EngineConfig(runner="mlx"))


def _prompts(llm: LLM) -> list[list[int]]:
    return [llm.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]


def test_greedy_tokens_equal_the_torch_runner(smollm2_gguf) -> None:
    ref = LLM(str(smollm2_gguf), runner="torch", device="cpu", dtype=_dtype(), quantization="none", max_seq_len=256)
    ours = LLM(str(smollm2_gguf), runner="mlx", dtype=_dtype(), quantization="none", max_seq_len=256)
    prompts = _prompts(ref)
    expected = [o.token_ids for o in ref.generate_ids(prompts, GREEDY)]
    assert [o.token_ids for o in ours.generate_ids(prompts, GREEDY)] == expected
    assert ours.runner.model.quantized_linears == 0


def test_gguf_weights_stay_quantized(smollm2_gguf) -> None:
    """Q4_1 linears as MLX's 4-bit groups and the Q8_0 head 8-bit: the same greedy tokens as the torch runner keeping
    the same weights quantized (its native int4 / int8 kernels)."""
    ours = LLM(str(smollm2_gguf), runner="mlx", dtype=_dtype(), max_seq_len=256)
    model = ours.runner.model
    assert model.quantized_linears == 4 * model.config.num_hidden_layers
    assert {layer.qkv.bits for layer in model.layers} == {4} and model.head.bits == 8
    ref = LLM(str(smollm2_gguf), runner="torch", device="cpu", dtype=_dtype(), max_seq_len=256)
    prompts = _prompts(ref)
    assert [o.token_ids for o in ours.generate_ids(prompts, GREEDY)] == [o.token_ids for o in ref.generate_ids(prompts, GREEDY)]


def test_the_kv_cache_is_written_in_place_under_launch_ahead(smollm2_gguf) -> None:
    """MLX copies an array it cannot update in place, and a copied layer cache shows in its peak memory: with step
    N + 1 encoded before step N is read (launch-ahead), the peak over the steps stays far below one layer's cache
    (it reached one layer's size while the step's evaluation also held the caches)."""
    llm = LLM(str(smollm2_gguf), runner="mlx", max_seq_len=512, max_batch_size=8, kv_cache_memory_gb=0.7)
    llm.runner.launches_ahead = True  # as on Metal (MLX's CPU backend runs steps serially by default)
    layer = llm.runner.kv_caches[0][0].nbytes
    prompts = _prompts(llm)
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    llm.generate_ids(prompts, greedy)  # every shape once
    mx.synchronize()
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    llm.generate_ids(prompts, greedy)
    mx.synchronize()
    assert mx.get_peak_memory() - before < layer / 2, (mx.get_peak_memory() - before, layer)
