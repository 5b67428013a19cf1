"""The JSON files of circuit-tracer's graph viewer (its local server and Neuronpedia's), as circuit-tracer 0.5.0
`utils/create_graph_files.py` and `frontend/graph_models.py` write them: `<slug>.json` holds metadata, qParams,
nodes and links of the pruned graph, and `graph-metadata.json` in the same folder lists every graph's metadata.

Each kept node becomes one entry (ids as the viewer reads them):

| node | node_id | layer | feature | feature_type | jsNodeId |
|---|---|---|---|---|---|
| feature f at layer l, position p | `l_f_p` | "l" | Cantor pairing of (l, f) | "cross layer transcoder" | `l_f-0` |
| error at layer l, position p | `0_l_p` | "l" | -1 | "mlp reconstruction error" | `l_p-0` |
| token t at position p | `E_t_p` | "E" | p | "embedding" | `E_t-p` |
| logit for vocabulary id v | `{n_layers + 1}_v_{n_pos - 1}` | "n_layers + 1" | v | "logit" | `L_v-{n_pos - 1}` |

with `ctx_idx` the position, `influence` the node's cumulative score, features' `activation`, and the logits'
`token_prob`, `is_target_logit` (the most probable) and clerp `Output "tok" (p=0.420)`. Links are the kept
edges between kept nodes, {source, target, weight}, row by row. Nodes that no link touches are left out, except
tokens and logits.

Where hooked differs: the prompt's token strings come from `tokenizer` (anything with `decode(ids)`:
`model.tokenizer`, a transformers tokenizer; circuit-tracer loads the config's `tokenizer_name`), and without one
are the token ids; a graph without `scan` gets the model's name (circuit-tracer refuses); a list of transcoder
names becomes "custom-" and the first 16 hex digits of its SHA-256 (circuit-tracer uses Python's `hash`, which
changes from run to run).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hooked.graphs.files import default_scan

if TYPE_CHECKING:
    from hooked.graphs.graph import Graph
    from hooked.graphs.prune import PrunedGraph


def cantor_pairing(x: int, y: int) -> int:
    """One integer for a pair of non-negative integers (the viewer's feature id of layer x, feature y)."""
    return (x + y) * (x + y + 1) // 2 + y


def node_record(graph: Graph, i: int, influence: float) -> dict[str, Any]:
    """The viewer's entry for node i (the module docstring's table), fields in circuit-tracer's order."""
    node = graph.node(i)
    record = {
        "node_id": "",
        "feature": -1,
        "layer": "",
        "ctx_idx": node.position,
        "feature_type": "",
        "token_prob": 0.0,
        "is_target_logit": False,
        "run_idx": 0,
        "reverse_ctx_idx": 0,
        "jsNodeId": "",
        "clerp": "",
        "influence": influence,
        "activation": None,
    }
    if node.kind == "feature":
        record.update(
            node_id=f"{node.layer}_{node.index}_{node.position}",
            feature=cantor_pairing(node.layer, node.index),
            layer=str(node.layer),
            feature_type="cross layer transcoder",
            jsNodeId=f"{node.layer}_{node.index}-0",
            activation=float(graph.activation_values[graph.selected_features[i]]),
        )
    elif node.kind == "error":
        record.update(
            node_id=f"0_{node.layer}_{node.position}",
            layer=str(node.layer),
            feature_type="mlp reconstruction error",
            jsNodeId=f"{node.layer}_{node.position}-0",
        )
    elif node.kind == "token":
        record.update(
            node_id=f"E_{node.index}_{node.position}",
            feature=node.position,
            layer="E",
            feature_type="embedding",
            jsNodeId=f"E_{node.index}-{node.position}",
        )
    else:
        rank = i - graph.logit_offset
        layer = str(graph.n_layers + 1)
        probability = float(graph.logit_probabilities[rank])
        record.update(
            node_id=f"{layer}_{node.index}_{node.position}",
            feature=node.index,
            layer=layer,
            feature_type="logit",
            token_prob=probability,
            is_target_logit=rank == 0,
            jsNodeId=f"L_{node.index}-{node.position}",
            clerp=f'Output "{graph.logit_targets[rank].token_str}" (p={probability:.3f})',
            influence=None,  # circuit-tracer gives logits no influence
        )
    return record


def graph_json(
    pruned: PrunedGraph, slug: str, tokenizer: Any = None, scan: str | list[str] | None = None
) -> dict[str, Any]:
    """The viewer's graph record (`<slug>.json`) of a pruned graph."""
    graph = pruned.graph
    scan = graph.scan if scan is None else scan
    transcoder_list: list[str] = []
    if scan is None:
        scan = default_scan(graph.model_info)
    elif isinstance(scan, list):
        transcoder_list = list(scan)
        scan = "custom-" + hashlib.sha256("-".join(transcoder_list).encode()).hexdigest()[:16]
    tokens = graph.input_tokens.tolist()
    metadata = {
        "slug": slug,
        "scan": scan,
        "transcoder_list": transcoder_list,
        "prompt_tokens": [str(t) if tokenizer is None else tokenizer.decode([t]) for t in tokens],
        "prompt": graph.input_string,
        "node_threshold": float(pruned.node_threshold),
        "schema_version": 1,
    }
    nodes = {i: node_record(graph, i, float(pruned.cumulative_scores[i])) for i in pruned.nodes}
    links = [
        {"source": nodes[source]["node_id"], "target": nodes[target]["node_id"], "weight": weight}
        for target, source, weight in pruned.edges()
    ]
    linked = {link["source"] for link in links} | {link["target"] for link in links}
    used = [n for n in nodes.values() if n["node_id"] in linked or n["feature_type"] in ("embedding", "logit")]
    qparams = {"pinnedIds": [], "supernodes": [], "linkType": "both", "clickedId": "", "sg_pos": ""}
    return {"metadata": metadata, "qParams": qparams, "nodes": used, "links": links}


def write_graph_files(
    graph: Graph,
    out_dir: str | Path,
    slug: str,
    node_threshold: float,
    edge_threshold: float,
    tokenizer: Any,
    scan: str | list[str] | None,
) -> Path:
    """Prune `graph`, write `<out_dir>/<slug>.json` and add its metadata to `<out_dir>/graph-metadata.json`
    (replacing a graph of the same slug); returns the graph file's path."""
    if not slug or "/" in slug or slug in (".", ".."):
        raise ValueError(f"slug {slug!r} must be a plain file name (the viewer's graph id), such as 'ioi'")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise ValueError(f"{out_dir} is a file; to_frontend writes into a folder")
    record = graph_json(graph.prune(node_threshold, edge_threshold), slug, tokenizer, scan)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{slug}.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False), encoding="utf-8")
    index_path = out_dir / "graph-metadata.json"
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.exists() else {"graphs": []}
    index["graphs"] = [g for g in index["graphs"] if g["slug"] != slug] + [record["metadata"]]
    index_path.write_text(json.dumps(index, indent=2), encoding="utf-8")
    return path
