"""Tensor parallelism on the CPU (gloo, 2 processes, 4 in one test): the same tokens and logits as one process,
refusals, failures.

Every TP engine here is rank 0 in the test process with its workers spawned beside it; each family's engines are
built once per module (graphs on and off) and closed at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from checkpoints import quantize_checkpoint, save_tiny, save_tiny_with_tokenizer
from probe_sets import Spec, write_probe_set
from infer import LLM, SamplingParams
from infer.distributed.group import DistributedError, free_port
from infer.engine.config import EngineConfigError

PROMPTS = [[1, 5, 9, 33, 17, 3, 200, 41], [7, 7, 90], list(range(40, 75))]
GREEDY = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=3, prompt_logprobs=2)
SEEDED = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_tokens=10, ignore_eos=True)


def _run(llm: LLM, params: SamplingParams) -> list[tuple[list[int], list[float], list[float]]]:
    """Per prompt: the tokens, their logprobs and the prompt tokens' logprobs (teacher-forced logits)."""
    out = []
    for ids in PROMPTS:
        tokens, logprobs, prompt = [], [], []
        for step in llm.stream(ids, params):
            if step.prompt_logprobs is not None:
                prompt = [lp.logprob for lp in step.prompt_logprobs if lp is not None]
            if step.token_id is not None:
                tokens.append(step.token_id)
                logprobs.append(step.logprob.logprob if step.logprob is not None else 0.0)
        out.append((tokens, logprobs, prompt))
    return out


# the tiny MoEs' CPU layers may read their routing on the host (reference.fused_moe: Qwen 3 MoE's 24-wide experts are
# not whole 16-column steps for the native kernel), so their decode steps need not be recorded
MOE = ("qwen3_moe", "mixtral")


@pytest.fixture(scope="module", params=["llama", "qwen3", "gemma3", *MOE])
def family_runs(request, tmp_path_factory):
    """(TP=1 results, {graphs: TP=2 results}) for one family (gemma3 replicates its single KV head; the MoE families
    shard every expert's intermediate dimension)."""
    path = save_tiny_with_tokenizer(request.param, tmp_path_factory.mktemp(request.param))
    with LLM(str(path)) as one:
        reference = [_run(one, GREEDY), _run(one, SEEDED)]
    sharded = {}
    for graphs in (None, False):  # None: the CPU's recorded decode graphs (the default); False: eager
        with LLM(str(path), tensor_parallel_size=2, use_cuda_graphs=graphs) as two:
            sharded[graphs] = [_run(two, GREEDY), _run(two, SEEDED)]
            if graphs is None and request.param not in MOE:
                assert two.runner.graph_stats.batch_sizes, "no decode graph was recorded"
                assert not two.runner.graphs.eager
    return reference, sharded


@pytest.mark.parametrize("graphs", [None, False], ids=["graphs", "eager"])
def test_tp2_tokens_and_logits_equal_tp1(family_runs, graphs):
    reference, sharded = family_runs
    for ref, got in zip(reference, sharded[graphs]):
        for (ref_tokens, ref_lp, ref_prompt), (tokens, lp, prompt) in zip(ref, got):
            assert tokens == ref_tokens
            assert lp == pytest.approx(ref_lp, abs=2e-4)
            assert prompt == pytest.approx(ref_prompt, abs=2e-4)


@pytest.mark.parametrize("family", ["llama", "qwen3_moe"])
def test_tp4_tokens_and_logits_equal_tp1(family, tmp_path):
    """Four ranks: llama's 2 KV heads each held by two ranks, the MoE's experts cut into four slices of their
    intermediate dimension."""
    path = save_tiny_with_tokenizer(family, tmp_path / family)
    with LLM(str(path)) as one:
        reference = [_run(one, GREEDY), _run(one, SEEDED)]
    with LLM(str(path), tensor_parallel_size=4) as four:
        sharded = [_run(four, GREEDY), _run(four, SEEDED)]
    for ref, got in zip(reference, sharded):
        for (ref_tokens, ref_lp, ref_prompt), (tokens, lp, prompt) in zip(ref, got):
            assert tokens == ref_tokens
            assert lp == pytest.approx(ref_lp, abs=2e-4)
            assert prompt == pytest.approx(ref_prompt, abs=2e-4)


def test_tp2_vocabulary_padding_and_ngram_speculation(tmp_path):
    """A vocabulary that does not split evenly (the last rank's padding rows) and verify steps under TP."""
    path = save_tiny("qwen3", tmp_path / "q", vocab_size=321)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    prompt = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7]
    with LLM(str(path), speculative_method="ngram") as one:
        want = one.generate_ids([prompt], params)[0].token_ids
    with LLM(str(path), tensor_parallel_size=2, speculative_method="ngram",
             speculative_disable_by_batch_size=0) as two:
        assert two.generate_ids([prompt], params)[0].token_ids == want


def test_tp2_probe_scores_equal_tp1(tmp_path):
    """Probes read on rank 0 (the residual after the all-reduce is every rank's): the scores TP=1 gives."""
    path = save_tiny_with_tokenizer("gemma3", tmp_path / "g")
    probes = str(write_probe_set(tmp_path / "probes", 64, [Spec("mid", 1), Spec("last", 2, "sigmoid")]))
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with LLM(str(path), probes=probes) as one:
        want = one.generate_ids(PROMPTS, params)
    with LLM(str(path), probes=probes, tensor_parallel_size=2) as two:
        got = two.generate_ids(PROMPTS, params)
    for w, g in zip(want, got):
        assert g.token_ids == w.token_ids
        for name in ("mid", "last"):
            assert g.probes[name] == pytest.approx(w.probes[name], abs=1e-5)


def test_tp2_structured_output_equals_tp1(tmp_path):
    """The grammar's mask is applied on rank 0 only (it samples): constrained answers are TP=1's."""
    from infer.structured import Constraint

    path = save_tiny_with_tokenizer("qwen3", tmp_path / "q")
    params = [SamplingParams(temperature=1.0, seed=2, max_tokens=20, structured=Constraint("regex", r"[a-z]{3}-\d{2}")),
              SamplingParams(temperature=1.0, seed=3, max_tokens=8, structured=Constraint.choice(["yes", "no"]))]
    with LLM(str(path)) as one:
        want = [o.text for o in one.generate(["The cat", "Call"], params)]
    with LLM(str(path), tensor_parallel_size=2) as two:
        assert [o.text for o in two.generate(["The cat", "Call"], params)] == want


def test_bundled_gemma3_270m_tp2_answers_as_tp1():
    from infer.loader.gguf_file import bundled_gemma3_270m

    model = str(bundled_gemma3_270m())
    params = SamplingParams(temperature=0, max_tokens=8)
    with LLM(model, quantization="none", max_seq_len=256, kv_cache_memory_gb=0.1) as one:
        want = one.generate(["The capital of France is"], params)[0]
    with LLM(model, quantization="none", max_seq_len=256, kv_cache_memory_gb=0.1, tensor_parallel_size=2) as two:
        got = two.generate(["The capital of France is"], params)[0]
    assert got.token_ids == want.token_ids and got.text == want.text


def test_refusals_name_the_field_and_numbers(tmp_path):
    llama = save_tiny_with_tokenizer("llama", tmp_path / "llama")  # 4 heads of 16, 2 KV heads, intermediate 128
    with pytest.raises(EngineConfigError, match=r"tensor_parallel_size=3: the model's 4 attention heads"):
        LLM(str(llama), tensor_parallel_size=3)
    with pytest.raises(EngineConfigError, match=r"draft_model=.*tensor_parallel_size=2"):
        LLM(str(llama), tensor_parallel_size=2, speculative_method="draft", draft_model=str(llama))
    # 48 x 48 scale blocks: rank 0's down_proj columns [0, 64) straddle two of them (rank 1's q rows [32, 64) too)
    fp8 = quantize_checkpoint(llama, tmp_path / "fp8", "fp8_block", block=(48, 48))
    with pytest.raises(EngineConfigError, match=r"down_proj.weight.*reads \[0, 64\) of dimension 1 \(128\), which splits its 8-bit scale blocks of 48"):
        LLM(str(fp8), tensor_parallel_size=2)
    prompt, params = [[1, 2, 3, 4]], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    with LLM(str(fp8), quantization="none") as one:
        want = one.generate_ids(prompt, params)[0].token_ids
    with LLM(str(fp8), tensor_parallel_size=2, quantization="none") as two:  # dequantized whole, then cut
        assert two.generate_ids(prompt, params)[0].token_ids == want


def test_per_channel_int8_stays_quantized_under_tp(tmp_path):
    """Per-row scales cut with their rows; a column cut inside a row's one scale block keeps that scale."""
    int8 = quantize_checkpoint(save_tiny_with_tokenizer("qwen3", tmp_path / "q"), tmp_path / "int8", "int8_channel")
    prompt, params = [[9, 8, 7, 6]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with LLM(str(int8)) as one:
        want = one.generate_ids(prompt, params)[0].token_ids
    with LLM(str(int8), tensor_parallel_size=2) as two:
        from infer.models.quant import W8Weight

        assert isinstance(two.runner.model.blocks[0].mlp.down_proj, W8Weight)
        assert two.generate_ids(prompt, params)[0].token_ids == want


def test_killed_worker_fails_the_engine_instead_of_hanging(tmp_path):
    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    llm = LLM(str(path), tensor_parallel_size=2, distributed_timeout_s=20)
    try:
        worker = llm.runner.workers.processes[1]
        os.kill(worker.pid, signal.SIGKILL)
        worker.join(10)
        started = time.monotonic()
        with pytest.raises(DistributedError, match="rank 1"):
            for _ in range(20):
                llm.generate_ids([[1, 2, 3]], SamplingParams(max_tokens=4))
                time.sleep(0.2)
        assert time.monotonic() - started < 15
    finally:
        llm.close()


def test_two_node_torchrun_smoke(tmp_path):
    """Two torchrun 'nodes' on localhost, one process each: rank 0 answers, rank 1 runs headless."""
    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    argv = [sys.executable, "-m", "infer.cli", "generate", "--model", str(path), "The cat", "--temperature", "0",
            "--max-tokens", "8", "--ignore-eos"]
    want = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert want.returncode == 0, want.stderr
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    logs = [(open(tmp_path / f"node{rank}.out", "w+"), open(tmp_path / f"node{rank}.err", "w+")) for rank in (0, 1)]
    nodes = [subprocess.Popen([*torchrun, "--node-rank", str(rank), "-m", "infer.cli", *argv[3:]], stdout=out,
                              stderr=err, text=True, env=env) for rank, (out, err) in enumerate(logs)]
    try:
        codes = [node.wait(timeout=180) for node in nodes]
    finally:
        for node in nodes:
            node.kill()
    outs = [(Path(out.name).read_text(), Path(err.name).read_text()) for out, err in logs]
    assert codes == [0, 0], outs
    assert outs[0][0] == want.stdout and outs[1][0] == ""
    assert "headless" in outs[1][1]


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_serve_with_a_killed_worker_fails_streams_turns_unhealthy_and_exits_non_zero(tmp_path):
    import httpx

    from server_harness import serve_process

    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    with serve_process("--model", str(path), "-tp", "2", "--max-seq-len", "512") as served:
        base = served.base_url
        core_pid = httpx.get(f"{base}/health", timeout=10).json()["core_pid"]
        workers = _children(core_pid)
        assert workers, "the core started no worker"
        body = {"model": "llama", "prompt": "The cat", "max_tokens": 400, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=60) as r:
            lines = r.iter_lines()
            assert next(line for line in lines if line.startswith("data: {"))
            for pid in workers:
                os.kill(pid, signal.SIGKILL)
            rest = [line for line in lines if line.startswith("data: ")]
        assert any("error" in line for line in rest)
        assert served.proc.wait(timeout=30) == 1
        assert "tensor-parallel worker rank 1" in served.output()


def test_two_nodes_by_our_flags_serve_as_one_and_the_headless_node_exits_with_rank_0(tmp_path):
    """`infer serve --nnodes 2 --node-rank 1` runs headless; node 0 serves the TP=2 model; stopping node 0 ends node 1."""
    import httpx

    from server_harness import serve_process

    path = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    body = {"model": "llama", "prompt": "The cat", "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    with serve_process("--model", str(path), "--max-seq-len", "256") as one:
        want = httpx.post(f"{one.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    flags = ["--model", str(path), "--max-seq-len", "256", "-tp", "2", "--nnodes", "2", "--master-port", str(free_port())]
    log = open(tmp_path / "node1.log", "w+")
    node1 = subprocess.Popen([sys.executable, "-m", "infer.cli", "serve", *flags, "--node-rank", "1"], stdout=log,
                             stderr=subprocess.STDOUT, text=True)
    try:
        with serve_process(*flags, "--node-rank", "0") as node0:
            got = httpx.post(f"{node0.base_url}/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
            assert got == want
        assert node1.wait(timeout=60) in (0, 1)  # its worker ends with rank 0 (stop message, or the closed connection)
    finally:
        node1.kill()
    assert "headless: tensor-parallel ranks of node 1 of 2" in Path(log.name).read_text()


def _gguf_moe_4bit(tmp_path: Path) -> Path:
    """A tiny Qwen 3 MoE (every layer sparse) written as a GGUF whose experts are Q4_0."""
    from gguf import GGMLQuantizationType as Q
    from transformers import AutoModelForCausalLM

    from checkpoints import write_moe_gguf

    directory = save_tiny_with_tokenizer("qwen3_moe", tmp_path / "model", seed=8, mlp_only_layers=[],
                                         moe_intermediate_size=64)
    return write_moe_gguf(AutoModelForCausalLM.from_pretrained(directory), tmp_path / "moe.gguf", directory,
                          {name: Q.Q4_0 for name in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")})


def test_tp2_on_gguf_experts_kept_4bit_equals_tp1(tmp_path):
    """A GGUF MoE whose experts stay 4-bit: each rank reads its slice of the stored blocks (the down projection's
    columns in whole groups, padded), and TP=2 decodes TP=1's tokens with the native MoE kernel on both ranks."""
    path = _gguf_moe_4bit(tmp_path)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    with LLM(str(path), max_seq_len=128) as one:
        want = [o.token_ids for o in one.generate_ids(PROMPTS, params)]
    with LLM(str(path), max_seq_len=128, tensor_parallel_size=2) as two:
        assert [o.token_ids for o in two.generate_ids(PROMPTS, params)] == want


@pytest.mark.parametrize("family", MOE)
def test_expert_parallel_equals_tp1(family, tmp_path):
    """--enable-expert-parallel: each of 2 ranks holds half the experts whole (rank 0's stacks are half as tall and
    as wide as the checkpoint's experts), reads only those, and TP=2 decodes TP=1's tokens and logprobs."""
    path = save_tiny_with_tokenizer(family, tmp_path / family)
    with LLM(str(path)) as one:
        want = _run(one, GREEDY)
        whole = next(b.mlp for b in one.runner.model.blocks if hasattr(b.mlp, "w13"))
        experts, inner = whole.w13.shape[0], whole.inner
    with LLM(str(path), tensor_parallel_size=2, enable_expert_parallel=True) as two:
        got = _run(two, GREEDY)
        mlp = next(b.mlp for b in two.runner.model.blocks if hasattr(b.mlp, "w13"))
        assert (mlp.w13.shape[0], mlp.inner, mlp.experts) == (experts // 2, inner, range(experts // 2))
    for (ref_tokens, ref_lp, ref_prompt), (tokens, lp, prompt) in zip(want, got):
        assert tokens == ref_tokens
        assert lp == pytest.approx(ref_lp, abs=2e-4)
        assert prompt == pytest.approx(ref_prompt, abs=2e-4)


def test_expert_parallel_on_gguf_experts_kept_4bit_and_its_refusals(tmp_path):
    """A GGUF MoE's stacked 4-bit experts: each rank keeps its half of the stack as stored; the flag is refused
    without tensor parallelism and on a model without experts, naming the field."""
    path = _gguf_moe_4bit(tmp_path)
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    with LLM(str(path), max_seq_len=128) as one:
        want = [o.token_ids for o in one.generate_ids(PROMPTS, params)]
    with LLM(str(path), max_seq_len=128, tensor_parallel_size=2, enable_expert_parallel=True) as two:
        assert type(two.runner.model.blocks[0].mlp.w13).__name__ == "Int4Experts"
        assert [o.token_ids for o in two.generate_ids(PROMPTS, params)] == want
    with pytest.raises(EngineConfigError, match=r"enable_expert_parallel.*needs tensor_parallel_size > 1"):
        LLM(str(path), enable_expert_parallel=True)
    llama = save_tiny_with_tokenizer("llama", tmp_path / "llama")
    with pytest.raises(EngineConfigError, match=r"enable_expert_parallel: llama has no experts"):
        LLM(str(llama), tensor_parallel_size=2, enable_expert_parallel=True)


def test_expert_parallel_on_an_fp8_block_checkpoint(tmp_path):
    """Qwen's FP8 layout: a rank skips the other ranks' experts with their scale tensors (not read, not refused as
    stray scales) and decodes TP=1's tokens."""
    moe = save_tiny_with_tokenizer("qwen3_moe", tmp_path / "moe")
    fp8 = quantize_checkpoint(moe, tmp_path / "fp8", "fp8_block", block=(16, 16))
    prompt, params = [[1, 2, 3, 4], [9, 8, 7]], SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    with LLM(str(fp8)) as one:
        want = [o.token_ids for o in one.generate_ids(prompt, params)]
    with LLM(str(fp8), tensor_parallel_size=2, enable_expert_parallel=True) as two:
        assert [o.token_ids for o in two.generate_ids(prompt, params)] == want
