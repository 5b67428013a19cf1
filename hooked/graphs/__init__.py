"""Attribution graphs (circuit tracing through transcoders): which features, errors and tokens drive one
prompt's logits, as direct linear effects under the local replacement model. docs/graphs.md walks through it.

    from hooked import graphs
    g = graphs.attribute(model, prompt, transcoders)      # a per-layer transcoder set or a cross-layer transcoder
    p = g.prune(node_threshold=0.8, edge_threshold=0.98)
"""

from hooked.graphs import _pending  # noqa: F401  TEMPORARY: Graph methods until their branch is merged
from hooked.graphs.attribute import attribute
from hooked.graphs.graph import Graph, LogitTarget
from hooked.graphs.intervene import InterventionResult, intervene

__all__ = ["Graph", "InterventionResult", "LogitTarget", "attribute", "intervene"]
