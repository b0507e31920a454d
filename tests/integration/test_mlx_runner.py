"""The MLX runner (MLX's CPU backend, float32) against the torch runner on tiny Llama 3 / Qwen 3 / Gemma 3
checkpoints: logits within 1e-4 of torch's and transformers' (Mistral's and Phi-3's too, with their greedy tokens
equal to transformers'), the same greedy tokens through whole prompts, chunked prefill, prefix caching and
preemption, the same seeded samples alone and in batches, the same logprobs and structured outputs; a wait inside a
step fails it; unsupported features are declined at startup. Strict mode (INFER_STRICT_SYNC=1) is on for every
test."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

mx = pytest.importorskip("mlx.core")

from checkpoints import FAMILIES, VARIANTS, save_tiny, save_tiny_with_tokenizer  # noqa: E402
from infer import LLM, SamplingParams  # noqa: E402
from infer.engine.config import EngineConfigError  # noqa: E402
from infer.models.forward_batch import ForwardBatch  # noqa: E402
from infer.runners.mlx.attention import step_layout  # noqa: E402
from infer.runners.mlx.model import MlxModel, cache_arrays  # noqa: E402
from infer.runners.mlx.runner import MlxRunner  # noqa: E402
from infer.runners.mlx.weights import load_torch_model  # noqa: E402
from infer.runners.step import StepInput, StepKind  # noqa: E402
from infer.structured import Constraint  # noqa: E402
from test_chunked_prefill import GREEDY, _prompts, _staggered  # noqa: E402
from test_model_parity import CHECKPOINTS, greedy_prompts, transformers_greedy  # noqa: E402
from test_moe_parity import CHECKPOINTS as MOE_CHECKPOINTS  # noqa: E402
from test_model_parity import GREEDY as GREEDY_16  # noqa: E402

CONFIGS = {
    "whole_prompts": dict(use_chunked_prefill=False, use_prefix_caching=False),
    "chunks_of_1": dict(prefill_chunk_size=1, use_prefix_caching=False),
    "chunks_of_7_prefix_cache": dict(prefill_chunk_size=7, use_prefix_caching=True),
    "preemption": dict(prefill_chunk_size=5, num_kv_blocks=40, use_prefix_caching=True),
}


@pytest.fixture(autouse=True)
def _strict_sync(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")


@pytest.fixture(scope="module", params=FAMILIES)
def checkpoint(request, tmp_path_factory) -> str:
    return str(save_tiny_with_tokenizer(request.param, tmp_path_factory.mktemp(request.param), seed=3))


def _llm(path: str, runner: str, **options: object) -> LLM:
    llm = LLM(path, runner=runner, dtype="float32", max_seq_len=160, max_batch_size=8, block_size=4, **options)
    assert isinstance(llm.runner, MlxRunner) == (runner == "mlx")
    if runner == "mlx":
        llm.runner.launches_ahead = True  # as on Metal: step N + 1 encoded before step N is read
    return llm


@pytest.fixture(scope="module")
def expected(checkpoint) -> list[list[int]]:
    """The torch runner's greedy tokens, each prompt whole and alone."""
    llm = _llm(checkpoint, "torch", **CONFIGS["whole_prompts"])
    return [llm.generate_ids([p], GREEDY)[0].token_ids for p in _prompts()]


@pytest.mark.parametrize("name", [*CHECKPOINTS, *MOE_CHECKPOINTS])
def test_logits_match_torch_and_transformers(name, tmp_path) -> None:
    """Whole prompts through the paged cache (blocks out of order): every position's logits within 1e-4; the 40-token
    prompt outgrows Mistral's, Mixtral's and Phi-3's windows and Phi-3's original context."""
    family, overrides = {**CHECKPOINTS, **MOE_CHECKPOINTS}[name]
    path = save_tiny(family, tmp_path, **overrides)
    loaded = load_torch_model(path, "auto", "auto", 512)
    model = MlxModel(loaded, mx.float32, "auto")
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    caches = cache_arrays(loaded.config, 32, 4, mx.float32)
    long = [(7 * j) % 311 + 1 for j in range(40)]
    for i, prompt in enumerate([[3, 17, 9, 250, 4, 4, 100, 7, 1, 2, 3, 5, 8], [11], long]):
        n = len(prompt)
        table = [31 - b - 4 * i for b in range(-(-n // 4))]
        step = StepInput(StepKind.PREFILL, token_ids=prompt, positions=list(range(n)), query_lens=[n], context_lens=[n],
                         slot_mapping=[table[p // 4] * 4 + p % 4 for p in range(n)], block_tables=[table])
        layout = step_layout(step, 32, 4)
        ours = np.array(model.logits(model(mx.array(prompt), layout, caches)))
        with torch.no_grad():
            ref = loaded.model.compute_logits(loaded.model(torch.tensor(prompt), ForwardBatch.for_prompts([n])))
            ref_hf = hf(torch.tensor([prompt])).logits[0]
        assert np.abs(ours - ref.numpy()).max() < 1e-4
        assert np.abs(ours - ref_hf.numpy()).max() < 1e-4


@pytest.mark.parametrize("name", [*VARIANTS, "qwen3_moe", "mixtral-window"])
def test_mistral_phi3_and_moe_greedy_tokens_equal_transformers(name, tmp_path) -> None:
    """Both prompts in one batch (Phi-3: one sequence on LongRoPE's short factors, one on its long ones)."""
    family, overrides = {**VARIANTS, **MOE_CHECKPOINTS}[name]
    path = save_tiny_with_tokenizer(family, tmp_path, seed=3, **overrides)
    llm = LLM(str(path), runner="mlx", dtype="float32", max_seq_len=96, max_batch_size=4, block_size=4)
    assert isinstance(llm.runner, MlxRunner)
    got = [o.token_ids for o in llm.generate_ids(greedy_prompts(), GREEDY_16)]
    assert got == transformers_greedy(path, greedy_prompts())


@pytest.mark.parametrize("config", CONFIGS)
def test_greedy_tokens_equal_the_torch_runner(checkpoint, expected, config) -> None:
    llm = _llm(checkpoint, "mlx", **CONFIGS[config])
    if config == "preemption":
        assert [o.token_ids for o in llm.generate_ids(_prompts(), GREEDY)] == expected
        assert llm.engine.scheduler.num_preemptions > 0
    else:
        assert _staggered(llm, _prompts(), [GREEDY] * len(expected)) == expected
    assert (llm.engine.kv.prefix_hits > 0) == bool(CONFIGS[config].get("use_prefix_caching"))
    assert llm.engine.kv.audit_blocks() == {}


def test_seeded_sampling_equals_torch_alone_and_in_batches(checkpoint) -> None:
    prompts = _prompts()
    params = [SamplingParams(temperature=0.9, top_k=40, top_p=0.95, seed=100 + i, max_tokens=10, ignore_eos=True,
                             **({"presence_penalty": 0.4, "logit_bias": {5: 2.0}} if i % 2 else {}))
              for i in range(len(prompts))]
    whole = _llm(checkpoint, "torch", use_chunked_prefill=False)
    alone = [whole.generate_ids([p], q)[0].token_ids for p, q in zip(prompts, params)]
    mlx_whole = _llm(checkpoint, "mlx", use_chunked_prefill=False)
    assert [mlx_whole.generate_ids([p], q)[0].token_ids for p, q in zip(prompts, params)] == alone
    assert _staggered(_llm(checkpoint, "mlx", prefill_chunk_size=7), prompts, params) == alone
    tight = _llm(checkpoint, "mlx", **CONFIGS["preemption"])
    assert [o.token_ids for o in tight.generate_ids(prompts, params)] == alone


def _outputs(llm: LLM, prompts: list[list[int]], params: list[SamplingParams]) -> dict[str, list]:
    engine = llm.engine
    ids = [engine.add_request(p, q).request_id for p, q in zip(prompts, params)]
    got: dict[str, list] = {i: [] for i in ids}
    while engine.has_unfinished():
        for out in engine.step():
            assert out.error is None, out.error
            got[out.request_id].append(out)
    return got


def test_logprobs_and_repetition_penalty_equal_the_torch_runner(checkpoint) -> None:
    prompts = _prompts()[:3]
    params = [SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=3, prompt_logprobs=2),
              SamplingParams(temperature=0.8, seed=9, max_tokens=6, ignore_eos=True, repetition_penalty=1.4),
              SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)]
    ref, ours = (_outputs(_llm(checkpoint, r), prompts, params) for r in ("torch", "mlx"))
    for a, b in zip(ref.values(), ours.values()):
        assert [o.token_id for o in a] == [o.token_id for o in b]
        for x, y in zip(a, b):
            assert (x.logprob is None) == (y.logprob is None)
            if x.logprob is not None:
                assert abs(x.logprob.logprob - y.logprob.logprob) < 1e-4
                assert [t for t, _ in x.logprob.top] == [t for t, _ in y.logprob.top]
        prompt_ref, prompt_ours = a[0].prompt_logprobs, b[0].prompt_logprobs
        assert (prompt_ref is None) == (prompt_ours is None)
        if prompt_ref is not None:
            assert len(prompt_ref) == len(prompt_ours) and prompt_ours[0] is None
            for x, y in zip(prompt_ref[1:], prompt_ours[1:]):
                assert x.token_id == y.token_id and abs(x.logprob - y.logprob) < 1e-4 * max(1.0, abs(x.logprob))


def test_structured_output_equals_the_torch_runner(checkpoint) -> None:
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=16, structured=c) for s, c in enumerate([
        Constraint("regex", r"[a-z]{3}-[0-9]{2}"), None, Constraint.choice(["yes", "no", "maybe"])])]
    prompts = ["The cat", "Call", "yes or no?"]
    ref, ours = (_llm(checkpoint, r).generate(prompts, params) for r in ("torch", "mlx"))
    assert [o.token_ids for o in ours] == [o.token_ids for o in ref]


SYNCS = {"item": lambda a: a.item(), "tolist": lambda a: a.tolist(), "np.array": lambda a: np.array(a),
         "mx.eval": lambda a: mx.eval(a)}


@pytest.mark.parametrize("call", SYNCS)
def test_a_wait_inside_a_step_fails_that_step(checkpoint, call, monkeypatch) -> None:
    llm = _llm(checkpoint, "mlx")
    model = llm.runner.model
    logits = model.logits

    def waiting(hidden):  # noqa: ANN001, ANN202
        out = logits(hidden)
        SYNCS[call](out)
        return out

    monkeypatch.setattr(model, "logits", waiting)
    with pytest.raises(RuntimeError, match="SyncInStepError.*encode phase"):
        llm.generate_ids([[1, 2, 3]], GREEDY)


@pytest.mark.parametrize("option, field", [
    (dict(speculative_method="ngram"), "speculative_method"), (dict(quantization="int4"), "quantization"),
    (dict(device="cuda"), "device"),
])
def test_unsupported_features_are_declined_at_startup(checkpoint, option, field) -> None:
    with pytest.raises(EngineConfigError, match=f"^{field}="):
        _llm(checkpoint, "mlx", **option)


def test_the_runner_counts_where_its_steps_spend_time(checkpoint) -> None:
    """Per-step profiling counters: every submitted step encoded and submitted, every one read back once."""
    llm = _llm(checkpoint, "mlx")
    profile = llm.runner.profile
    llm.generate_ids(_prompts()[:3], GREEDY)
    assert profile.steps > 0 and profile.waits == profile.steps
    assert profile.encode_s > 0 and profile.submit_s > 0 and profile.wait_s >= 0 and profile.readback_s > 0
    assert set(profile.per_step_ms()) == {"encode", "submit", "wait", "readback"}
