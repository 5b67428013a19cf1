"""The nodes of an attribution graph, from one clean forward of the prompt: the active transcoder features (position
0's zeroed, circuit-tracer 0.5.0's `zero_positions`), what the features active at each layer write there (for a
cross-layer transcoder, every earlier layer's too), the error nodes (each MLP's output minus the transcoders'
reconstruction), the token embeddings and the logit nodes (hooked/graphs/targets.py). The transcoders are asked
through the per-layer interface of hooked/sae/transcoders.py, the same for a transcoder set and a CLT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.graphs.targets import logit_nodes
from hooked.graphs.transcoders import Transcoders

if TYPE_CHECKING:
    from hooked.graphs.settings import AttributionSettings
    from hooked.models.base import HookedTransformer

ZERO_POSITIONS = slice(0, 1)  # features and errors zeroed: the first position (circuit-tracer's `zero_positions`)
BLOCK_ELEMENTS = 2**24  # the most floats a contraction's [positions, slots, d] block holds at once (64 MiB)


@dataclass
class Writes:
    """The active features that write to output layer `layer` (its own features; for a CLT, also every earlier
    layer's), sorted by position: entry j is feature `features[j]` of layer `sources[j]` with activation
    `activations[j]`, column `index[j]` among the active features, at `positions[j]`, slot `slot[j]` of its
    position. Entries of position p are `starts[p]:starts[p + 1]`; a position holds at most `width`.

    Their vectors (activation times decoder row) are gathered a block of positions at a time, never all at once: at
    a CLT's width and a long prompt, every active feature's decoder rows would be most of the memory. A block
    [positions, slots, d] of them meets the gradient [batch, positions, d] in one batched product, reading the
    gradient once instead of copying a row of it for each feature (most positions hold dozens)."""

    layer: int
    positions: Tensor
    slot: Tensor
    index: Tensor
    sources: Tensor
    features: Tensor
    activations: Tensor
    starts: Tensor  # [n_pos + 1]
    width: int

    @classmethod
    def of(cls, layer: int, parts: list[tuple[int, Tensor, Tensor, Tensor, Tensor]], n_pos: int) -> Writes:
        """From (source layer, index, positions, features, activations) per source layer."""
        sources = torch.cat([torch.full_like(index, source) for source, index, *_ in parts])
        index, positions, features, activations = (torch.cat([part[i] for part in parts]) for i in range(1, 5))
        order = torch.argsort(positions, stable=True)
        index, positions, features, activations, sources = (
            t[order] for t in (index, positions, features, activations, sources)
        )
        counts = torch.bincount(positions, minlength=n_pos)
        starts = torch.cat([counts.new_zeros(1), counts.cumsum(0)])
        slot = torch.arange(positions.shape[0], device=positions.device) - starts[positions]
        width = int(counts.max()) if positions.numel() else 0
        return cls(layer, positions, slot, index, sources, features, activations, starts, width)

    def vectors(self, tc: Transcoders, a: int, b: int) -> Tensor:
        """[b - a, d_out]: entries a..b-1's activation times decoder row (to this layer)."""
        sources, features = self.sources[a:b], self.features[a:b]
        out = torch.empty(b - a, tc.d_out, dtype=tc.dtype, device=tc.device)
        for source in sources.unique().tolist():
            mask = sources == source
            out[mask] = tc.decoder_rows(source, features[mask], self.layer)
        return out * self.activations[a:b, None]

    def blocks(self, n_pos: int, d: int):
        """(first position, end position, first entry, end entry) of blocks of positions within BLOCK_ELEMENTS."""
        step = max(1, BLOCK_ELEMENTS // max(self.width * d, 1))
        for p0 in range(0, n_pos, step):
            p1 = min(p0 + step, n_pos)
            a, b = int(self.starts[p0]), int(self.starts[p1])
            if a < b:
                yield p0, p1, a, b


@dataclass
class Nodes:
    """Everything the clean forward fixes: the active features, the error vectors, the token embeddings and the
    logit targets."""

    tc: Transcoders
    active: Tensor  # [n_active, 3] (layer, pos, feature), on the CPU
    values: Tensor  # [n_active]
    writes: list[Writes]  # per output layer
    errors: Tensor  # [n_layers, pos, d_out]
    embeddings: Tensor  # [pos, d_model]
    logit_ids: Tensor  # [n_logits]; a custom target's is d_vocab + its index, as circuit-tracer's
    logit_probabilities: Tensor
    logit_vectors: Tensor  # [n_logits, d_model]
    logit_labels: list[str] | None  # custom targets' labels (None: the tokens' text)

    @property
    def n_active(self) -> int:
        return int(self.active.shape[0])

    def encoder_vectors(self, chunk: Tensor) -> Tensor:
        """[k, d_in]: the input direction each of the active features `chunk` reads (its row of W_enc)."""
        layers, features = self.active[chunk, 0], self.active[chunk, 2]
        out = torch.empty(chunk.shape[0], self.tc.d_in, dtype=self.tc.dtype, device=self.tc.device)
        for layer in layers.unique().tolist():
            mask = layers == layer
            out[mask.to(out.device)] = self.tc.encoder_vectors(layer, features[mask].to(out.device))
        return out


@torch.no_grad()
def clean_nodes(
    model: HookedTransformer,
    tc: Transcoders,
    tokens: Tensor,
    settings: AttributionSettings,
) -> Nodes:
    """What one clean forward of `tokens` [pos] fixes: the active features (position 0's zeroed), what each
    output layer's features write, the error nodes, the token embeddings and the logit nodes."""
    reads, writes_at = tc.hook_names(), tc.hook_names_out()
    logits, cache = model.run_with_cache(tokens[None], names_filter=[*reads, *writes_at, "hook_embed"])
    x = [cache[name][0] for name in reads]
    n_layers, n_pos = tc.n_layers, tokens.shape[0]

    active, values = [], []
    for layer in range(n_layers):
        acts = tc.activate(layer, tc.pre_activations(layer, x[layer]))
        acts[ZERO_POSITIONS] = 0
        pos, feat = acts.nonzero(as_tuple=True)  # row-major: sorted by position, then feature
        active.append(torch.stack([torch.full_like(pos, layer), pos, feat], dim=1))
        values.append(acts[pos, feat])
    offsets = [0, *torch.tensor([a.shape[0] for a in active]).cumsum(0).tolist()]

    writes, errors = [], []
    for m in range(n_layers):
        parts = []
        for source in tc.source_layers(m):
            index = torch.arange(offsets[source], offsets[source + 1], device=active[source].device)
            parts.append((source, index, active[source][:, 1], active[source][:, 2], values[source]))
        into_m = Writes.of(m, parts, n_pos)
        recon = torch.zeros(n_pos, tc.d_out, dtype=x[m].dtype, device=x[m].device)
        for _, _, a, b in into_m.blocks(n_pos, tc.d_out):
            recon.index_add_(0, into_m.positions[a:b], into_m.vectors(tc, a, b))
        recon = recon + tc.decoder_bias(m)
        if tc.has_skip:
            recon = recon + tc.skip(m, x[m])
        error = cache[writes_at[m]][0] - recon
        error[ZERO_POSITIONS] = 0
        errors.append(error)
        writes.append(into_m)

    logit = logit_nodes(model, logits[0, -1], settings.targets, settings.max_n_logits, settings.desired_logit_prob)
    return Nodes(
        tc=tc,
        active=torch.cat(active).cpu(),
        values=torch.cat(values),
        writes=writes,
        errors=torch.stack(errors),
        embeddings=cache["hook_embed"][0],
        logit_ids=logit.ids,
        logit_probabilities=logit.weights,
        logit_vectors=logit.vectors,
        logit_labels=logit.labels,
    )
