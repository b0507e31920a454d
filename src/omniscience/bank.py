"""The probe bank: fixed device buffers for every probed layer, the taps that fill them, and hot reload.

Each probed layer owns a [hidden, capacity] float32 weight matrix, a bias and activation codes, and a
column range of one score buffer [max_rows, width]. A tap (installed where the model's `resid_post`
hook point was) writes the scores of every row of the step into that range and passes the residual on.
Nothing is allocated or synchronized inside the forward, and the addresses never change, so captured
CUDA graphs stay valid; a reload writes new weights into the same buffers (unused columns zero).
On CUDA the read-outs of all but the last probed layer run on a side stream, beside the blocks that
follow (docs/omniscience.md, "Overlap"); the last probed layer's tap joins it, so a forward ends with
every score written, graph captured or not.
Which rows belong to which request is decided outside the forward, by the caller, from the step's layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch
from torch import nn

from omniscience.config import ProbeError
from omniscience.kernel import ACTIVATION_CODES, probe_scores, workspace
from omniscience.weights import Probe, ProbeSet

COLUMN_ALIGN = 16  # a layer's capacity: its probe count rounded up, so a reload may add a few


def capacity(count: int) -> int:
    return -(-count // COLUMN_ALIGN) * COLUMN_ALIGN


@dataclass(frozen=True)
class ProbeLayout:
    """Which score column holds which probe, for one version of the loaded set (read with each step's scores)."""

    probes: tuple[Probe, ...]
    columns: dict[str, int] = field(hash=False)  # probe name -> column of the score buffer
    version: int

    @cached_property  # built once per version: requests asking for every probe share this tuple
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.probes)


class ProbeTap(nn.Module):
    """A passthrough at `blocks.{layer}.resid_post`: writes the layer's probe scores for the step's rows."""

    def __init__(self, bank: "ProbeBank", layer: int) -> None:
        super().__init__()
        self.bank, self.layer = bank, layer
        start, width = bank.column_ranges[layer]
        self._columns = slice(start, start + width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bank, side = self.bank, self.bank.side_stream
        if side is None:
            self._read(x)
        elif self.layer == bank.last_layer:  # join: the forward's later work (and readback) sees every score
            torch.cuda.current_stream(x.device).wait_stream(side)
            bank.reading.clear()
            self._read(x)
        else:  # fork: read beside the next blocks; holding x keeps its memory from reuse until the join
            side.wait_stream(torch.cuda.current_stream(x.device))
            with torch.cuda.stream(side):
                self._read(x)
            bank.reading.append(x)
        return x

    def _read(self, x: torch.Tensor) -> None:
        bank = self.bank
        probe_scores(x, bank.weights[self.layer], bank.biases[self.layer], bank.codes[self.layer],
                     bank.scores[: x.shape[0], self._columns], bank.scratch.get(self.layer))


class ProbeBank:
    """Probe weights and scores on the device, sized for `max_rows` rows per forward."""

    def __init__(self, probe_set: ProbeSet, hidden_size: int, max_rows: int, device: torch.device) -> None:
        self.hidden_size, self.device = hidden_size, device
        self.column_ranges: dict[int, tuple[int, int]] = {}  # layer -> (first column, capacity)
        width = 0
        for layer in probe_set.layers:
            cap = capacity(sum(p.layer == layer for p in probe_set.probes))
            self.column_ranges[layer] = (width, cap)
            width += cap
        self.weights = {l: torch.zeros(hidden_size, c, device=device) for l, (_, c) in self.column_ranges.items()}
        self.biases = {l: torch.zeros(c, device=device) for l, (_, c) in self.column_ranges.items()}
        self.codes = {l: torch.zeros(c, dtype=torch.int32, device=device) for l, (_, c) in self.column_ranges.items()}
        self.scores = torch.zeros(max_rows, width, device=device)
        # the split-K kernel's workspace per layer (decode steps on CUDA; see kernel.py)
        self.scratch = {l: workspace(c, device) for l, (_, c) in self.column_ranges.items()} if device.type == "cuda" else {}
        self.last_layer = max(self.column_ranges, default=-1)
        many = device.type == "cuda" and len(self.column_ranges) > 1
        self.side_stream = torch.cuda.Stream(device) if many else None
        self.reading: list[torch.Tensor] = []  # residuals the side stream reads, held from fork until join
        self.layout = ProbeLayout((), {}, 0)
        self.load(probe_set)

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(self.column_ranges)

    def taps(self) -> dict[int, ProbeTap]:
        """One tap per probed layer, to put where the model's `blocks.{layer}.resid_post` is."""
        return {layer: ProbeTap(self, layer) for layer in self.column_ranges}

    def check_fits(self, probe_set: ProbeSet) -> None:
        """A reload may change weights, names and activations, and add probes up to each layer's capacity;
        a new layer or more probes than the capacity would need new buffers (and graphs): restart instead."""
        for layer in probe_set.layers:
            if layer not in self.column_ranges:
                raise ProbeError(f"{probe_set.path}: layer {layer} is not probed by the running set (layers "
                                 f"{', '.join(map(str, self.layers))}); adding a layer needs a restart")
            count = sum(p.layer == layer for p in probe_set.probes)
            cap = self.column_ranges[layer][1]
            if count > cap:
                raise ProbeError(f"{probe_set.path}: layer {layer} has {count} probes; the running set has room "
                                 f"for {cap} there; more needs a restart")
        if probe_set.probes and probe_set.probes[0].weight.shape[0] != self.hidden_size:
            raise ProbeError(f"{probe_set.path}: probes have hidden size {probe_set.probes[0].weight.shape[0]}, "
                             f"the model {self.hidden_size}")

    def load(self, probe_set: ProbeSet) -> ProbeLayout:
        """Write the set's weights into the buffers in place (queued on the current stream after the steps
        already launched, so they read the old weights) and return the new layout."""
        self.check_fits(probe_set)
        columns: dict[str, int] = {}
        for layer, (start, cap) in self.column_ranges.items():
            members = [p for p in probe_set.probes if p.layer == layer]
            weight = torch.zeros(self.hidden_size, cap)
            bias = torch.zeros(cap)
            codes = torch.zeros(cap, dtype=torch.int32)
            for j, probe in enumerate(members):
                weight[:, j] = probe.weight
                bias[j] = probe.bias
                codes[j] = ACTIVATION_CODES[probe.activation]
                columns[probe.name] = start + j
            self.weights[layer].copy_(weight)
            self.biases[layer].copy_(bias)
            self.codes[layer].copy_(codes)
        self.layout = ProbeLayout(probe_set.probes, columns, self.layout.version + 1)
        return self.layout
