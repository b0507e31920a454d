"""The models' layerzero call sites are bound once: a steady decode calls its kernels without re-selecting."""

from __future__ import annotations

import pytest

from checkpoints import FAMILIES, save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from layerzero.dispatch.bound import sites_of


@pytest.mark.parametrize("family", FAMILIES)
def test_decode_sites_bind_once_per_shape(tmp_path, family) -> None:
    llm = LLM(str(save_tiny_with_tokenizer(family, tmp_path / family)), device="cpu", dtype="float32", max_seq_len=256,
              block_size=4, use_cuda_graphs=False)  # eager decode: graphs replay without calling the sites at all
    prompt = list(range(3, 40))
    llm.generate_ids([prompt], SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    sites = sites_of(llm.engine.runner.model)
    before = {name: site.binds for name, site in sites.items()}
    out = llm.generate_ids([prompt], SamplingParams(temperature=0, max_tokens=60, ignore_eos=True))
    assert len(out[0].token_ids) == 60
    rebinds = {name: site.binds - before[name] for name, site in sites.items()}
    # every site met the prompt's shape and the one-row decode shape in the warm-up and keeps both bindings, so
    # it never selects again; the decode attention site re-binds only as its bound grows by 4 blocks
    steps_bound = -(-(len(prompt) + 60) // 16) - len(prompt) // 16 + 1
    assert {name: n for name, n in rebinds.items() if n and "decode_site" not in name} == {}
    assert 0 < max(n for name, n in rebinds.items() if "decode_site" in name) <= steps_bound
    # the forward's plan vouches for every site the decode calls: they skip their guards
    called = [s for name, s in sites.items() if s.kernel_id and "prefill_site" not in name and "varlen_site" not in name
              and "head_site" not in name]
    assert called and all(s.vouched for s in called), [n for n, s in sites.items() if s in called and not s.vouched]
