"""Attribution graphs (circuit tracing through transcoders): which features, errors and tokens drive one
prompt's logits, as direct linear effects under the local replacement model. docs/graphs.md walks through it.

    from hooked import graphs
    g = graphs.attribute(model, prompt, transcoders)      # a per-layer transcoder set or a cross-layer transcoder
    p = g.prune(node_threshold=0.8, edge_threshold=0.98)
    g.show(tokenizer=model.tokenizer)                     # a page to explore (inline in a notebook)
"""

from hooked.graphs.attribute import CustomTarget, attribute, attribute_batch
from hooked.graphs.graph import Graph, GraphNode, LogitTarget
from hooked.graphs.intervene import InterventionResult, intervene
from hooked.graphs.page import GraphPage, QKPair
from hooked.graphs.prune import GraphScores, PrunedGraph

__all__ = [
    "CustomTarget",
    "Graph",
    "GraphNode",
    "GraphPage",
    "GraphScores",
    "InterventionResult",
    "LogitTarget",
    "PrunedGraph",
    "QKPair",
    "attribute",
    "attribute_batch",
    "intervene",
]
