"""Attribution graphs (circuit tracing through transcoders): which features, errors and tokens drive one
prompt's logits, as direct linear effects under the local replacement model. docs/graphs.md walks through it.

    from hooked import graphs
    g = graphs.attribute(model, prompt, transcoders)      # a per-layer transcoder set or a cross-layer transcoder
    p = g.prune(node_threshold=0.8, edge_threshold=0.98)
    a = graphs.qk_attribution(model, prompt, transcoders, layer=1, head=0, query=-1)   # why a head attends there
    g.show(tokenizer=model.tokenizer)                     # a page to explore (inline in a notebook)
"""

from hooked.graphs.attribute import CustomTarget, attribute, attribute_batch
from hooked.graphs.graph import Graph, GraphNode, LogitTarget
from hooked.graphs.heads import HeadExplanation, HeadExplanations, explain_heads
from hooked.graphs.intervene import InterventionResult, intervene
from hooked.graphs.page import GraphPage, QKPair
from hooked.graphs.prune import GraphScores, PrunedGraph
from hooked.graphs.qk import QKAttribution, QKTerm, qk_attribution

__all__ = [
    "CustomTarget",
    "Graph",
    "GraphNode",
    "GraphPage",
    "GraphScores",
    "HeadExplanation",
    "HeadExplanations",
    "InterventionResult",
    "LogitTarget",
    "PrunedGraph",
    "QKAttribution",
    "QKTerm",
    "QKPair",
    "attribute",
    "attribute_batch",
    "explain_heads",
    "intervene",
    "qk_attribution",
]
