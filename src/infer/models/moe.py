"""A mixture of experts' sparse MLP: a router picks each token's k experts, whose gated MLPs run on it and are summed
with the router's weights (layerzero's moe_gate and fused_moe, or with the router's logits from the norm before it,
fused_add_rms_norm_router and fused_moe_routed). The experts' weights are stacked, one tensor per
projection: gate and up as w13 [E, 2I, H] (gate rows first), down as w2 [E, H, I]; the checkpoint's per-expert
tensors are copied into their slices at load, so no second copy of the experts ever exists. Experts a checkpoint
stores quantized (a GGUF's 4-bit or Q8_0 ones) stay so where a kernel takes them (`Int4Experts`, `W8Experts`)."""

from __future__ import annotations

import torch
from torch import nn

import layerzero as lz
from infer.families.catalog import MoE
from infer.families.config import ModelConfig
from infer.models.layers import WeightMap, WeightSlot, empty_param
from infer.models.quant import ExpertStack, Int4Experts, W8Experts

ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}  # the config's name -> fused_moe's


class SparseMLP(nn.Module):
    """The router and the stacked experts of one sparse layer. Under tensor parallelism every rank holds all experts'
    slices of the intermediate dimension (w13's rows, w2's columns), or with expert parallelism `experts`, a
    contiguous range of whole experts (the router stays whole: every rank routes every token, and a pair routed to
    another rank's expert counts zero here); either way the output is a partial sum, which the block sums over ranks."""

    def __init__(self, cfg: ModelConfig, moe: MoE, experts: range | None = None) -> None:
        super().__init__()
        inner, hidden = cfg.moe_intermediate_size, cfg.hidden_size
        self.experts = range(cfg.num_experts) if experts is None else experts
        self.projections, self.inner = moe.projections, inner  # the checkpoint's gate, up, down names
        self.top_k, self.renormalize = cfg.num_experts_per_tok, cfg.norm_topk_prob
        self.activation = ACTIVATIONS[cfg.hidden_act]
        self.router = empty_param(cfg.num_experts, hidden)
        self.w13 = empty_param(len(self.experts), 2 * inner, hidden)
        self.w2 = empty_param(len(self.experts), hidden, inner)
        self.gate_site, self.experts_site = lz.bind("moe_gate"), ExpertsSite()
        self.routed_site = lz.bind("fused_moe_routed")

    def weight_map(self) -> WeightMap:
        """The checkpoint's names under the layer's MLP prefix -> the router and each expert's slices."""
        gate, up, down = self.projections
        out = {"gate.weight": WeightSlot("router")}
        for i, e in enumerate(self.experts):
            out |= {f"experts.{e}.{gate}.weight": WeightSlot("w13", 0, self.inner, index=i),
                    f"experts.{e}.{up}.weight": WeightSlot("w13", self.inner, self.inner, index=i),
                    f"experts.{e}.{down}.weight": WeightSlot("w2", index=i)}
        return out

    @property
    def routes_logits(self) -> bool:
        """Whether the layer takes router logits computed by the norm before it (`forward`'s `logits`): with every
        expert here (no expert parallelism) and dense, the form `fused_moe_routed` takes."""
        dense = not isinstance(self.w13, (Int4Experts, W8Experts)) and not isinstance(self.w2, (Int4Experts, W8Experts))
        return dense and len(self.experts) == self.router.shape[0]

    def forward(self, x: torch.Tensor, logits: torch.Tensor | None = None) -> torch.Tensor:
        """The experts' sum over x [T, H]; with the router's `logits` [T, E] already computed (`routes_logits`), the
        routing happens inside the experts' op."""
        if logits is not None:
            return self.routed_site(x, self.w13, self.w2, logits, self.top_k, renormalize=self.renormalize,
                                    activation=self.activation)
        weights, ids = self.gate_site(x, self.router, self.top_k, renormalize=self.renormalize)
        if len(self.experts) < self.router.shape[0]:  # expert parallel: another rank's pairs weigh 0 on local expert 0
            local = ids - self.experts.start
            here = (local >= 0) & (local < len(self.experts))
            ids, weights = torch.where(here, local, 0), torch.where(here, weights, 0.0)
        return self.experts_site(x, self.w13, self.w2, weights, ids, self.activation)

    def quantize_experts_fp8(self, dtype: torch.dtype) -> bool:
        """Quantize dense experts to float8 e4m3 in 128 x 128 blocks (`--quantization fp8`) where a kernel other
        than the reference takes them; returns whether it did (elsewhere they stay as they are)."""
        if isinstance(self.w13, (Int4Experts, W8Experts)):
            return False
        w13, w2 = W8Experts.quantize(self.w13.detach()), W8Experts.quantize(self.w2.detach())
        if self.experts_site.kernel_for(w13, w2, self.top_k, dtype).startswith("reference."):
            return False
        for name, stack in (("w13", w13), ("w2", w2)):
            delattr(self, name)
            setattr(self, name, stack)
        return True

    def settle_experts(self, dtype: torch.dtype) -> None:
        """Keep quantized experts only where a kernel other than the reference takes both stacks (one form): the
        reference would dequantize each routed expert on every call. Otherwise they are dequantized to `dtype` here,
        once (a GGUF whose down projections are Q6_K while gate and up are Q4_K, FP8 experts without a kernel)."""
        w13, w2 = self.w13, self.w2
        if not isinstance(w13, (Int4Experts, W8Experts)) and not isinstance(w2, (Int4Experts, W8Experts)):
            return
        if isinstance(w13, W8Experts) and isinstance(w2, W8Experts) and w13.block_size != w2.block_size \
                and w13.block_size[1] == w2.block_size[1]:  # the op takes one block for both stacks
            w13, w2 = w13.per_row(), w2.per_row()
            self.w13, self.w2 = w13, w2
        same_form = type(w13) is type(w2) and (not isinstance(w13, W8Experts) or w13.block_size == w2.block_size)
        if same_form and not self.experts_site.kernel_for(w13, w2, self.top_k, dtype).startswith("reference."):
            return
        for name in ("w13", "w2"):
            stack = getattr(self, name)
            if isinstance(stack, (Int4Experts, W8Experts)):
                dense = stack.dequantize().to(dtype)
                delattr(self, name)
                setattr(self, name, nn.Parameter(dense, requires_grad=False))


class ExpertsSite:
    """The experts' sum through a bound `fused_moe_int4` for 4-bit stacks, `fused_moe_w8` for 8-bit ones, `fused_moe`
    for dense ones."""

    __slots__ = ("dense", "int4", "w8")

    def __init__(self) -> None:
        self.dense, self.int4, self.w8 = lz.bind("fused_moe"), lz.bind("fused_moe_int4"), lz.bind("fused_moe_w8")

    def __call__(self, x: torch.Tensor, w13: torch.Tensor | ExpertStack, w2: torch.Tensor | ExpertStack,
                 weights: torch.Tensor, ids: torch.Tensor, activation: str) -> torch.Tensor:
        if isinstance(w13, Int4Experts) and isinstance(w2, Int4Experts):
            return self.int4(x, w13.qweight, w13.scales, w2.qweight, w2.scales, weights, ids,
                             group_size=w13.group_size, activation=activation)
        if isinstance(w13, W8Experts) and isinstance(w2, W8Experts):
            return self.w8(x, w13.weight, w13.scale, w2.weight, w2.scale, weights, ids, block_size=w13.block_size,
                           activation=activation)
        return self.dense(x, w13, w2, weights, ids, activation=activation)

    @staticmethod
    def kernel_for(w13: ExpertStack, w2: ExpertStack, top_k: int, dtype: torch.dtype) -> str:
        """The kernel layerzero would pick for these stacks (a probe of one token, nothing run)."""
        device = w13.scales.device if isinstance(w13, Int4Experts) else w13.weight.device
        x = torch.zeros(1, w13.shape[2], dtype=dtype, device=device)
        weights = torch.zeros(1, top_k, device=device)
        ids = torch.zeros(1, top_k, dtype=torch.int64, device=device)
        if isinstance(w13, Int4Experts):
            return lz.which("fused_moe_int4", x, w13.qweight, w13.scales, w2.qweight, w2.scales, weights, ids,
                            group_size=w13.group_size)["kernel_id"]
        return lz.which("fused_moe_w8", x, w13.weight, w13.scale, w2.weight, w2.scale, weights, ids,
                        block_size=w13.block_size)["kernel_id"]
