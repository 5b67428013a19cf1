"""The sparse mixture-of-experts MLP of Qwen3-MoE and Mixtral: a router picks top_k of n_experts SiLU-gated experts
per token, and their outputs are summed, weighted.

The router follows transformers 5.24 `models/qwen3_moe/modeling_qwen3_moe.py` and `models/mixtral/modeling_mixtral.py`:
logits = x @ gate.weight.T in the model dtype; p = softmax(logits) in float32 over ALL experts; top-k of p;
divided by their sum if `norm_topk_prob` (always for Mixtral); cast to the model dtype, except Mixtral's, kept
float32 (`float32_expert_weights`). Each slot's expert computes down_e(silu(gate_e(x)) * up_e(x)); the output is
the sum over slots of weight * expert output, summed over the top_k axis as transformers' default ("grouped_mm")
expert kernel does, so float32 logits are bit-identical to transformers' (tests/families/test_qwen3_moe.py,
tests/families/test_mixtral_parity.py).

Experts are stored stacked, [n_experts, ...], in `nn.Linear` layout and in transformers 5.24's in-memory layout:
`experts.gate_up_proj` [n_experts 2*d_expert_mlp d_model] (gate rows, then up rows) and `experts.down_proj`
[n_experts d_model d_expert_mlp], assembled at load from the per-expert keys on disk (each family's
`checkpoint_stacked`). Fusing gate and up makes one GEMM per expert (measurably faster on CPU than two) and makes
SiLU read the gate half as a strided view exactly as transformers does: SiLU's vectorised kernel rounds the tail
of a row differently, so a contiguous gate would differ in the last bit whenever d_expert_mlp is not a multiple of
the SIMD block. `W_gate`, `W_in`, `W_out` give per-expert views.

Hooks are all per token, never ragged: `hook_router_logits` [batch pos n_experts], `hook_expert_weights` /
`hook_expert_indices` [batch pos top_k], per-slot neurons `hook_expert_pre` / `hook_expert_post`
[batch pos top_k d_expert_mlp], and `hook_expert_result` [batch pos n_experts d_model], each expert's routed write
(computed only while hooked: the output is then its sum over experts, equal up to the order of the sum).
Under expert parallelism (hooked.distributed) each rank holds whole experts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from hooked.hooks import HookPoint
from hooked.layers import Projection, Split, all_experts_removed
from hooked.models.config import ModelConfig


class StackedExperts(nn.Module):
    """The stacked weights of one layer's experts (no forward: the sparse MLP indexes them)."""

    def __init__(self, n_experts: int, d_model: int, d_expert_mlp: int):
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(n_experts, 2 * d_expert_mlp, d_model))  # gate rows, then up rows
        self.down_proj = nn.Parameter(torch.empty(n_experts, d_model, d_expert_mlp))


class SparseMoeMLP(nn.Module):
    """Top-k routed experts (Qwen3-MoE's, and Mixtral's with float32 routing weights). Only experts that received
    tokens run, each once on all its tokens. The config gives d_model, n_experts, top_k, d_expert_mlp and
    norm_topk_prob."""

    # Qwen3-MoE casts the routing weights to the model dtype before weighting the slots; Mixtral keeps them
    # float32, so a bf16 model weights and sums its slots in float32 and casts the sum (hooked/models/mixtral.py).
    float32_expert_weights = False

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_experts, self.top_k, self.norm_topk_prob = cfg.n_experts, cfg.top_k, cfg.norm_topk_prob
        self.gate = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)  # the router
        self.experts = StackedExperts(cfg.n_experts, cfg.d_model, cfg.d_expert_mlp)
        # Hooks in forward order.
        self.hook_in = HookPoint("batch pos d_model")  # what the MLP reads: after ln2 (its weight included)
        self.hook_in.cached_by_default = False  # as hook_mlp_in: a copy of a neighbour, cached on request
        self.hook_router_logits = HookPoint("batch pos n_experts")  # raw logits, before softmax and top-k
        self.hook_expert_weights = HookPoint("batch pos top_k")  # after top-k (and renormalisation)
        self.hook_expert_indices = HookPoint("batch pos top_k")  # which expert each slot holds (int64)
        self.hook_expert_pre = HookPoint("batch pos top_k d_expert_mlp")  # slot expert's gate pre-activation
        self.hook_expert_post = HookPoint("batch pos top_k d_expert_mlp")  # slot expert's neurons: silu(gate) * up
        for point in (self.hook_expert_weights, self.hook_expert_pre, self.hook_expert_post):
            point.knows_slot_experts = True  # hook.slot_experts says which expert each slot holds
        # Each expert's routed write (weight * output; zeros where the router did not pick it), summed over experts
        # into the output: computed only while hooked (hooked.circuits' expert nodes), cached on request.
        self.hook_expert_result = HookPoint("batch pos n_experts d_model")
        self.hook_expert_result.cached_by_default = False
        # Expert parallelism (hooked.distributed): the experts this rank holds (experts.* are their
        # weights, in order) and the group whose ranks hold the others; one process holds them all.
        self.local_experts = range(cfg.n_experts)
        self.parallel = None

    def tp_plan(self) -> dict[str, Split]:
        """Expert parallelism: each rank holds whole experts; the router is replicated."""
        return {"experts.gate_up_proj": Split("experts", 0), "experts.down_proj": Split("experts", 0)}

    def tp_applied(self, parallel, local: dict[str, tuple[int, int]]) -> None:
        """After the cut: run only this rank's experts, and sum every rank's slots."""
        self.local_experts = range(*local["experts"])
        self.parallel = parallel

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = self.hook_in(x)
        router_logits = self.hook_router_logits(self.gate(x))
        if self.hook_router_logits.listening and bool(torch.isneginf(router_logits).all(-1).any()):  # no expert left
            raise ValueError(all_experts_removed(self.hook_router_logits.name, self.n_experts))
        probs = F.softmax(router_logits, dim=-1, dtype=torch.float32)  # over ALL experts
        top_probs, top_indices = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            top_probs = top_probs / top_probs.sum(-1, keepdim=True)
        self.hook_expert_weights.slot_experts = top_indices
        try:
            expert_weights = self.hook_expert_weights(
                top_probs if self.float32_expert_weights else top_probs.to(router_logits.dtype)
            )
        finally:
            self.hook_expert_weights.slot_experts = None
        expert_indices = self.hook_expert_indices(top_indices)
        if self.parallel is not None:  # each rank's experts read the replicated input and weights: their gradients
            x, expert_weights = self.parallel.copy(x), self.parallel.copy(expert_weights)  # sum every rank's
        slot_out = self.run_experts(x, expert_indices)  # [batch pos top_k d_model]
        if self.hook_expert_result.listening:  # slot k's weighted output moved to its expert's place
            weighted = (slot_out * expert_weights[..., None]).to(x.dtype)
            per_expert = weighted.new_zeros(*weighted.shape[:2], self.n_experts, weighted.shape[-1])
            per_expert.scatter_add_(2, expert_indices[..., None].expand_as(weighted), weighted)
            out = self.hook_expert_result(per_expert).sum(2)
        else:
            out = (slot_out * expert_weights[..., None]).sum(2).to(x.dtype)  # a no-op unless the weights are float32
        return out if self.parallel is None else self.parallel.reduce(out)  # slots of other ranks' experts

    def run_experts(
        self, x: Float[Tensor, "batch pos d_model"], expert_indices: Int[Tensor, "batch pos top_k"]
    ) -> Float[Tensor, "batch pos top_k d_model"]:
        """Each slot's expert applied to its token, unweighted.

        Slots are sorted by expert so each routed expert runs once on a contiguous block of rows;
        the per-slot neuron hooks see (and may replace) them back in [batch pos top_k ...] order.
        Under expert parallelism, slots routed to another rank's experts are zeros here.
        """
        batch, pos, d_model = x.shape
        flat_indices = expert_indices.reshape(-1)  # slot s holds token s // top_k
        if self.hook_expert_indices.listening and bool(((flat_indices < 0) | (flat_indices >= self.n_experts)).any()):
            raise ValueError(f"hook_expert_indices must hold expert ids in 0..{self.n_experts - 1}")
        # Slots grouped by expert. A GEMM's float32 result for a row depends on the row's place in its
        # block, so the rows of a group come in transformers' order: its (unstable) torch.sort.
        _, order = torch.sort(flat_indices)
        unsort = torch.argsort(order)
        counts = torch.bincount(flat_indices, minlength=self.n_experts).tolist()
        routed = [expert for expert, n in enumerate(counts) if n]  # experts with no token never run
        splits = [counts[expert] for expert in routed]
        x_sorted = x.reshape(-1, d_model).index_select(0, order // self.top_k)
        gate_up_proj, down_proj = self.experts.gate_up_proj, self.experts.down_proj
        local, first = self.local_experts, self.local_experts.start
        if not (self.hook_expert_pre.listening or self.hook_expert_post.listening):
            outs = []
            for expert, rows in zip(routed, x_sorted.split(splits), strict=True):
                if expert not in local:
                    outs.append(rows.new_zeros(rows.shape[0], d_model))
                    continue
                gate, up = F.linear(rows, gate_up_proj[expert - first]).chunk(2, dim=-1)
                outs.append(F.linear(F.silu(gate) * up, down_proj[expert - first]))
        else:  # the per-slot neurons, in [batch pos top_k d_expert_mlp] order for the hooks
            gate_up = torch.cat(
                [
                    F.linear(rows, gate_up_proj[e - first])
                    if e in local
                    else rows.new_zeros(rows.shape[0], gate_up_proj.shape[1])
                    for e, rows in zip(routed, x_sorted.split(splits), strict=True)
                ]
            )
            gate, up = gate_up.index_select(0, unsort).view(batch, pos, self.top_k, -1).chunk(2, dim=-1)
            self.hook_expert_pre.slot_experts = self.hook_expert_post.slot_experts = expert_indices
            try:
                pre = self.hook_expert_pre(gate)
                post = self.hook_expert_post(F.silu(pre) * up)
            finally:
                self.hook_expert_pre.slot_experts = self.hook_expert_post.slot_experts = None
            post_sorted = post.reshape(-1, post.shape[-1]).index_select(0, order)
            outs = [
                F.linear(rows, down_proj[e - first]) if e in local else rows.new_zeros(rows.shape[0], d_model)
                for e, rows in zip(routed, post_sorted.split(splits), strict=True)
            ]
        return torch.cat(outs).index_select(0, unsort).view(batch, pos, self.top_k, d_model)

    # What a cache needs to split this MLP's output into its experts (hooked.cache.get_expert_results).
    expert_result_hooks = ("hook_expert_post", "hook_expert_weights", "hook_expert_indices")

    def expert_results(
        self,
        expert_post: Float[Tensor, "... top_k d_expert_mlp"],
        expert_weights: Float[Tensor, "... top_k"],
        expert_indices: Int[Tensor, "... top_k"],
    ) -> Float[Tensor, "... n_experts d_model"]:
        """Each expert's write to the residual stream, from the per-slot hooks as cached: [..., n_experts, d_model].

        Expert e's write at a token is the sum, over the slots that hold e, of the slot's weight times
        `down_e(expert_post)`; an expert no slot holds writes zeros. Summed over experts this is the MLP's
        output (there is no shared expert and no bias), up to float rounding.
        """
        n_tokens = expert_indices[..., 0].numel()
        post = expert_post.reshape(n_tokens * self.top_k, -1)  # slot s holds token s // top_k
        weights, indices = expert_weights.reshape(-1, 1), expert_indices.reshape(-1)
        token_of_slot = torch.arange(indices.numel(), device=indices.device) // self.top_k
        down_proj = self.experts.down_proj.detach()
        results = post.new_zeros(n_tokens, self.n_experts, down_proj.shape[1])
        for expert in self.local_experts:
            slots = (indices == expert).nonzero()[:, 0]
            if len(slots):
                weight = down_proj[expert - self.local_experts.start].to(post.device, post.dtype)
                write = (F.linear(post[slots], weight) * weights[slots]).to(results.dtype)
                # accumulate: a hook that edited the indices may have put one expert in two slots of a token
                results.index_put_((token_of_slot[slots], slots.new_full(slots.shape, expert)), write, accumulate=True)
        if self.parallel is not None:  # each rank wrote its own experts' columns
            results = self.parallel.reduce(results)
        return results.view(*expert_indices.shape[:-1], self.n_experts, -1)

    # For weight processing (hooked.processing): the router and every expert read ln2's output.
    def residual_readers(self) -> tuple[Projection, ...]:
        return (Projection(self.gate.weight, 1), Projection(self.experts.gate_up_proj, 2))

    def residual_writers(self) -> tuple[Projection, ...]:
        return (Projection(self.experts.down_proj, 1),)

    @property
    def b_out(self) -> Float[Tensor, " d_model"]:
        """Zeros: the experts' down projections have no bias (what accumulated_bias adds for this MLP)."""
        return self.gate.weight.new_zeros(self.gate.weight.shape[1])

    @property
    def W_gate(self) -> Float[Tensor, "n_experts d_model d_expert_mlp"]:
        return self.experts.gate_up_proj.chunk(2, dim=1)[0].transpose(1, 2)

    @property
    def W_in(self) -> Float[Tensor, "n_experts d_model d_expert_mlp"]:
        return self.experts.gate_up_proj.chunk(2, dim=1)[1].transpose(1, 2)

    @property
    def W_out(self) -> Float[Tensor, "n_experts d_expert_mlp d_model"]:
        return self.experts.down_proj.transpose(1, 2)
