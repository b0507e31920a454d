"""The torch engine: owns the weights and the paged KV cache, turns a StepInput into sampled tokens.

A step is queued in two calls, `forward` (the model and LM head) and `sample` (given the grammar masks the engine
fills meanwhile), without any host synchronization: inputs go up through pinned memory in one copy,
sampling runs on the device from per-slot parameters written when a request joins (sampling/slots.py),
and the sampled ids come back through a pinned slot that is read only when the engine asks for the
result (the step boundary). Decode steps run from fixed buffers, through a CUDA
graph when one is captured for the batch's bucket (for the smallest buckets, one bound to a short context while the
rows' contexts fit it: runners/graphs.py); so do prefill and mixed steps, by token bucket and
sequence slots (runners/prefill_graphs.py). With INFER_STRICT_SYNC=1 any other sync raises.
With a probe bank, taps at the probed layers' `resid_post` fill its score buffer during the forward (and
inside the graphs); the rows a step's requests asked for travel back with the sampled ids.
A step with draft tokens (speculation) is verified on the device (runners/verify.py, sampling/speculative.py);
its emitted tokens and counts come back packed through the same readback.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import NamedTuple

import numpy as np
import torch

import layerzero as lz
from infer.models.base import CausalLM
from infer.lora.stacks import LoRAWeights
from infer.models.forward_batch import ForwardBatch, cu_seqlens
from infer.runners.cuda_graphs import GraphStats
from infer.runners.decode_buffers import DecodeBuffers, DecodeRows
from infer.runners.drafter import Drafter, Drafts
from infer.runners.graphs import SHORT_CONTEXT_ROWS, Graphs, decode_graphs, short_bounds
from infer.runners.prefill_buffers import PrefillBuffers, PrefillInputs, PrefillShape
from infer.runners.prefill_graphs import PrefillGraphs, prefill_shapes
from infer.runners.step import StepInput, StepKind, StepResult
from infer.runners.strict_sync import step_scope
from infer.runners.verify import VerifyInputs, decode_rows, pack, unpack, verify_inputs
from infer.sampling.logprobs import LogprobTensors, by_sequence, logprob_tensors
from infer.sampling.sampler import SamplingTensors, sample
from infer.sampling.slots import SamplingSlots
from infer.sampling.speculative import verify
from infer.sampling.token_mask import apply_token_bitmask
from infer.transfer import Readback, upload
from omniscience import ProbeBank, ProbeLayout


@dataclass
class LaunchedStep:
    """A step whose GPU work is queued; result() waits for it (the step boundary)."""

    readback: Readback
    num_seqs: int
    logprobs: tuple[list[int], LogprobTensors] | None = None  # (rows, tensors) of rows that asked
    prompt_logprobs: list[LogprobTensors | None] | None = None
    probe_layout: ProbeLayout | None = None  # set when probe scores were read back with the ids
    probe_prompt: list[int] | None = None  # per sequence: prompt score rows following the num_seqs sampled ones
    verify_width: int | None = None  # speculation: K + 1 (the readback holds packed tokens and counts)
    pooled: tuple[list[int], torch.Tensor] | None = None  # (sequences, their pooled rows [n, hidden] float32)

    def result(self) -> StepResult:
        token_ids = self.readback.read()
        out = StepResult(token_ids=token_ids)
        if self.verify_width is not None:
            out.token_ids, out.extra_tokens = unpack(token_ids, self.num_seqs, self.verify_width)
        scores = self.readback.read_scores()
        if scores is not None:
            out.probe_layout = self.probe_layout
            out.probe_scores = scores[: self.num_seqs]
            if self.probe_prompt is not None:
                bounds = cu_seqlens(self.probe_prompt)
                out.prompt_probe_scores = [scores[self.num_seqs + a : self.num_seqs + b] for a, b in zip(bounds, bounds[1:])]
        if self.logprobs is not None:
            rows, tensors = self.logprobs
            out.logprobs = by_sequence(self.num_seqs, rows, tensors.to_host())
        if self.prompt_logprobs is not None:
            out.prompt_logprobs = [None if t is None else t.to_host() for t in self.prompt_logprobs]
        if self.pooled is not None:
            rows, values = self.pooled
            out.pooled = [None] * self.num_seqs
            for i, row in zip(rows, values.cpu().numpy()):
                out.pooled[i] = row
        return out


class Forward(NamedTuple):
    """A step's forward on the device: its logits in the LM head's dtype ([num_seqs, vocab], or [num_seqs, K + 1,
    vocab] when verifying; None for a prefill step where no row samples, which skips the LM head), the rows'
    sampling slots, the slots that advance, and for a prefill step its hidden states, batch and ids."""

    logits: torch.Tensor | None
    slots: torch.Tensor
    advancing: torch.Tensor
    verifying: VerifyInputs | None
    hidden: torch.Tensor | None = None
    batch: ForwardBatch | None = None
    ids: torch.Tensor | None = None


class Forwarded(NamedTuple):
    """A step between `TorchRunner.forward` and `sample`: its forward, its rows' sampling state, the drafter's drafts."""

    step: StepInput
    fwd: Forward
    tensors: SamplingTensors | None
    drafted: Drafts | None


class TorchRunner:
    """Runs on CPU or CUDA through layerzero ops. The KV cache tensors exist only here."""

    def __init__(
        self, model: CausalLM, num_blocks: int, block_size: int, max_batch_size: int = 32,
        max_seq_len: int = 4096, graph_batch_sizes: tuple[int, ...] = (), probes: ProbeBank | None = None,
        max_drafts: int = 0, drafter: Drafter | None = None, prefill_graph_tokens: tuple[int, ...] = (),
        lora: LoRAWeights | None = None, kv_cache_dtype: torch.dtype | None = None,
    ) -> None:
        cfg = model.config
        self.model = model
        self.lora = lora  # LoRA adapters: attached to the model before any graph is captured
        self._adapters_in_step = True  # some row of the step runs an adapter (set by each step before it runs)
        self.tokens_site = lz.bind("broadcast")
        self.probes = probes
        self.drafter = drafter
        if probes is not None:  # before any graph is captured: the taps are part of the forward
            for layer, tap in probes.taps().items():
                model.blocks[layer].resid_post = tap
        self.device = model.embed.device
        self.launches_ahead = self.device.type != "cpu"
        self.block_size, self.num_blocks = block_size, num_blocks
        self.vocab_size = cfg.vocab_size
        self.max_batch_size = max_batch_size
        shape = (num_blocks, block_size, model.local.num_key_value_heads, cfg.head_dim)  # this rank's KV heads
        dtype = kv_cache_dtype or model.embed.dtype  # bf16 for a CPU bf16 model (EngineConfig.kv_cache_dtype)
        self.kv_caches = [
            (torch.zeros(shape, dtype=dtype, device=self.device), torch.zeros(shape, dtype=dtype, device=self.device))
            for _ in range(cfg.num_hidden_layers)
        ]
        max_blocks = -(-max_seq_len // block_size)
        self.decode_rows = max_batch_size * (max_drafts + 1)  # a verify step decodes K + 1 rows per sequence
        self.buffers = DecodeBuffers(self.device, self.decode_rows, max_blocks, max_seq_len)
        shapes = prefill_shapes(prefill_graph_tokens, max_batch_size) if prefill_graph_tokens else ()
        largest = PrefillShape(max(s.tokens for s in shapes), max(s.seqs for s in shapes)) if shapes else None
        self.prefill_buffers = PrefillBuffers(self.device, self.kv_caches, max_blocks, max_seq_len, largest)
        self.sampling_slots = SamplingSlots(max_batch_size, cfg.vocab_size, self.device)
        self.last_tokens = self.buffers.last_tokens[: max(max_batch_size, 1)]  # the sampled ids decode rows read
        scores = (probes.scores.shape[0] + max_batch_size, probes.scores.shape[1]) if probes is not None else None
        # one per step in flight; a verify step reads back max_drafts + 1 tokens and a count per row
        readback_rows = max_batch_size * (max_drafts + 2 if max_drafts else 1)
        self._readbacks = [Readback(self.device, readback_rows, scores) for _ in range(2)]
        self._next_readback = 0
        self.graphs: Graphs | None = None
        self.base_graphs: Graphs | None = None  # with LoRA: decode graphs of steps on the base model only
        # the smallest buckets' graphs again, by a key bound below the capacity (graphs.py), smallest first
        self.short_graphs: dict[int, Graphs] = {}
        self.prefill_graphs: PrefillGraphs | None = None
        pool = torch.cuda.graph_pool_handle() if self.device.type == "cuda" else None  # prefill's, then decode's
        if shapes:
            self.prefill_graphs = PrefillGraphs(self._prefill_forward, self.prefill_buffers, shapes, self.device, pool)
        if graph_batch_sizes:
            if max(graph_batch_sizes) > self.decode_rows:
                raise ValueError(f"graph batch sizes {graph_batch_sizes} exceed the {self.decode_rows} rows of a decode step")
            sizes = tuple(sorted(graph_batch_sizes))
            pad = self.buffers.pad
            self.graphs = decode_graphs(self._decode_logits, sizes, self.device, self.model, pool, pad)
            if lora is not None:  # a step whose rows run no adapter replays graphs without the LoRA ops
                self.base_graphs = decode_graphs(partial(self._decode_logits, adapters=False), sizes, self.device,
                                                 self.model, pool, pad)
            short = tuple(s for s in sizes if s <= SHORT_CONTEXT_ROWS)
            if self.device.type == "cuda" and lora is None and short:
                self.short_graphs = {bound: decode_graphs(partial(self._decode_logits, max_context_len=bound), short,
                                                          self.device, self.model, pool, pad)
                                     for bound in short_bounds(max_seq_len)}

    @property
    def graph_stats(self) -> GraphStats | None:
        return self.graphs.stats if self.graphs is not None else None

    @property
    def short_graph_stats(self) -> dict[int, GraphStats]:
        return {bound: graphs.stats for bound, graphs in self.short_graphs.items()}

    @property
    def prefill_graph_stats(self) -> GraphStats | None:
        return self.prefill_graphs.stats if self.prefill_graphs is not None else None

    def execute(self, step: StepInput) -> StepResult:
        """One step, synchronously and without a grammar mask (tests, benchmarks, warm-up)."""
        return self.sample(self.forward(step), None).result()

    @torch.inference_mode()
    def forward(self, step: StepInput) -> Forwarded:
        """Queue the step's forward and LM head, and gather its rows' sampling state; nothing here waits for the
        device. The engine fills the grammar masks (which may read the step before) while the device runs this."""
        if step.num_seqs > self.max_batch_size:
            raise ValueError(f"step has {step.num_seqs} sequences; the runner was built for {self.max_batch_size}")
        drafted: Drafts | None = None
        self._prepare_adapters(step)
        with step_scope(self.device):
            if step.drafter_tokens is not None:
                if self.drafter is None:
                    raise ValueError("the step asks for drafter drafts; the runner was built without a draft model")
                self.sampling_slots.join(step.joined)  # the drafter samples with the joining rows' parameters
                drafted = self.drafter.propose(step, self.sampling_slots)
            fwd = self._forward(step, drafted)
            if step.drafter_tokens is None:  # queued behind the forward: host time the device does not wait for
                self.sampling_slots.join(step.joined)
            tensors = self.sampling_slots.gather(fwd.slots, step.sampling_slots) if fwd.logits is not None else None
            if tensors is not None and fwd.verifying is None and not tensors.plain_greedy:
                self.sampling_slots.advance(fwd.advancing)
        return Forwarded(step, fwd, tensors, drafted)

    @torch.inference_mode()
    def sample(self, forwarded: Forwarded, masks: torch.Tensor | None) -> LaunchedStep:
        """Queue the sampling (or the verification of drafts) of a forwarded step, its tokens' way back to the host
        and its read-outs; `masks`: the rows' [num_seqs, ceil(vocab / 32)] int32 bitmask of allowed tokens."""
        step, fwd, tensors, drafted = forwarded
        with step_scope(self.device):
            if tensors is None:  # no row samples (prompt chunks short of their ends): no LM head, nothing drawn
                token_ids = sent = torch.zeros(step.num_seqs, dtype=torch.int64, device=self.device)
                first = None
            else:
                first, token_ids, sent = self._draw(step, fwd, tensors, masks, drafted)
            self._share_last_tokens(step.num_seqs)
            readback = self._readbacks[self._next_readback]
            self._next_readback ^= 1
            verifying = fwd.verifying
            launched = LaunchedStep(readback, step.num_seqs, verify_width=None if verifying is None else verifying.width)
            scores = self._probe_rows(step, fwd.batch, launched) if step.probes and self.probes is not None else None
            readback.start(sent, scores)
            launched.logprobs = self._sampled_logprobs(step, first, token_ids) if first is not None else None
            if fwd.hidden is not None and fwd.batch is not None and fwd.ids is not None:
                launched.prompt_logprobs = self._prompt_logprobs(step, fwd.batch, fwd.hidden, fwd.ids)
                launched.pooled = pooled_rows(step, fwd.batch.cu_seqlens_q_host, fwd.hidden)
        return launched

    def _draw(self, step: StepInput, fwd: Forward, tensors: SamplingTensors, bitmask: torch.Tensor | None,
              drafted: Drafts | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Sample (or verify drafts) from the step's logits with the rows' sampling state `tensors`: (the logits the
        rows sample from, each row's first token, what the host reads back), the tokens counted into the sampling
        state and written where the next step's rows read their input."""
        logits, verifying, slots = fwd.logits, fwd.verifying, fwd.slots
        assert logits is not None
        first = logits if verifying is None else logits[:, 0]  # where rows without drafts sample
        if bitmask is not None:  # disallowed tokens to -inf before sampling (rows with a grammar draft nothing)
            apply_token_bitmask(first, bitmask)
        seen = self._seen_mask(step, logits.shape[-1])
        if verifying is None:
            token_ids = sample(logits, tensors, seen)
            self.sampling_slots.record(slots, step.sampling_slots, token_ids, samples=step.samples)
            self.last_tokens[: step.num_seqs].copy_(token_ids)
            return first, token_ids, token_ids
        if drafted is not None:
            verifying = verifying._replace(drafts=drafted.tokens)
        tokens, counts = verify(logits.float(), verifying.drafts, verifying.num_drafts, tensors,
                                draft_probs=None if drafted is None else drafted.probs, seen=seen)
        if not tensors.plain_greedy:
            self.sampling_slots.advance(slots, counts * verifying.counting)
        self.sampling_slots.record(slots, step.sampling_slots, tokens, counts * verifying.counting)
        self.last_tokens[: step.num_seqs].copy_(tokens.gather(1, (counts - 1)[:, None]).squeeze(1))
        return first, tokens[:, 0], pack(tokens, counts)

    @torch.inference_mode()
    def replay(self, step: StepInput) -> None:
        """A tensor-parallel worker's step: rank 0's forward on this rank's shard, every collective in rank 0's order
        (the forward's, the sampled ids' broadcast, the prompt logprobs' LM-head gathers); nothing is sampled."""
        self._prepare_adapters(step)
        with step_scope(self.device):
            fwd = self._forward(step, None)
            self._share_last_tokens(step.num_seqs)
            if fwd.batch is not None and fwd.hidden is not None and fwd.ids is not None:
                self._prompt_logprobs(step, fwd.batch, fwd.hidden, fwd.ids)  # the values go unused

    def _prepare_adapters(self, step: StepInput) -> None:
        """LoRA: the step's adapter loads into their slots (before the step: a load may read the disk), the joining
        requests' adapters, and whether any row runs one (an eager step without one skips the LoRA ops)."""
        if self.lora is not None:
            self.lora.load(step.lora_loads)
            self.lora.join(step.joined)
            self._adapters_in_step = bool((self.lora.row_ids(step.sampling_slots) >= 0).any())

    def check(self) -> None:
        """Raise when the runner can no longer run steps (a tensor-parallel worker died); one device always can."""

    def close(self) -> None:
        """Release what outlives the runner's memory (a tensor-parallel group); nothing on one device."""

    def _forward(self, step: StepInput, drafted: Drafts | None) -> Forward:
        """The step's forward and LM head: everything before sampling, and all a tensor-parallel worker runs too."""
        verifying: VerifyInputs | None = None
        if step.step_kind is StepKind.DECODE:
            logits, slots = self._decode(step, None if drafted is None else drafted.tokens)
            if step.drafts is not None:
                verifying = verify_inputs(step, self.device)
            advancing = slots if step.samples is None else upload(self._advancing(step), torch.int64, self.device)
            return Forward(logits, slots, advancing, verifying)
        inputs, hidden, ids = self._prefill(step, drafted)
        batch, slots, advancing = inputs.batch, inputs.sampling_slots, inputs.advancing
        logits: torch.Tensor | None = None
        if step.drafts is not None:
            verifying = verify_inputs(step, self.device, batch.cu_seqlens_q_host)
            assert verifying.logit_rows is not None
            logits = self.model.head_logits(hidden[verifying.logit_rows]).view(step.num_seqs, verifying.width, -1)
        elif step.samples is None or any(step.samples):  # tensor-parallel ranks all decide alike: the same step
            logits = self.model.head_logits(hidden[batch.last_token_indices])
        return Forward(logits, slots, advancing, verifying, hidden, batch, ids)

    def _share_last_tokens(self, num_seqs: int) -> None:
        """Tensor parallelism: rank 0's sampled ids to every rank, where the next step's rows that continue on the
        device (prev_rows) read their input token."""
        if self.model.shard.parallel:
            self.tokens_site(self.last_tokens[:num_seqs], group=self.model.shard.group)

    # decode -----------------------------------------------------------------------------------

    def _decode(self, step: StepInput, drafted: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits of a decode step (graph replay for its bucket, else eager) and the sequences' sampling slots
        on the device: [num_seqs, vocab], or [num_seqs, K + 1, vocab] for a step with drafts (runners/verify.py).
        `drafted` [num_seqs, K]: the drafter's tokens, written over the placeholder drafts on the device."""
        n = step.num_seqs
        rows = DecodeRows.of(step) if step.drafts is None else decode_rows(step)
        width = rows.num_rows // n
        bucket = self.graphs.bucket(rows.num_rows) if self.graphs is not None else None
        self.buffers.fill(rows, bucket or rows.num_rows,
                          None if self.lora is None else self.lora.row_ids(rows.sampling_slots))
        if drafted is not None:  # row b * width + j holds draft j (rows past a sequence's drafts are padding)
            self.buffers.token_ids(rows.num_rows).view(n, width)[:, 1:].copy_(drafted)
        slots = self.buffers.sampling_slots(rows.num_rows)[::width]
        graphs = self.graphs if self.base_graphs is None or self._adapters_in_step else self.base_graphs
        # the bucket first: a step of more rows than the short graphs hold never scans its context lengths for them
        if self.short_graphs and bucket is not None and bucket <= SHORT_CONTEXT_ROWS:
            graphs = self._short_graphs(int(np.max(step.context_lens)), graphs)
        if bucket is not None and graphs is not None:
            logits = graphs.replay(bucket)[: rows.num_rows]
        else:
            logits = self._decode_logits(rows.num_rows, self._attention_bound(int(np.max(step.context_lens))),
                                         self._adapters_in_step)
        return (logits if step.drafts is None else logits.view(n, width, -1)), slots

    def _attention_bound(self, longest: int) -> int:
        """An eager decode's attention bound: the longest context rounded up to 4 KV blocks (attention reads whole
        blocks anyway), so each layer's bound attention site re-binds once per 4 blocks rather than every token."""
        step = 4 * self.block_size
        return min(-(-longest // step) * step, self.buffers.max_context_len)

    def _decode_logits(self, rows: int, max_context_len: int | None = None, adapters: bool = True) -> torch.Tensor:
        """The decode forward on the fixed buffers (what a graph captures): ids, model, LM head; the rows' LoRA
        adapters when the runner has them and `adapters` asks for them.

        Attention reads at most max_context_len positions per row: the step's longest context when
        eager, the buffers' capacity (None) when captured, since a graph is replayed for every later step.
        """
        view = self.buffers.view(self.kv_caches, rows, max_context_len)
        if self.lora is not None and adapters:
            view.batch.lora_ids = view.lora_ids
        return self.model.head_logits(self.model(view.input_ids(), view.batch))

    def _short_graphs(self, longest: int, graphs: Graphs | None) -> Graphs | None:
        """The graphs of the smallest short-context bound that `longest` keys fit, else `graphs`."""
        for bound, short in self.short_graphs.items():
            if longest <= bound:
                return short
        return graphs

    # prefill and mixed steps -------------------------------------------------------------------

    def _place_drafts(self, step: StepInput, ids: torch.Tensor, drafted: torch.Tensor) -> None:
        """Write the drafter's tokens over the placeholder drafts of a packed (varlen) step's input ids."""
        assert step.drafts is not None
        cu, width = cu_seqlens(step.query_lens), drafted.shape[1]
        pairs = [(cu[b] + j, b * width + j - 1) for b, d in enumerate(step.drafts) for j in range(1, len(d) + 1)]
        index = upload(np.array(pairs, dtype=np.int64).T.tolist(), torch.int64, self.device)
        ids[index[0]] = drafted.view(-1)[index[1]]

    def _prefill(self, step: StepInput, drafted: Drafts | None) -> tuple[PrefillInputs, torch.Tensor, torch.Tensor]:
        """A prefill or mixed step's inputs, final hidden states [T, hidden] and input ids [T]: replayed in the graph
        of the smallest shape holding the step, else eagerly."""
        tokens = step.num_scheduled_tokens
        graphs = self.prefill_graphs
        shape = graphs.shape(tokens, step.num_seqs) if graphs is not None else None
        lora = None if self.lora is None else self.lora.token_ids(step.sampling_slots, step.query_lens)
        inputs = self.prefill_buffers.fill(step, shape, self._advancing(step), lora)
        if drafted is not None:
            self._place_drafts(step, inputs.token_ids, drafted.tokens)
        hidden, ids = self._prefill_forward(inputs) if graphs is None or shape is None else graphs.replay(shape)
        return inputs, hidden[:tokens], ids[:tokens]

    def _prefill_forward(self, inputs: PrefillInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """The model over a prefill step's (padded) inputs; a row whose last input is still on the device (prev_rows)
        takes the previous step's sampled id. What a prefill graph captures."""
        prev = inputs.prev_rows
        if self.lora is not None and (inputs.padded is not inputs.batch or self._adapters_in_step):  # a graph: always
            inputs.padded.lora_ids = inputs.lora_ids
        ids = torch.where(prev >= 0, self.last_tokens[prev.clamp(min=0)], inputs.token_ids)
        return self.model(ids, inputs.padded), ids

    @staticmethod
    def _advancing(step: StepInput) -> list[int]:
        """The sampling slots of the rows whose token counts (their noise moves on to the next draw)."""
        if step.samples is None:
            return step.sampling_slots
        return [slot for slot, counts in zip(step.sampling_slots, step.samples) if counts]

    # probes -------------------------------------------------------------------------------------

    def _probe_rows(self, step: StepInput, batch: ForwardBatch | None, launched: LaunchedStep) -> torch.Tensor:
        """The score rows to read back: each sequence's sampling row, then the prompt rows asked for."""
        assert self.probes is not None
        scores = self.probes.scores
        launched.probe_layout = self.probes.layout
        if batch is None:  # decode: row i * width samples sequence i (a graph bucket's padding rows are left out)
            width = launched.verify_width or 1
            return scores[: step.num_seqs * width : width]
        rows = batch.last_token_indices
        if step.probe_prompt is not None and any(step.probe_prompt):
            cu = batch.cu_seqlens_q_host
            prompt = [cu[i] + j for i, count in enumerate(step.probe_prompt) for j in range(count)]
            rows = torch.cat([rows, upload(prompt, torch.int64, self.device)])
            launched.probe_prompt = step.probe_prompt
        return scores[rows]

    # sampling extras --------------------------------------------------------------------------

    def _seen_mask(self, step: StepInput, vocab: int) -> torch.Tensor | None:
        if step.history is None:
            return None
        rows = [row for row, ids in enumerate(step.history) for _ in ids]
        cols = [t for ids in step.history for t in ids]
        seen = torch.zeros(step.num_seqs, vocab, dtype=torch.bool, device=self.device)
        index = upload([rows, cols], torch.int64, self.device)
        seen[index[0], index[1]] = True
        return seen

    def _sampled_logprobs(
        self, step: StepInput, logits: torch.Tensor, token_ids: torch.Tensor
    ) -> tuple[list[int], LogprobTensors] | None:
        asked = step.logprobs or []
        rows = [i for i, k in enumerate(asked) if k is not None]
        if not rows:
            return None
        index = upload(rows, torch.int64, self.device)
        return rows, logprob_tensors(logits[index], token_ids[index], [asked[i] for i in rows])  # type: ignore[misc]

    def _prompt_logprobs(
        self, step: StepInput, batch: ForwardBatch, hidden: torch.Tensor, ids: torch.Tensor
    ) -> list[LogprobTensors | None] | None:
        """Logprob of each prompt token given the ones before it, for the sequences that asked: the targets of a
        chunk's positions are its own next ids, then the prompt's next token past the chunk (StepInput.prompt_next)."""
        if step.prompt_logprobs is None or step.prompt_next is None:
            return None
        out: list[LogprobTensors | None] = [None] * step.num_seqs
        cu = batch.cu_seqlens_q_host
        asked = [i for i, k in enumerate(step.prompt_logprobs) if k is not None]
        following = upload([step.prompt_next[i] for i in asked], torch.long, ids.device)
        for j, i in enumerate(asked):
            start, end = cu[i], cu[i + 1]
            targets = ids[start + 1 : end]
            if step.prompt_next[i] >= 0:
                targets = torch.cat([targets, following[j : j + 1]])
            if len(targets):
                logits = self.model.compute_logits(hidden[start : start + len(targets)])
                out[i] = logprob_tensors(logits, targets, [step.prompt_logprobs[i]] * len(targets))
        return out


def pooled_rows(step: StepInput, cu: list[int], hidden: torch.Tensor) -> tuple[list[int], torch.Tensor] | None:
    """Each embedding row's pooling of its chunk (StepInput.pool) from the final hidden states [T, hidden]: the last
    row ("last"), the first ("cls") or the sum of the rows not pooled yet ("mean"), float32 [n, hidden]."""
    if step.pool is None:
        return None
    rows, values = [], []
    for i, pool in enumerate(step.pool):
        if pool is None:
            continue
        kind, skip = pool
        start, end = cu[i], cu[i + 1]
        if kind == "mean":
            values.append(hidden[start + skip : end].float().sum(dim=0))
        else:
            values.append(hidden[end - 1 if kind == "last" else start].float())
        rows.append(i)
    return (rows, torch.stack(values)) if rows else None
