"""The block's input add-and-norm folded into its attention prologue op (`Attention.attend_normed`): on the CPU,
where the op is its parts, a model that takes the fold (forced here; it is CUDA's) gives the bits of one that does
not, through prefill and decode, and its decode binds the fused op (the first layer, whose stream has nothing
pending, keeps its own norm)."""

from __future__ import annotations

import pytest

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.models.layers import Attention


@pytest.mark.parametrize("family", ["qwen3", "qwen3_moe", "llama"])
def test_folded_input_norm_gives_the_unfolded_tokens(family, tmp_path, monkeypatch):
    from layerzero.dispatch.bound import sites_of

    path = save_tiny_with_tokenizer(family, tmp_path, seed=3)
    prompts = [[5, 9, 33, 2], list(range(40, 60)), [7]]
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)

    def run() -> tuple[list, set[str]]:
        llm = LLM(str(path), device="cpu", dtype="float32", max_seq_len=64)
        outs = llm.generate_ids(prompts, greedy)
        chosen = {f"{name.rsplit('.', 1)[-1]}={site.kernel_id}"
                  for name, site in sites_of(llm.engine.runner.model).items() if site.kernel_id is not None}
        return [o.token_ids for o in outs], chosen

    plain, plain_kernels = run()
    monkeypatch.setattr(Attention, "_folds_qkv", lambda self, x, batch: batch.kv_caches is not None)
    folded, folded_kernels = run()
    assert folded == plain
    assert not any(k.startswith("norm_rope_store_site=") for k in plain_kernels)
    assert "norm_rope_store_site=torch.composed_add_rms_norm_rope_store_kv" in folded_kernels, folded_kernels
