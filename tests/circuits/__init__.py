"""Circuits (the graph, edge patching, discovery, their pictures) and the readings a circuit study takes
from every run (attention to named positions, the logit lens, plots)."""
