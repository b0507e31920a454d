"""Fixed-address device inputs of a decode step, filled in place from pinned host staging with one copy.

CUDA graphs replay kernels with the pointers they were captured with, so every per-step input of a
decode step (token ids, positions, KV slots, context lengths, block tables, where each row's input token sits, and
the rows' sampling slots) lives in one device byte buffer with typed views. The previous step's sampled ids live in
the same buffer (`last_tokens`, written on the device), so a row's input token is one gather from either: its own
id, uploaded, or the id the previous step sampled for its sequence, which the host has not read yet.
The host writes the next step into one of two pinned staging buffers (double buffering: a buffer is
rewritten only after the step that used it has been read back) and one asynchronous copy moves it.
Rows past the live batch are padding: slot -1 (the KV store skips it) and context length 0.

The layout follows the step's padded row count (its graph bucket): a bucket of r rows packs its inputs into the
buffer's first bytes, so a batch-1 step uploads a few hundred bytes whatever max_batch is. Laid out for max_batch rows,
a 1-row step copied 13 KiB at 256 rows, which cost the step boundary ~13 µs (docs/gpu.md). Each bucket's graph reads
its own layout's addresses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from infer.models.forward_batch import ForwardBatch, KVCache
from infer.runners.step import Ints, StepInput
from infer.transfer import aligned

_INT64_ROWS = ("token_ids", "positions", "slot_mapping", "sources", "sampling_slots", "lora_ids")
_SOURCES = _INT64_ROWS.index("sources")
# A padding row: token 0 at position 0, KV slot -1 (the KV store skips it), sampling slot 0 (padding rows are never
# sampled), no LoRA adapter; its source (its own token id) depends on the row, written apart.
_PADDING = np.array([[0], [0], [-1], [0], [0], [-1]], dtype=np.int64)


class DecodeRows(NamedTuple):
    """The per-row inputs of a decode forward, one row per query token (a verify step has k + 1 per sequence)."""

    token_ids: Ints
    positions: Ints
    slot_mapping: Ints
    prev_rows: Ints  # per row: the previous step's row whose sampled id is its token, or -1
    sampling_slots: Ints
    context_lens: Ints
    block_tables: list[list[int]] | np.ndarray  # an array: [rows, width], zero-padded

    @classmethod
    def of(cls, step: StepInput) -> DecodeRows:
        """A plain decode step's rows: one per sequence."""
        return cls(step.token_ids, step.positions, step.slot_mapping, step.prev_rows or [-1] * step.num_seqs,
                   step.sampling_slots, step.context_lens, step.block_tables)

    @property
    def num_rows(self) -> int:
        return len(self.token_ids)


@dataclass
class DecodeView:
    """The first `rows` rows of the buffers as a model input."""

    tokens: torch.Tensor  # the whole buffer as int64: the rows' own token ids and the previous step's sampled ids
    sources: torch.Tensor  # [rows] int64: where in `tokens` each row's input token sits
    sampling_slots: torch.Tensor  # [rows] int64: each row's slot of sampling state
    lora_ids: torch.Tensor  # [rows] int64: each row's LoRA adapter slot, or -1
    batch: ForwardBatch

    def input_ids(self) -> torch.Tensor:
        """The rows' input token ids [rows] on the device: one gather (queued, not read)."""
        return self.tokens[self.sources]


class _Layout(NamedTuple):
    """Byte offsets of a `rows`-row step's inputs: int64 [6, stride], context lengths, block tables; every section
    and every int64 row starts aligned (transfer.ALIGN: Triton specializes a pointer on it)."""

    stride: int  # int64 elements per int row: rows rounded up to 2
    ctx: int
    tables: int
    end: int

    @classmethod
    def of(cls, rows: int, max_blocks: int) -> _Layout:
        stride = rows + rows % 2
        ctx = len(_INT64_ROWS) * stride * 8
        tables = ctx + aligned(rows * 4)
        return cls(stride, ctx, tables, tables + rows * max_blocks * 4)


class DecodeBuffers:
    def __init__(self, device: torch.device, max_batch: int, max_blocks: int, max_context_len: int) -> None:
        self.device, self.max_batch, self.max_blocks = device, max_batch, max_blocks
        self.max_context_len = max_context_len
        staged = _Layout.of(max_batch, max_blocks).end
        carried_at = aligned(staged)  # the sampled ids' bytes, past every layout (never uploaded)
        pinned = device.type == "cuda"
        self._staging = [torch.zeros(staged, dtype=torch.uint8, pin_memory=pinned) for _ in range(2)]
        # per staging buffer: the row count of the layout it holds and the table each of its rows holds
        self._staged_rows = [0, 0]
        self._tables_written: list[list[list[int]]] = [[], []]
        self._next = 0
        self._device_bytes = torch.zeros(carried_at + max_batch * 8, dtype=torch.uint8, device=device)
        self._tokens = self._device_bytes.view(torch.int64)
        self._carried = carried_at // 8
        # per sequence row of a step: the id it sampled, where the next step's rows that continue it read their input
        self.last_tokens = self._tokens[self._carried :]
        self._cu = torch.arange(max_batch + 1, dtype=torch.int32, device=device)

    def _views(self, raw: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(int64 [6, rows], context_lens [rows], block_tables [rows, max_blocks]) of the `rows`-row layout."""
        at = _Layout.of(rows, self.max_blocks)
        ints = raw[: at.ctx].view(torch.int64).view(len(_INT64_ROWS), at.stride)[:, :rows]
        ctx = raw[at.ctx : at.ctx + rows * 4].view(torch.int32)
        tables = raw[at.tables : at.end].view(torch.int32).view(rows, self.max_blocks)
        return ints, ctx, tables

    def pad(self, rows: int) -> None:
        """Make the device's `rows`-row layout all padding (before a graph's warm-up runs the forward on it): a fill
        of no rows."""
        self.fill(DecodeRows([], [], [], [], [], [], []), rows)

    @property
    def _filled_rows(self) -> int:
        """The row count of the last fill's layout (held by the staging buffer it used)."""
        return self._staged_rows[self._next ^ 1]

    def view(self, kv_caches: list[KVCache], rows: int, max_context_len: int | None = None) -> DecodeView:
        """The device buffers' `rows`-row layout (what a fill for `rows` wrote); the same addresses every call.

        max_context_len bounds the attention's work: a captured graph must take the buffers' capacity
        (it serves every later step), an eager step passes its own longest context.
        """
        ints, ctx, tables = self._views(self._device_bytes, rows)
        batch = ForwardBatch(
            is_prefill=False,
            positions=ints[1, :rows],
            cu_seqlens_q=self._cu[: rows + 1],
            cu_seqlens_q_host=list(range(rows + 1)),
            max_seqlen_q=1,
            context_lens=ctx,
            max_context_len=self.max_context_len if max_context_len is None else max_context_len,
            block_tables=tables,
            slot_mapping=ints[2, :rows],
            kv_caches=kv_caches,
        )
        return DecodeView(tokens=self._tokens, sources=ints[_SOURCES], sampling_slots=ints[4], lora_ids=ints[5],
                          batch=batch)

    def token_ids(self, rows: int) -> torch.Tensor:
        """The device view of the last fill's first `rows` rows' token ids (written in place after a fill: drafter
        drafts)."""
        return self._views(self._device_bytes, self._filled_rows)[0][0, :rows]

    def sampling_slots(self, rows: int) -> torch.Tensor:
        """The device view of the last fill's first `rows` rows' sampling slots."""
        return self._views(self._device_bytes, self._filled_rows)[0][4, :rows]

    def fill(self, step: DecodeRows, rows: int, lora_ids: np.ndarray | None = None) -> None:
        """Write `step`'s rows (padded to `rows`) and their LoRA adapter slots (None: none) into the device buffers:
        one host->device copy, no sync."""
        n = step.num_rows
        if not n <= rows <= self.max_batch:
            raise ValueError(f"decode batch of {n} rows padded to {rows} rows; the buffers hold {self.max_batch}")
        staging, written = self._staging[self._next], self._tables_written[self._next]
        if self._staged_rows[self._next] != rows:  # another layout: the rows' tables sit elsewhere
            written.clear()
            self._staged_rows[self._next] = rows
        self._next ^= 1
        ints, ctx, tables = (t.numpy() for t in self._views(staging, rows))
        ints[:, n:rows] = _PADDING
        ctx[n:rows] = 0
        ints[0, :n] = step.token_ids
        ints[1, :n] = step.positions
        ints[2, :n] = step.slot_mapping
        # a row's input: the id its sequence sampled last step (prev_rows >= 0), else its own (row 0 starts at byte 0)
        prev = np.asarray(step.prev_rows, dtype=np.int64)
        ints[_SOURCES, :n] = np.where(prev >= 0, self._carried + prev, np.arange(n))
        ints[_SOURCES, n:rows] = np.arange(n, rows)
        ints[4, :n] = step.sampling_slots
        ints[5, :n] = -1 if lora_ids is None else lora_ids
        ctx[:n] = step.context_lens
        if isinstance(step.block_tables, np.ndarray):  # the engine's decode table: one copy of the whole block
            width = step.block_tables.shape[1]
            if width > self.max_blocks:
                raise ValueError(f"a row has {width} blocks; the buffers hold {self.max_blocks}")
            tables[:n, :width] = step.block_tables
            written.clear()  # what this buffer holds no longer matches the lists below
            self._copy(staging, rows)
            return
        # A row's table is rewritten only when it differs from what this buffer holds there (tables grow one
        # block in block_size steps); entries past a sequence's context are never read, so need no clearing.
        written += [[]] * (n - len(written))
        for i, table in enumerate(step.block_tables):
            if table == written[i]:
                continue
            if len(table) > self.max_blocks:
                raise ValueError(f"row {i} has {len(table)} blocks; the buffers hold {self.max_blocks}")
            tables[i, : len(table)] = table
            written[i] = table
        self._copy(staging, rows)

    def upload_bytes(self, rows: int) -> int:
        """The bytes a fill for `rows` rows copies to the device."""
        return _Layout.of(rows, self.max_blocks).end

    def _copy(self, staging: torch.Tensor, rows: int) -> None:
        used = self.upload_bytes(rows)
        self._device_bytes[:used].copy_(staging[:used], non_blocking=self.device.type == "cuda")
