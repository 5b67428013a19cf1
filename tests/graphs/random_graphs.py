"""Random attribution graphs with an attribution graph's zero structure, for the tests of pruning, scores, files
and pictures (no model needed).

A feature at layer l and position p is driven by features and errors of earlier layers and by tokens, at
positions up to p; logits by every feature, error and token; error and token rows and logit columns are zero. So
the graph has no cycle, as every real one, and influence sums to a finite series.
"""

from __future__ import annotations

import torch

from hooked.graphs import Graph, LogitTarget


def random_graph(
    seed: int = 0,
    n_layers: int = 3,
    n_pos: int = 5,
    n_active: int = 40,
    n_features: int = 30,
    n_logits: int = 3,
    d_sae: int = 50,
    density: float = 0.5,
    edges_per_row: int | None = None,
) -> Graph:
    """A random graph; `edges_per_row`: a sparse COO adjacency keeping each row's largest |edges| (as `attribute`
    does with its own `edges_per_row`)."""
    generator = torch.Generator().manual_seed(seed)
    triples = {
        (
            int(torch.randint(n_layers, (), generator=generator)),
            int(torch.randint(n_pos, (), generator=generator)),
            int(torch.randint(d_sae, (), generator=generator)),
        )
        for _ in range(3 * n_active)
    }
    triples = torch.tensor(sorted(triples))
    active = triples[torch.randperm(len(triples), generator=generator)[:n_active].sort().values]  # still sorted
    selected = torch.randperm(len(active), generator=generator)[:n_features].sort().values
    features = active[selected]
    n_errors = n_layers * n_pos
    n = n_features + n_errors + n_pos + n_logits
    layer = torch.cat([features[:, 0], torch.arange(n_layers).repeat_interleave(n_pos), torch.full((n_pos,), -1)])
    position = torch.cat([features[:, 1], torch.arange(n_pos).repeat(n_layers), torch.arange(n_pos)])
    sources = n - n_logits
    allowed = torch.zeros(n, n, dtype=torch.bool)
    allowed[:n_features, :sources] = (layer[None, :] < features[:, :1]) & (position[None, :] <= features[:, 1:2])
    allowed[n - n_logits :, :sources] = True
    weights = torch.randn(n, n, generator=generator) * torch.rand(n, n, generator=generator).exp()
    keep = torch.rand(n, n, generator=generator) < density
    adjacency = torch.where(allowed & keep, weights, torch.zeros(()))
    if edges_per_row is not None:
        top = adjacency.abs().topk(edges_per_row, dim=1).indices
        rows = torch.arange(n)[:, None].expand_as(top)
        chosen = adjacency[rows, top] != 0
        indices = torch.stack([rows[chosen], top[chosen]])
        values = adjacency[indices[0], indices[1]]
        adjacency = torch.sparse_coo_tensor(indices, values, (n, n), check_invariants=True).coalesce()
    probabilities = torch.rand(n_logits, generator=generator).sort(descending=True).values * 0.9 / n_logits * 2
    return Graph(
        input_tokens=torch.randint(1, 200, (n_pos,), generator=generator),
        input_string="a random prompt",
        active_features=active,
        activation_values=torch.rand(len(active), generator=generator) * 5,
        selected_features=selected,
        adjacency=adjacency,
        logit_targets=[LogitTarget(f"tok{i}", 200 + i) for i in range(n_logits)],
        logit_probabilities=probabilities,
        n_layers=n_layers,
        vocab_size=256,
        feature_input_hook="blocks.{layer}.mlp.hook_in",
        feature_output_hook="blocks.{layer}.hook_mlp_out",
        model_info={
            "n_layers": n_layers,
            "d_model": 16,
            "n_heads": 2,
            "d_head": 8,
            "d_mlp": 64,
            "d_vocab": 256,
            "n_ctx": 32,
            "model_name": "random",
            "tokenizer_name": "random",
        },
        scan="random-transcoders",
    )


def with_adjacency(graph: Graph, adjacency: torch.Tensor) -> Graph:
    """`graph` with another adjacency (the same graph stored dense or sparse)."""
    return Graph(**{**vars(graph), "adjacency": adjacency})
