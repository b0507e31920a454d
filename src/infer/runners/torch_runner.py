"""The torch engine: owns the weights and the paged KV cache, turns a StepInput into sampled tokens."""

from __future__ import annotations

import torch

from infer.models.base import CausalLM
from infer.models.forward_batch import ForwardBatch, cu_seqlens
from infer.runners.step import StepInput, StepKind, StepResult
from infer.sampling.logprobs import TokenLogprob, token_logprobs
from infer.sampling.sampler import SamplingTensors, sample


class TorchRunner:
    """Runs on CPU or CUDA through layerzero ops. The KV cache tensors exist only here."""

    def __init__(self, model: CausalLM, num_blocks: int, block_size: int) -> None:
        cfg = model.config
        self.model = model
        self.device = model.embed.device
        self.block_size = block_size
        self.vocab_size = cfg.vocab_size
        shape = (num_blocks, block_size, cfg.num_key_value_heads, cfg.head_dim)
        dtype = model.embed.dtype
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(cfg.num_hidden_layers)
        ]

    def _tensor(self, values: list[int], dtype: torch.dtype) -> torch.Tensor:
        return torch.tensor(values, dtype=dtype).to(self.device)

    def _forward_batch(self, step: StepInput) -> ForwardBatch:
        cu = cu_seqlens(step.query_lens)
        width = max(len(t) for t in step.block_tables)
        tables = [t + [0] * (width - len(t)) for t in step.block_tables]
        return ForwardBatch(
            is_prefill=step.step_kind is StepKind.PREFILL,
            positions=self._tensor(step.positions, torch.int64),
            cu_seqlens_q=self._tensor(cu, torch.int32),
            cu_seqlens_q_host=cu,
            max_seqlen_q=max(step.query_lens),
            context_lens=self._tensor(step.context_lens, torch.int32),
            max_context_len=max(step.context_lens),
            block_tables=self._tensor(tables, torch.int32),
            slot_mapping=self._tensor(step.slot_mapping, torch.int64),
            kv_caches=self.kv_caches,
        )

    def _seen_mask(self, step: StepInput, vocab: int) -> torch.Tensor | None:
        if step.history is None:
            return None
        seen = torch.zeros(step.num_seqs, vocab, dtype=torch.bool)
        for row, ids in enumerate(step.history):
            seen[row, ids] = True
        return seen.to(self.device)

    @torch.inference_mode()
    def execute(self, step: StepInput) -> StepResult:
        batch = self._forward_batch(step)
        hidden = self.model(self._tensor(step.token_ids, torch.int64), batch)
        logits = self.model.compute_logits(hidden[batch.last_token_indices])
        tensors = SamplingTensors.from_params(
            step.sampling, step.seeds, step.output_steps, logits.shape[-1], self.device
        )
        token_ids = sample(logits, tensors, self._seen_mask(step, logits.shape[-1]))
        return StepResult(
            token_ids=token_ids.tolist(),
            logprobs=self._sampled_logprobs(step, logits, token_ids),
            prompt_logprobs=self._prompt_logprobs(step, batch, hidden),
        )

    def _sampled_logprobs(self, step: StepInput, logits: torch.Tensor, token_ids: torch.Tensor) -> list[TokenLogprob | None]:
        rows = [i for i, k in enumerate(step.logprobs) if k is not None]
        if not rows:
            return []
        found = token_logprobs(logits[rows], token_ids[rows], [step.logprobs[i] for i in rows])  # type: ignore[misc]
        out: list[TokenLogprob | None] = [None] * step.num_seqs
        for i, lp in zip(rows, found):
            out[i] = lp
        return out

    def _prompt_logprobs(
        self, step: StepInput, batch: ForwardBatch, hidden: torch.Tensor
    ) -> list[list[TokenLogprob | None] | None]:
        """Logprob of each prompt token given the ones before it, for the sequences that asked."""
        if not any(k is not None for k in step.prompt_logprobs):
            return []
        out: list[list[TokenLogprob | None] | None] = [None] * step.num_seqs
        cu = batch.cu_seqlens_q_host
        ids = torch.tensor(step.token_ids, dtype=torch.int64, device=self.device)
        for i, k in enumerate(step.prompt_logprobs):
            if k is None:
                continue
            start, end = cu[i], cu[i + 1]
            logits = self.model.compute_logits(hidden[start : end - 1])
            out[i] = [None, *token_logprobs(logits, ids[start + 1 : end], [k] * (end - start - 1))]
        return out
