"""Mixtures of experts on CUDA: triton.fused_moe and triton.fused_moe_decode compiled against the float64 definition
(an expert with no token, every token on the same experts, bf16), the routing inside the norm and the experts in a
CUDA graph, and the tiny Qwen 3 MoE and Mixtral through the engine with decode and prefill graphs under
INFER_STRICT_SYNC: greedy tokens equal the CPU runner's, logits equal transformers' in fp32."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

import layerzero as lz
from layerzero.select.signatures import MOE_DECODE_PAIRS
from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.loader.model_loader import load_model
from infer.models.forward_batch import ForwardBatch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _definition(x, w13, w2, weights, ids):
    out = torch.zeros(x.shape, dtype=torch.float64, device=x.device)
    for j in range(ids.shape[1]):
        gate, up = torch.einsum("th,tnh->tn", x.double(), w13[ids[:, j]].double()).chunk(2, dim=-1)
        h = torch.nn.functional.silu(gate) * up
        out += weights[:, j, None].double() * torch.einsum("ti,thi->th", h, w2[ids[:, j]].double())
    return out


@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_fused_moe_matches_the_definition(tokens, dtype):
    gen = torch.Generator(device="cuda").manual_seed(tokens)
    experts, hidden, inner, k = 16, 256, 192, 4
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).to(dtype)
    w13 = (torch.randn(experts, 2 * inner, hidden, device="cuda", generator=gen) * 0.05).to(dtype)
    w2 = (torch.randn(experts, hidden, inner, device="cuda", generator=gen) * 0.05).to(dtype)
    logits = torch.randn(tokens, experts, device="cuda", generator=gen)
    logits[:, -3:] -= 100  # three experts receive nothing
    if tokens == 300:
        logits[:, 2] += 100  # every token picks expert 2
    weights, ids = lz.moe_route(logits, k, renormalize=True)
    few = tokens * k <= MOE_DECODE_PAIRS
    assert lz.which("fused_moe", x, w13, w2, weights, ids)["kernel_id"] == (
        "triton.fused_moe_decode" if few else "triton.fused_moe")
    want = _definition(x, w13, w2, weights, ids)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(lz.fused_moe(x, w13, w2, weights, ids).double(), want, atol=tol, rtol=tol)
    from layerzero.kernels.triton import moe as triton_moe, moe_decode  # imports triton: CUDA machines only

    other = triton_moe.fused_moe if few else moe_decode.fused_moe_decode  # the path not chosen holds too
    torch.testing.assert_close(other(x, w13, w2, weights, ids).double(), want, atol=tol, rtol=tol)


@pytest.mark.parametrize("tokens", [1, 300])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
def test_triton_moe_route_matches_the_reference(tokens, scoring):
    from layerzero.kernels.reference.moe import moe_route

    logits = torch.randn(tokens, 128, device="cuda", generator=torch.Generator(device="cuda").manual_seed(tokens))
    assert lz.which("moe_route", logits, 8, renormalize=True, scoring=scoring)["kernel_id"] == "triton.moe_route"
    weights, ids = lz.moe_route(logits, 8, renormalize=True, scoring=scoring)
    want_w, want_ids = moe_route(logits, 8, renormalize=True, scoring=scoring)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("tokens", [1, 4, 16, 300])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_moe_gate_matches_the_reference_in_a_graph(tokens, dtype):
    """The one-launch router (<= 16 tokens) replayed from a CUDA graph with fresh inputs, and the matmul path."""
    from layerzero.kernels.reference.moe import moe_gate
    from layerzero.kernels.triton import moe_route as triton_route

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    x = torch.randn(tokens, 2048, device="cuda", generator=gen).to(dtype)
    router = (torch.randn(128, 2048, device="cuda", generator=gen) * 0.02).to(dtype)
    kernel = lz.which("moe_gate", x, router, 8, renormalize=True)["kernel_id"]
    assert kernel == ("triton.moe_gate_decode" if tokens <= 16 else "triton.moe_gate")
    lz.moe_gate(x, router, 8, renormalize=True)  # warm-up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        weights, ids = lz.moe_gate(x, router, 8, renormalize=True)
    for _ in range(3):
        x.copy_(torch.randn(tokens, 2048, device="cuda", generator=gen).to(dtype))
        graph.replay()
        want_w, want_ids = moe_gate(x, router, 8, renormalize=True)
        assert (ids == want_ids).float().mean() > 0.99  # float32 sums in another order may swap a near-tie
        torch.testing.assert_close(weights[ids == want_ids], want_w[ids == want_ids], atol=1e-5, rtol=1e-4)
    assert all(counter.item() == 0 for counter in triton_route._COUNTERS.values())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_moe_gate_decode_is_batch_invariant(dtype):
    """The compiled one-launch router gives a token the same logits' bits, so the same experts and weights, alone or
    beside 8 others (the CPU unit test's interpreter cannot show it where numpy's BLAS sums rows by place)."""
    from layerzero.kernels.triton import moe_route as triton_route

    gen = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(9, 2048, device="cuda", generator=gen).to(dtype)
    router = (torch.randn(128, 2048, device="cuda", generator=gen) * 0.02).to(dtype)
    together = triton_route.moe_gate_decode(x, router, 8, renormalize=False)
    for t in (0, 4, 8):
        alone = triton_route.moe_gate_decode(x[t : t + 1], router, 8, renormalize=False)
        assert torch.equal(alone[0][0], together[0][t]) and torch.equal(alone[1][0], together[1][t])


@pytest.mark.parametrize("with_o", [False, True])
@pytest.mark.parametrize("tokens", [1, 4])
def test_routing_inside_the_norm_and_the_experts_in_a_graph(tokens, with_o):
    """The Qwen3-30B-A3B layer's MoE half as a decode step runs it: the norm-and-router kernel (with_o: summing the
    O projection's split-K slices too), then the decode path ranking the logits itself, replayed from a CUDA graph
    with fresh inputs, against the same kernels' sum over moe_route's routing of those logits, and the norm against
    fused_add_rms_norm."""
    from layerzero.kernels.reference.moe import moe_route
    from layerzero.kernels.triton import moe_decode

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    experts, hidden, inner, k = 128, 2048, 768, 8
    x, residual = (torch.empty(tokens, hidden, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    norm_weight = torch.rand(hidden, device="cuda", generator=gen).bfloat16() + 0.5
    router = (torch.randn(experts, hidden, device="cuda", generator=gen) * 0.02).bfloat16()
    w13 = (torch.randn(experts, 2 * inner, hidden, device="cuda", generator=gen) * 0.02).bfloat16()
    w2 = (torch.randn(experts, hidden, inner, device="cuda", generator=gen) * 0.02).bfloat16()

    attn = torch.empty(tokens, 4096, device="cuda", dtype=torch.bfloat16)  # the heads' outputs, 32 of 128
    o_proj = (torch.randn(hidden, 4096, device="cuda", generator=gen) * 0.02).bfloat16() if with_o else None

    def fresh():
        x.copy_(torch.randn(tokens, hidden, device="cuda", generator=gen))
        attn.copy_(torch.randn(tokens, 4096, device="cuda", generator=gen))
        residual.copy_(torch.randn(tokens, hidden, device="cuda", generator=gen))

    def step():
        rows = attn if with_o else x
        normed, summed, logits = lz.fused_add_rms_norm_router(rows, residual, norm_weight, router, proj=o_proj)
        return normed, summed, logits, lz.fused_moe_routed(normed, w13, w2, logits, k, renormalize=True)

    fresh()
    kernel = "triton.fused_add_rms_norm_router_" + ("splitk" if with_o else "decode")
    assert lz.which("fused_add_rms_norm_router", attn if with_o else x, residual, norm_weight, router, o_proj,
                    eps=1e-6, weight_offset=0.0)["kernel_id"] == kernel
    normed, _, logits, _ = step()  # warm-up outside the capture
    assert lz.which("fused_moe_routed", normed, w13, w2, logits, k, renormalize=True, scoring="softmax",
                    activation="silu")["kernel_id"] == "triton.fused_moe_routed_decode"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        normed, summed, logits, out = step()
    for _ in range(3):
        fresh()
        graph.replay()
        if with_o:  # the slices summed in another order than the linear op's: a bf16 rounding apart
            want_normed, want_summed = lz.fused_add_rms_norm(lz.linear(attn, o_proj), residual, norm_weight)
            torch.testing.assert_close(summed, want_summed, atol=2e-2, rtol=2e-2)
        else:
            want_normed, want_summed = lz.fused_add_rms_norm(x, residual, norm_weight)
            assert torch.equal(summed, want_summed)
        torch.testing.assert_close(normed, want_normed, atol=1e-2, rtol=1e-2)
        torch.testing.assert_close(logits, normed.float() @ router.float().t(), atol=1e-4, rtol=1e-4)
        weights, ids = moe_route(logits, k, renormalize=True)
        # the weights' last bits may differ (the renormalized softmax of the k logits, not of all then the k)
        torch.testing.assert_close(out, moe_decode.fused_moe_decode(normed, w13, w2, weights, ids), atol=1e-3,
                                   rtol=1e-2)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_engine_with_graphs_equals_the_cpu_runner_and_transformers(family, tmp_path, monkeypatch):
    path = save_tiny_with_tokenizer(family, tmp_path, seed=4)
    prompts = [[5, 9, 33, 2], list(range(40, 77)), [7]]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cpu = [o.token_ids for o in LLM(str(path), device="cpu", dtype="float32", max_seq_len=128).generate_ids(prompts, greedy)]
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    llm = LLM(str(path), device="cuda", dtype="float32", max_seq_len=128, max_batch_size=8)
    assert llm.runner.graph_stats.batch_sizes
    assert [o.token_ids for o in llm.generate_ids(prompts, greedy)] == cpu
    monkeypatch.delenv("INFER_STRICT_SYNC")
    ours = load_model(path, torch.float32, "cuda").model
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).cuda().eval()
    ids = torch.tensor(prompts[1], device="cuda")
    with torch.no_grad():
        got = ours.compute_logits(ours(ids, ForwardBatch.for_prompts([ids.numel()], "cuda")))
        want = hf(ids[None]).logits[0].float()
    assert (got - want).abs().max().item() <= 1e-3


def test_engine_folds_the_projections_slices_and_equals_the_cpu_runner(tmp_path, monkeypatch):
    """A Qwen 3 MoE whose O and QKV qualify for the split-K folds (hidden 512, 4 heads of 128: K a multiple of 512;
    the folds' 16 MiB floor lowered to 0 for its small weights): its decode binds triton.rope_store_kv_splitk and
    triton.fused_add_rms_norm_router_splitk, and its greedy tokens, eager and under graphs with strict sync, equal
    the CPU runner's."""
    from layerzero.dispatch.bound import sites_of
    from layerzero.kernels.triton import specs

    monkeypatch.setattr(specs, "GEMV_LONG_ROWS_MIN_BYTES", 0)
    path = save_tiny_with_tokenizer("qwen3_moe", tmp_path, seed=6, hidden_size=512, head_dim=128)
    prompts = [[5, 9, 33, 2], list(range(40, 77)), [7]]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    cpu = [o.token_ids for o in LLM(str(path), device="cpu", dtype="float32", max_seq_len=128).generate_ids(prompts, greedy)]
    eager = LLM(str(path), device="cuda", dtype="float32", max_seq_len=128, use_cuda_graphs=False)
    assert [o.token_ids for o in eager.generate_ids(prompts, greedy)] == cpu
    chosen = {site.kernel_id for site in sites_of(eager.engine.runner.model).values()}
    assert {"triton.rope_store_kv_splitk", "triton.fused_add_rms_norm_router_splitk"} <= chosen, chosen
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    graphs = LLM(str(path), device="cuda", dtype="float32", max_seq_len=128, max_batch_size=8)
    assert [o.token_ids for o in graphs.generate_ids(prompts, greedy)] == cpu


def _quantized(w: torch.Tensor, wdtype: torch.dtype, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, N, K] as 8-bit values with amax block scales (each expert's own)."""
    from layerzero.kernels.reference.quantize import expand_block_scales

    bn, bk = block
    e, n, k = w.shape
    padded = torch.zeros(e, -(-n // bn) * bn, -(-k // bk) * bk, device=w.device)
    padded[:, :n, :k] = w.float()
    amax = padded.view(e, padded.shape[1] // bn, bn, -1, bk).abs().amax(dim=(2, 4))
    qmax = 127.0 if wdtype == torch.int8 else 448.0
    scale = (amax / qmax).clamp(min=1e-12)
    full = torch.stack([expand_block_scales(s, block, (n, k)) for s in scale])
    q = (w.float() / full).clamp(-qmax, qmax)
    return (q.round() if wdtype == torch.int8 else q).to(wdtype), scale


@pytest.mark.parametrize("tokens", [1, 7, 64, 300])
@pytest.mark.parametrize("wdtype, block", [(torch.float8_e4m3fn, (128, 128)), (torch.int8, (1, 32))],
                         ids=["fp8-blocks", "q8_0"])
def test_triton_8bit_experts_match_the_definition(tokens, wdtype, block):
    """lz.fused_moe_w8 compiled, both paths, bf16 activations, against the definition over the dequantized experts."""
    from layerzero.kernels.reference.quantize import dequantize_w8
    from layerzero.kernels.triton import moe as triton_moe, moe_decode

    gen = torch.Generator(device="cuda").manual_seed(tokens)
    experts, hidden, inner, k = 16, 256, 192, 4
    x = torch.randn(tokens, hidden, device="cuda", generator=gen).bfloat16()
    w13, s13 = _quantized(torch.randn(experts, 2 * inner, hidden, device="cuda", generator=gen) * 0.05, wdtype, block)
    w2, s2 = _quantized(torch.randn(experts, hidden, inner, device="cuda", generator=gen) * 0.05, wdtype, block)
    logits = torch.randn(tokens, experts, device="cuda", generator=gen)
    logits[:, -3:] -= 100
    weights, ids = lz.moe_route(logits, k, renormalize=True)
    few = tokens * k <= MOE_DECODE_PAIRS
    assert lz.which("fused_moe_w8", x, w13, s13, w2, s2, weights, ids, block_size=block)["kernel_id"] == (
        "triton.fused_moe_w8_decode" if few else "triton.fused_moe_w8")
    d13, d2 = (torch.stack([dequantize_w8(q, s, block) for q, s in zip(w, sc)]) for w, sc in ((w13, s13), (w2, s2)))
    want = _definition(x.float(), d13, d2, weights, ids)
    for fn in (triton_moe.fused_moe_w8, moe_decode.fused_moe_w8_decode):
        got = fn(x, w13, s13, w2, s2, weights, ids, block_size=block)
        assert got.dtype == torch.bfloat16
        torch.testing.assert_close(got.double(), want, atol=3e-2, rtol=3e-2)


def test_fp8_checkpoint_keeps_its_experts_8bit_through_the_engine(tmp_path, monkeypatch):
    """A Qwen 3 MoE checkpoint in the FP8 block format (experts and projections e4m3, 128 x 128 blocks) on CUDA: the
    experts stay 8-bit (`W8Experts`, triton.fused_moe_w8*), the logits equal the same checkpoint dequantized on the
    CPU, and the engine with decode and prefill graphs under strict sync decodes the CPU runner's greedy tokens."""
    from checkpoints import quantize_checkpoint
    from infer.models.quant import W8Experts

    path = quantize_checkpoint(save_tiny_with_tokenizer("qwen3_moe", tmp_path / "f", seed=4), tmp_path / "fp8",
                               "fp8_block")
    ours = load_model(path, torch.float32, "cuda", quantization="auto").model
    cpu = load_model(path, torch.float32, "cpu").model  # dequantized at load
    sparse = [b.mlp for b in ours.blocks if hasattr(b.mlp, "w13")]
    assert sparse and all(isinstance(m.w13, W8Experts) and isinstance(m.w2, W8Experts) for m in sparse)
    ids = torch.tensor(list(range(40, 77)))
    with torch.no_grad():
        got = ours.compute_logits(ours(ids.cuda(), ForwardBatch.for_prompts([ids.numel()], "cuda"))).cpu()
        want = cpu.compute_logits(cpu(ids, ForwardBatch.for_prompts([ids.numel()])))
    assert (got - want).abs().max().item() <= 1e-3 * want.abs().max().item()
    prompts = [[5, 9, 33, 2], list(range(40, 77)), [7]]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    want_ids = [o.token_ids for o in LLM(str(path), device="cpu", dtype="float32", max_seq_len=128)
                .generate_ids(prompts, greedy)]
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    llm = LLM(str(path), device="cuda", dtype="float32", max_seq_len=128, max_batch_size=8)
    assert llm.runner.graph_stats.batch_sizes
    assert [o.token_ids for o in llm.generate_ids(prompts, greedy)] == want_ids
