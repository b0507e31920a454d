"""Adapters on the device: each adapted projection holds every slot's LoRA matrices stacked, and the runner's
`LoRAWeights` fills slots and tells the model which slot each token's row uses.

A projection of n fused parts (q, k, v; gate, up; or one) holds a [slots, n * R, in] and b [slots, out, n * R]
(R = --max-lora-rank): part j's A in rows [j * R, j * R + r) of a, its B (scaling folded in) in its output rows and
the same columns of b, zeros elsewhere. So one shrink and one expand serve the fused projection, whatever each part's
rank, and an adapter that leaves a part out holds zeros there. With tensor parallelism each rank holds the slice its
base weight holds: b's rows of a column-parallel projection (qkv, gate_up), a's columns of a row-parallel one (o,
down), whose partial sums the projection's all-reduce adds up.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import NamedTuple

import numpy as np
import torch

import layerzero as lz
from infer.engine.config import EngineConfigError
from infer.families.config import ModelConfig
from infer.lora.adapter import LoRAAdapter, parent_module, read_adapter
from infer.lora.registry import LoRALoad
from infer.models.shard import Cut, Shard
from infer.runners.step import Ints
from infer.sampling.slots import SlotState


class Part(NamedTuple):
    """One checkpoint projection inside a fused one: its module name and this rank's output rows."""

    module: str
    rows: int


class LoRAStack:
    """One projection's adapters in slots (see the module docstring); `__call__` adds them into its output."""

    def __init__(self, layer: int, parts: list[Part], in_features: int, row_parallel: bool, slots: int, rank: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.layer, self.parts, self.row_parallel, self.rank = layer, parts, row_parallel, rank
        out = sum(p.rows for p in parts)
        self.a = torch.zeros(slots, len(parts) * rank, in_features, dtype=dtype, device=device)
        self.b = torch.zeros(slots, out, len(parts) * rank, dtype=dtype, device=device)
        self.shrink_site, self.expand_site = lz.bind("lora_shrink"), lz.bind("lora_expand")

    def __call__(self, x: torch.Tensor, y: torch.Tensor, ids: torch.Tensor | None) -> torch.Tensor:
        """y (the base projection of x) plus each row's adapter, in place; y as it is when no row has one."""
        if ids is None:
            return y
        return self.expand_site(y, self.shrink_site(x, self.a, ids), self.b, ids)

    def write(self, slot: int, adapter: LoRAAdapter, cfg: ModelConfig, shard: Shard) -> None:
        """Fill `slot` with `adapter`'s matrices for this projection (zeros for the parts it leaves out)."""
        a, b = torch.zeros_like(self.a[slot], device="cpu"), torch.zeros_like(self.b[slot], device="cpu")
        row, r = 0, self.rank
        for j, part in enumerate(self.parts):
            pair = adapter.weights.get((self.layer, part.module))
            if pair is not None:
                lora_a, lora_b = pair
                cut = shard.cut(f"model.layers.{self.layer}.{parent_module(part.module)}.{part.module}.weight", cfg)
                if cut is not None:
                    lora_a, lora_b = (_cut(lora_a, cut), lora_b) if self.row_parallel else (lora_a, _cut(lora_b, cut))
                rank = lora_a.shape[0]
                a[j * r : j * r + rank] = lora_a
                b[row : row + part.rows, j * r : j * r + rank] = lora_b
            row += part.rows
        self.a[slot].copy_(a)
        self.b[slot].copy_(b)


def _cut(t: torch.Tensor, cut: Cut) -> torch.Tensor:
    """This rank's slice of a LoRA matrix along the base weight's cut dimension, zero-padded like the weight's."""
    part = t.narrow(cut.dim, cut.start, cut.stop - cut.start)
    pad = cut.size - part.shape[cut.dim]
    if pad == 0:
        return part
    shape = list(part.shape)
    shape[cut.dim] = pad
    return torch.cat([part, part.new_zeros(shape)], dim=cut.dim)


def attach(model: torch.nn.Module, slots: int, rank: int) -> list[LoRAStack]:
    """Give every dense block's projections a LoRAStack (a sparse MLP's experts get none): the model's forward adds
    each token's adapter from then on."""
    cfg, fused = model.config, model.family.fused_projections
    dtype, device = model.final_norm.weight.dtype, model.embed.device
    stacks = []
    for layer, block in enumerate(model.blocks):
        attn = block.attn
        qkv = [Part("qkv_proj", attn.q_size + 2 * attn.kv_size)] if fused else \
            [Part("q_proj", attn.q_size), Part("k_proj", attn.kv_size), Part("v_proj", attn.kv_size)]
        attn.qkv_lora = LoRAStack(layer, qkv, cfg.hidden_size, False, slots, rank, dtype, device)
        attn.o_lora = LoRAStack(layer, [Part("o_proj", cfg.hidden_size)], attn.q_size, True, slots, rank, dtype, device)
        stacks += [attn.qkv_lora, attn.o_lora]
        mlp = block.mlp
        if hasattr(mlp, "gate_up_lora"):  # a dense MLP
            inner = mlp.intermediate
            gate_up = [Part("gate_up_proj", 2 * inner)] if fused else [Part("gate_proj", inner), Part("up_proj", inner)]
            mlp.gate_up_lora = LoRAStack(layer, gate_up, cfg.hidden_size, False, slots, rank, dtype, device)
            mlp.down_lora = LoRAStack(layer, [Part("down_proj", cfg.hidden_size)], inner, True, slots, rank, dtype,
                                      device)
            stacks += [mlp.gate_up_lora, mlp.down_lora]
    return stacks


class LoRAWeights:
    """The runner's adapters: device slots (filled by the scheduler's `LoRALoad`s before a step), the read adapters
    kept on the host (least recently used dropped past `cpu_slots`), and which adapter slot each sampling slot's
    request runs, from which a step's rows get their ids (uploaded with the step's other per-row inputs)."""

    def __init__(self, model: torch.nn.Module, slots: int, rank: int, cpu_slots: int, max_batch_size: int) -> None:
        if model.shard.parallel and model.family.fused_projections:
            raise EngineConfigError(f"enable_lora=True: LoRA adapters on {model.config.model_type} (fused q/k/v and "
                                    "gate/up checkpoint tensors) are not supported with tensor parallelism")
        self.model, self.rank, self.cpu_slots = model, rank, cpu_slots
        self.stacks = attach(model, slots, rank)
        self._adapter_of = np.full(max_batch_size, -1, dtype=np.int64)  # sampling slot -> adapter slot
        self._host: OrderedDict[int, LoRAAdapter] = OrderedDict()  # adapter_id -> weights, least recent first
        self.disk_reads = 0

    def load(self, loads: list[LoRALoad]) -> None:
        """Write each adapter into its slot (read from disk unless kept on the host)."""
        for slot, ref in loads:
            adapter = self._host.pop(ref.adapter_id, None)
            if adapter is None:
                adapter = read_adapter(ref.name, ref.path, self.model.config, self.rank)
                self.disk_reads += 1
            self._host[ref.adapter_id] = adapter
            while len(self._host) > self.cpu_slots:
                self._host.popitem(last=False)
            for stack in self.stacks:
                stack.write(slot, adapter, self.model.config, self.model.shard)

    def join(self, joined: list[SlotState]) -> None:
        """The joining requests' adapter slots, by sampling slot."""
        for s in joined:
            self._adapter_of[s.slot] = s.lora_slot

    def row_ids(self, sampling_slots: Ints) -> np.ndarray:
        """Each row's adapter slot (-1: none), by its sampling slot."""
        return self._adapter_of[np.asarray(sampling_slots, dtype=np.int64)]

    def token_ids(self, sampling_slots: Ints, query_lens: list[int]) -> np.ndarray:
        """Each token's adapter slot in a packed step (its sequence's)."""
        return np.repeat(self.row_ids(sampling_slots), query_lens)
