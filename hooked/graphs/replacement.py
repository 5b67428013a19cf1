"""The local replacement model, run backward: one forward of the model with attention patterns and norm scales frozen
and each MLP's output frozen but for its transcoder's skip path (circuit-tracer 0.5.0
`attribution/context_transformerlens.py`), kept with its autograd graph; each backward pass injects target rows and
contracts the gradient at every MLP output with the feature and error vectors written there, and at hook_embed with
the token embeddings (hooked/graphs/attribute.py's docstring: what a row is).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.graphs.nodes import Nodes
from hooked.graphs.transcoders import Transcoders

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


def frozen_points(model: HookedTransformer) -> list[str]:
    """The points whose activations the replacement model detaches: every norm's scale, and each attention's
    queries and keys. A pattern is softmax(q k^T / sqrt(d) + mask) (capped, for Gemma 2), a function of q and k
    alone, so detaching q and k freezes it as detaching the pattern would; but no hook on the pattern means the
    attention runs on its fused kernel (SDPA, or hooked's Triton kernel on a GPU), whose backward recomputes the
    pattern blockwise: the memory of the backward passes grows linearly with the prompt, not with its square."""
    names = [n for n in model.hook_dict if n.endswith(("attn.hook_q", "attn.hook_k", "hook_scale"))]
    for point in ("attn.hook_q", "attn.hook_k"):
        if sum(n.endswith(point) for n in model.hook_dict) != model.cfg.n_layers:
            raise ValueError(
                f"{type(model).__name__} does not have one {point} per layer, where the replacement model freezes the"
                " attention pattern (by detaching queries and keys), so its graph cannot be built"
            )
    return names


class ReplacementRun:
    """One forward of the frozen replacement model on `copies` copies of each prompt (prompts of one length, their
    copies side by side in the batch), kept with its autograd graph; `rows(...)` injects up to `copies` targets per
    prompt and returns each prompt's rows over its [active features, errors, tokens]."""

    def __init__(self, model: HookedTransformer, tc: Transcoders, tokens: Tensor, nodes: list[Nodes], copies: int):
        self.nodes, self.n_layers, self.n_pos, self.copies = nodes, tc.n_layers, tokens.shape[1], copies
        self.row_sizes = [n.n_active + (tc.n_layers + 1) * self.n_pos for n in nodes]
        self.inputs: list[Tensor | None] = [None] * (tc.n_layers + 1)  # x_l per layer, then the final norm's output
        self.buffers: list[Tensor] = []
        self.embed: Tensor | None = None
        layer_of = {name: layer for layer, name in enumerate(tc.hook_names())}
        out_layer = {name: layer for layer, name in enumerate(tc.hook_names_out())}

        def freeze(activation: Tensor, hook) -> Tensor:
            return activation.detach()

        def embed(activation: Tensor, hook) -> Tensor:
            leaf = activation.detach().requires_grad_(True)
            leaf.register_hook(self._contract_tokens)
            self.embed = leaf
            return leaf

        def read(activation: Tensor, hook) -> None:
            self.inputs[layer_of[hook.name]] = activation

        def write(activation: Tensor, hook) -> Tensor:
            layer = out_layer[hook.name]
            x = self.inputs[layer]
            # without a skip path, 0 * x keeps the output in the autograd graph, so its gradient is seen (and is all)
            skip = tc.skip(layer, x) if tc.has_skip else x[..., :1] * 0
            out = skip + (activation - skip).detach()
            out.register_hook(lambda grad, layer=layer: self._contract_layer(layer, grad))
            return out

        frozen = frozen_points(model)
        hooks = [("hook_embed", embed), *((n, freeze) for n in frozen)]
        hooks += [(n, read) for n in tc.hook_names()] + [(n, write) for n in tc.hook_names_out()]
        with torch.enable_grad(), model.hooks(fwd_hooks=hooks):
            resid = model(tokens.repeat_interleave(copies, dim=0), stop_at_layer=model.cfg.n_layers)
            self.inputs[-1] = model.ln_final(resid)

    def _prompt_grads(self, grad: Tensor):
        """(prompt's nodes, its rows' buffer, its copies' gradient [copies, pos, d]) for each prompt."""
        for i, (nodes, buffer) in enumerate(zip(self.nodes, self.buffers, strict=True)):
            yield nodes, buffer, grad[i * self.copies : (i + 1) * self.copies].float()

    def _contract_layer(self, layer: int, grad: Tensor) -> None:
        for nodes, buffer, g in self._prompt_grads(grad):
            writes = nodes.writes[layer]
            for p0, p1, a, b in writes.blocks(self.n_pos, g.shape[-1]):
                positions, slot = writes.positions[a:b] - p0, writes.slot[a:b]
                block = g.new_zeros(p1 - p0, writes.width, g.shape[-1])
                block[positions, slot] = writes.vectors(nodes.tc, a, b).float()
                products = torch.bmm(block, g[:, p0:p1].permute(1, 2, 0))  # [positions, slots, copies]
                buffer.index_add_(1, writes.index[a:b], products[positions, slot].T)
            start = nodes.n_active + layer * self.n_pos
            buffer[:, start : start + self.n_pos] += torch.einsum("bpd,pd->bp", g, nodes.errors[layer].float())

    def _contract_tokens(self, grad: Tensor) -> None:
        for nodes, buffer, g in self._prompt_grads(grad):
            start = nodes.n_active + self.n_layers * self.n_pos
            buffer[:, start : start + self.n_pos] += torch.einsum("bpd,pd->bp", g, nodes.embeddings.float())

    def rows(self, requests: list[tuple[Tensor, Tensor, Tensor] | None]) -> list[Tensor | None]:
        """Per prompt, the rows [k, row_size] of its k <= copies targets `(layers, positions, vectors)`: target j
        injected at layer `layers[j]` (n_layers: the final norm's output), position `positions[j]`, along
        `vectors[j]`; None where a prompt asks for nothing."""
        device = self.inputs[-1].device
        self.buffers = [torch.zeros(self.copies, size, device=device) for size in self.row_sizes]
        by_layer: dict[int, list[tuple[Tensor, Tensor, Tensor]]] = {}
        for i, request in enumerate(requests):
            if request is None:
                continue
            layers, positions, vectors = request
            rows_of = torch.arange(layers.shape[0], device=device) + i * self.copies
            for layer in layers.unique().tolist():
                mask = layers == layer
                by_layer.setdefault(layer, []).append((rows_of[mask], positions[mask], vectors[mask]))
        roots, grads = [], []
        for layer, parts in by_layer.items():
            root = self.inputs[layer]
            grad = torch.zeros_like(root)
            for batch_rows, positions, vectors in parts:
                grad[batch_rows, positions] = vectors.to(root.dtype)
            roots.append(root)
            grads.append(grad)
        torch.autograd.backward(roots, grads, retain_graph=True, inputs=[self.embed])
        self.embed.grad = None
        out = [None if r is None else b[: r[0].shape[0]] for r, b in zip(requests, self.buffers, strict=True)]
        self.buffers = []
        return out
