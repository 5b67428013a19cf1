"""An attribution graph assembled: the rows computed (hooked/graphs/schedule.py), in circuit-tracer 0.5.0's node order
(hooked/graphs/graph.py), as a `Graph` with the model's description and the transcoders' names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from hooked.graphs.files import LogitTarget, default_scan
from hooked.graphs.graph import Graph
from hooked.graphs.nodes import Nodes
from hooked.graphs.schedule import Rows
from hooked.graphs.transcoders import Transcoders

if TYPE_CHECKING:
    from hooked.models.base import HookedTransformer


def assemble(model: HookedTransformer, tc: Transcoders, tokens: Tensor, nodes: Nodes, rows: Rows) -> Graph:
    """The rows, in circuit-tracer's node order, as a Graph: feature rows by feature, then logit rows; columns of
    the selected features only."""
    n_active = nodes.n_active
    selected = rows.selected
    # column of each node in the graph: selected features first, then errors, tokens, logits; -1 for features left out
    column_of = torch.full((rows.n_columns,), -1, dtype=torch.long)
    column_of[selected] = torch.arange(selected.shape[0])
    n_features = selected.shape[0]
    column_of[n_active:] = torch.arange(n_features, n_features + rows.n_columns - n_active)
    n_nodes = n_features + rows.n_columns - n_active
    # row of each computed row: a feature's own column; a logit's, its node
    row_nodes = rows.node_of_row[: rows.count]
    target = column_of[row_nodes]

    if rows.matrix is not None:  # circuit-tracer's steps: the selected features' columns, rows to their nodes
        columns = rows.matrix[: rows.count]
        if selected.shape[0] < n_active:
            columns = columns[:, torch.cat([selected, torch.arange(n_active, rows.n_columns)])]
        adjacency = torch.zeros(n_nodes, n_nodes)
        adjacency[target] = columns
    else:
        r, c, v = rows.coo()
        keep = column_of[c] >= 0
        r, c, v = target[r[keep]], column_of[c[keep]], v[keep]
        adjacency = torch.sparse_coo_tensor(
            torch.stack([r, c]), v, (n_nodes, n_nodes), check_invariants=True
        ).coalesce()

    tokenizer = getattr(model, "tokenizer", None)
    decode = (lambda ids: tokenizer.decode(ids)) if tokenizer is not None else (lambda ids: "")
    cfg = model.cfg
    info = {
        "n_layers": cfg.n_layers,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_head": getattr(cfg, "d_head", cfg.d_model // cfg.n_heads),
        "d_mlp": getattr(cfg, "d_mlp", None),
        "d_vocab": cfg.d_vocab,
        "n_ctx": cfg.n_ctx,
        "model_name": _safe(lambda: cfg.model_name),
        "tokenizer_name": _safe(lambda: cfg.tokenizer_name),
        "family": type(model).__name__,
    }
    return Graph(
        input_tokens=tokens.cpu(),
        input_string=decode(tokens.tolist()),
        active_features=nodes.active,
        activation_values=nodes.values.float().cpu(),
        selected_features=selected,
        adjacency=adjacency,
        logit_targets=[
            LogitTarget(decode([int(t)]) if nodes.logit_labels is None else nodes.logit_labels[i], int(t))
            for i, t in enumerate(nodes.logit_ids)
        ],
        logit_probabilities=nodes.logit_probabilities.float().cpu(),
        n_layers=tc.n_layers,
        vocab_size=cfg.d_vocab,
        feature_input_hook=tc.feature_input_hook,
        feature_output_hook=tc.feature_output_hook,
        model_info=info,
        scan=tc.scan or default_scan(info),  # circuit-tracer's create_graph_files refuses a graph without one
    )


def _safe(read):
    try:
        return read()
    except Exception:  # a model built in memory has no name
        return None
