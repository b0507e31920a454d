"""logit_bias, presence / frequency penalties and min_tokens on CUDA: the slots' adjusted logits equal the float64
reference there too, and a batch mixing them with n-gram speculation, a grammar and CUDA graphs runs sync-free
(INFER_STRICT_SYNC=1) with every seeded row reproducing its tokens alone."""

from __future__ import annotations

import json
import random

import pytest
import torch

from checkpoints import save_tiny_with_tokenizer
from infer import LLM, SamplingParams
from infer.sampling.adjust import reference_logits
from infer.sampling.sampler import penalized
from infer.sampling.slots import SamplingSlots, SlotState
from infer.structured import Constraint

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")

VOCAB, EOS = 512, (2, 7)


def test_adjusted_logits_equal_the_float64_reference_on_cuda() -> None:
    rng = random.Random(0)
    slots = SamplingSlots(4, VOCAB, torch.device("cuda"))
    params = [SamplingParams(presence_penalty=rng.uniform(-2, 2), frequency_penalty=rng.uniform(-2, 2),
                             logit_bias={rng.randrange(VOCAB): rng.choice([-100.0, 3.0]) for _ in range(5)},
                             min_tokens=rng.choice([0, 9]), max_tokens=20) for _ in range(4)]
    generated = [[rng.randrange(40) for _ in range(rng.randrange(8))] for _ in range(4)]
    slots.join([SlotState(i, p, 0, len(g), tuple(g), EOS) for i, (p, g) in enumerate(zip(params, generated))])
    for _ in range(6):
        tokens = [rng.randrange(40) for _ in range(4)]
        slots.record(torch.arange(4, device="cuda"), [0, 1, 2, 3], torch.tensor(tokens, device="cuda"))
        slots.advance(torch.arange(4, device="cuda"))
        for g, t in zip(generated, tokens):
            g.append(t)
    logits = torch.randn(4, VOCAB, device="cuda") * 3
    got = penalized(logits, slots.gather(torch.arange(4, device="cuda"), [0, 1, 2, 3]), None).cpu()
    for i in range(4):
        want = reference_logits(logits[i].cpu(), params[i], generated[i], EOS if params[i].min_tokens else ())
        assert torch.equal(torch.isinf(got[i]), torch.isinf(want))
        finite = ~torch.isinf(want)
        torch.testing.assert_close(got[i][finite].double(), want[finite], rtol=0, atol=1e-4)


def test_mixed_batch_sync_free_and_reproducible(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("INFER_STRICT_SYNC", "1")
    path = str(save_tiny_with_tokenizer("llama", tmp_path / "model", seed=2))
    rng = random.Random(3)
    prompts = [[rng.randrange(1, 320) for _ in range(n)] * 3 for n in (5, 8, 4, 7)]
    schema = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 99}},
              "required": ["age"], "additionalProperties": False}
    batch = [
        SamplingParams(temperature=0.9, seed=1, max_tokens=32, presence_penalty=0.8, frequency_penalty=0.4,
                       logit_bias={7: -100, 9: 3.0}, min_tokens=8),
        SamplingParams(temperature=0, max_tokens=32, ignore_eos=True),
        SamplingParams(temperature=0.7, seed=2, max_tokens=32, logit_bias={5: 2.0}, min_tokens=4),
        SamplingParams(temperature=1.0, seed=4, max_tokens=40, structured=Constraint.json_schema(schema)),
    ]
    llm = LLM(path, device="cuda", dtype="float32", max_seq_len=256, max_batch_size=8, use_cuda_graphs=True,
              kv_cache_memory_gb=1, speculative_method="ngram", num_speculative_tokens=3, prompt_lookup_max=3)
    together = llm.generate_ids(prompts, batch)
    alone = [llm.generate_ids([p], [q])[0] for p, q in zip(prompts, batch)]
    assert [o.token_ids for o in together] == [o.token_ids for o in alone]
    assert 7 not in together[0].token_ids and len(together[0].token_ids) >= 8
    json.loads(together[3].text)
    assert llm.engine.kv.audit_blocks() == {}
