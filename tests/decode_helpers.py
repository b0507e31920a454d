"""Drive a TorchRunner directly: greedy decode through the KV cache, and by full recomputation."""

from __future__ import annotations

import torch

from infer.kv.kv_manager import KVCacheManager
from infer.models.forward_batch import ForwardBatch
from infer.runners.step import StepInput, StepKind
from infer.runners.torch_runner import TorchRunner
from infer.sampling.params import SamplingParams
from infer.sampling.slots import SlotState

GREEDY = SamplingParams(temperature=0.0)


def _step(kind: StepKind, kv: KVCacheManager, seqs: dict[str, list[int]], starts: dict[str, int]) -> StepInput:
    step = StepInput(kind)
    for slot, (rid, tokens) in enumerate(seqs.items()):
        start = starts[rid]
        new = tokens[start:]
        step.token_ids += new
        step.positions += list(range(start, len(tokens)))
        step.query_lens.append(len(new))
        step.context_lens.append(len(tokens))
        step.slot_mapping += kv.slots(rid, start, len(new)).tolist()
        step.block_tables.append(kv.block_table(rid))
        step.sampling_slots.append(slot)
        if kind is StepKind.PREFILL:
            step.joined.append(SlotState(slot, GREEDY, 0, 0))
    return step


def decode_with_cache(model, prompts: list[list[int]], steps: int, block_size: int, num_blocks: int) -> list[list[int]]:
    runner = TorchRunner(model, num_blocks=num_blocks, block_size=block_size)
    kv = KVCacheManager(num_blocks, block_size)
    seqs = {f"r{i}": list(p) for i, p in enumerate(prompts)}
    for rid, tokens in seqs.items():
        kv.allocate(rid, len(tokens) + steps)
    result = runner.execute(_step(StepKind.PREFILL, kv, seqs, {rid: 0 for rid in seqs}))
    for _ in range(steps):
        for rid, token in zip(seqs, result.token_ids):
            seqs[rid].append(token)
        result = runner.execute(_step(StepKind.DECODE, kv, seqs, {rid: len(t) - 1 for rid, t in seqs.items()}))
    for rid in seqs:
        kv.free(rid)
    assert kv.audit_blocks() == {}
    return [t[len(p):] for t, p in zip(seqs.values(), prompts)]


def decode_by_recompute(model, prompt: list[int], steps: int) -> list[int]:
    tokens = list(prompt)
    device = model.embed.device
    with torch.no_grad():
        for _ in range(steps + 1):
            hidden = model(torch.tensor(tokens, device=device), ForwardBatch.for_prompts([len(tokens)], device))
            tokens.append(int(model.compute_logits(hidden[-1:]).argmax(-1)))
    return tokens[len(prompt):-1]
