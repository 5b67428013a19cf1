"""Circuits: the residual graph, edge and path patching, edge attribution, and circuit discovery.

    from hooked import circuits
    g = circuits.graph(model)                                   # sources, receivers, edges
    circuits.patch_edges(model, clean, corrupt, {"one": ["L1H0->L2H2.v"]}, metric)
    circuits.path_patch(model, clean, corrupt, senders=["L2H2"], receivers=["logits"], metric=metric)
    scores = circuits.attribute(model, clean, corrupt, metric, method="eap-ig", steps=5)
    c = circuits.discover(model, clean, corrupt, metric, method="eap-ig", n_edges=100)

What an edge is: `hooked.circuits.graph`. How a set of patched edges runs as one batched forward:
`hooked.circuits.engine`. EAP and EAP-IG: `hooked.circuits.attribution`. ACDC, pruning and
faithfulness: `hooked.circuits.discovery`. The guide, with the bundled model's circuit: docs/circuits.md.
"""

from hooked.circuits.attribution import EdgeScores, attribute
from hooked.circuits.discovery import Circuit, discover, prune
from hooked.circuits.graph import Edge, Graph, graph, graph_of_shape
from hooked.circuits.patching import patch_edges, path_patch, path_patch_sweep

__all__ = [
    "Circuit",
    "Edge",
    "EdgeScores",
    "Graph",
    "attribute",
    "discover",
    "graph",
    "graph_of_shape",
    "patch_edges",
    "path_patch",
    "path_patch_sweep",
    "prune",
]
