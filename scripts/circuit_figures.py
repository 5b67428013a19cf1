#!/usr/bin/env python
"""The figures of docs/circuits.md ("The bundled model's circuit"): attribution, discovery, faithfulness and
path patching on the bundled IOI models.

    .venv/bin/python scripts/circuit_figures.py gpt2        # hooked/ioi-gpt2, about a minute on 2 cores
    .venv/bin/python scripts/circuit_figures.py qwen3moe    # hooked/ioi-qwen3moe

Discovery on `tasks.ioi(32, seed=0)`; faithfulness also on `tasks.ioi_heldout(32)` (held-out names in
held-out templates, docs/ioi-models.md). EAP and EAP-IG keep the top 10% of the graph's edges; ACDC runs
with threshold 0.1.
"""

from __future__ import annotations

import argparse

import torch

import hooked
from hooked import circuits, metrics, tasks


def prompts(model, task):
    return (
        model.to_tokens(task.clean),
        model.to_tokens(task.corrupt),
        metrics.logit_diff(model, task.correct, task.incorrect),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model", nargs="?", default="gpt2", choices=["gpt2", "qwen3moe"])
    args = parser.parse_args()
    model = hooked.load(f"hooked/ioi-{args.model}")
    clean, corrupt, metric = prompts(model, tasks.ioi(n=32, seed=0))
    held = prompts(model, tasks.ioi_heldout(32))
    graph = circuits.graph(model)
    tenth = len(graph.edges) // 10
    with torch.no_grad():
        print(
            graph, f"clean {float(metric(model(clean)).mean()):.3f} corrupt {float(metric(model(corrupt)).mean()):.3f}"
        )
    for method in ("eap", "eap-ig"):
        scores = circuits.attribute(model, clean, corrupt, metric, method=method, steps=5)
        print(method, "top 8:", [(edge, round(value, 2)) for edge, value in scores.top(8)])
    for method in ("eap", "eap-ig"):
        c = circuits.discover(model, clean, corrupt, metric, method=method, n_edges=tenth)
        print(
            f"{method}, top {tenth}: {c}; faithfulness {c.faithfulness():.3f}, held-out {c.faithfulness(*held):.3f}; "
            f"{c.heads}"
        )
        print("  edges:", [(str(edge), round(c.scores[str(edge)], 2)) for edge in c.edges])
        curve = c.curve([5, 10, 20, tenth, 100, 200], *held)
        print(
            "  held-out curve (asked, kept, faithfulness):",
            [(r["size"], r["edges"], round(r["faithfulness"], 3)) for r in curve],
        )
    acdc = circuits.discover(model, clean, corrupt, metric, method="acdc", threshold=0.1)
    print(
        f"acdc, threshold 0.1: {acdc}; {acdc.provenance['circuits']}; faithfulness {acdc.faithfulness():.3f},"
        f" held-out {acdc.faithfulness(*held):.3f}; {acdc.heads}"
    )
    if args.model == "gpt2":
        for senders, receivers in [
            (["L2H2"], ["logits"]),
            (["L0H0"], ["L2H2"]),
            (["L1H3"], ["logits"]),
            (["L0.mlp"], ["L2H2.v"]),
        ]:
            direct = circuits.path_patch(model, clean, corrupt, senders=senders, receivers=receivers, metric=metric)
            wang = circuits.path_patch(
                model, clean, corrupt, senders=senders, receivers=receivers, metric=metric, method="wang"
            )
            print(
                f"path {senders} -> {receivers}: direct {list(direct.scores.values())[0]:.3f},"
                f" wang {list(wang.scores.values())[0]:.3f}, clean {direct.base_score:.3f}"
            )
        exact = circuits.patch_edges(model, clean, corrupt, ["input->L0.mlp"], metric)
        print("patching input->L0.mlp alone changes the metric by", round(exact.change["input->L0.mlp"], 2))


if __name__ == "__main__":
    main()
