"""The main job of `make demo` (and `hooked demo`): find the heads an indirect-object circuit uses, and
show why *how* a head is deleted decides whether it looks important.

    python -m hooked.demo                        # the IOI model shipped in the package (offline)
    python -m hooked.demo --model gpt2           # GPT-2 small, from the Hugging Face cache
    python -m hooked.demo --out runs/my-demo     # where the tables, the heatmap and the circuit go

The story, on 16 indirect-object prompts ("When Mary and John went to the store, John gave a drink
to" -> " Mary"; the corrupt twin has the other name give, so its answer flips):

1. the clean logit difference (right name minus the other) and how many prompts the model gets right;
2. a head sweep (every head resampled from the corrupt prompts, one batched pass) that finds the
   heads that matter, saved as a layer x head heatmap;
3. the top head ablated four ways (zero, mean, resample from corrupt, resample within the batch),
   with the KL divergence from the clean output next to the logit difference: they disagree;
4. whole components: two heads, a whole attention layer, an MLP;
5. activation patching of the same head into the corrupt run: necessity versus sufficiency;
6. circuit discovery (`hooked.circuits`): EAP-IG scores every edge of the residual graph, the top 10%
   (pruned) is the circuit; its heads and which of their query/key/value inputs it uses, and its
   faithfulness on the prompts it was found on and on held-out prompts (held-out names in held-out
   templates, `tasks.ioi_heldout`), saved as
   circuit.png, circuit.json, circuit-edges.csv and the faithfulness curve (circuit-faithfulness.*);
7. the features that carry the answer: the SAE bundled on the residual stream after layer 2 (docs/saes.md,
   "Bundled dictionaries"), spliced with its error term, every feature scored at once by `hooked.sae.attribute`,
   then confirmed in one sweep: the top features resampled from the corrupt prompts together, zeroed together,
   random active features instead, each top feature alone; the same for the bundled transcoders in brief
   (feature-scores.csv, feature-ablations.*; skipped for a model without bundled dictionaries);
8. the attribution graph of one prompt (`hooked.graphs`, docs/graphs.md) through the bundled transcoders: drawn
   pruned (graph.png), the features on the strongest paths from the indirect object's token to the answer's logit
   named, then ablated together on the real model, against as many random active features (graph-ablations.*);
   and why chapter 2's top heads attend where they do (`graphs.qk_attribution`): in the shipped model they attend
   to the repeated subject, not the indirect object, picked out by earlier heads' outputs and layer-0 features;
9. everything saved, with what produced it, in a run directory.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import torch

import hooked
from hooked import ablate, metrics, patch, tasks

DEFAULT_MODEL = "hooked/ioi-gpt2"
QK_HEADS = 3  # chapter 2's top heads whose attention chapter 8 explains
FEATURES_SAE = "saes/blocks.2.hook_resid_post"  # chapter 7's dictionary, under the bundled model's name
FEATURES_SETS = "saes/transcoders"
TOP_FEATURES = 10
RANDOM_DRAWS = 5
PATH_FEATURES = 5  # chapter 8: the features named on the paths from the indirect object to the answer


def _scores(model, tokens, hooks, metric, kl, clean_logits) -> tuple[float, float]:
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    return metric(logits).mean().item(), kl(logits, base_logits=clean_logits).mean().item()


@torch.no_grad()  # not torch.set_grad_enabled(False): the caller's grad mode is left as it was
def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--model", default=DEFAULT_MODEL, help=f"hub id, checkpoint directory or bundled name (default {DEFAULT_MODEL})"
    )
    parser.add_argument(
        "--out", default="runs/demo", help="run directory for the tables and the heatmap (default runs/demo)"
    )
    parser.add_argument("--n", type=int, default=16, help="prompt pairs (default 16)")
    parser.add_argument("--seed", type=int, default=1, help="seed of the prompts (default 1)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    model = hooked.load(args.model)
    cfg = model.cfg
    print(
        f"1. {args.model}: {cfg.n_layers} layers x {cfg.n_heads} heads, d_model {cfg.d_model},"
        f" {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, {len(model.hook_names)} hook points"
    )
    # One template, both name orders: every prompt has the same length, so a batch needs no padding and
    # "resample within the batch" is defined.
    task = tasks.ioi(n=args.n, seed=args.seed, template="store")
    print(f"   clean  : {task.clean[0]!r} -> {task.correct[0]!r}")
    print(f"   corrupt: {task.corrupt[0]!r} -> {task.incorrect[0]!r}")
    clean = model.to_tokens(task.clean)
    corrupt_tokens = model.to_tokens(task.corrupt)
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    kl = metrics.kl_div()
    clean_logits, clean_cache = model.run_with_cache(clean)
    _, corrupt = model.run_with_cache(corrupt_tokens)
    per_prompt = metric(clean_logits)
    clean_score = per_prompt.mean().item()
    print(
        f"   clean logit difference {clean_score:+.3f}; right name on top in "
        f"{int((per_prompt > 0).sum())}/{len(per_prompt)} prompts"
    )

    # 2. Every head resampled from the corrupt prompts, as one sweep.
    heads = ablate.components(model, "heads")
    sweep = hooked.sweep(
        model, clean, {a: ablate.hooks(model, a, "resample", source=corrupt) for a in heads}, metric, task=task
    )
    sweep.save(out, name="head-sweep-resample")
    ranked = sorted(sweep.change.items(), key=lambda item: item[1])
    top = ranked[0][0]
    print(
        f"\n2. every head resampled from the corrupt prompts ({len(heads)} variants, one batched sweep):"
        " the largest drops"
    )
    for name, change in ranked[:5]:
        print(f"   {name:<7} {sweep.scores[name]:+.3f}  ({change:+.3f})")
    print(f"   heatmap and table: {out}/head-sweep-resample.*")

    # 3. The top head, deleted four ways.
    ways = {
        "zero": ablate.hooks(model, top, "zero"),
        "mean (over the clean prompts)": ablate.hooks(model, top, "mean", reference=clean_cache),
        "resample (from corrupt)": ablate.hooks(model, top, "resample", source=corrupt),
        "resample (shuffle the batch)": ablate.hooks(model, top, "resample", seed=0),
    }
    rows = []
    print(f"\n3. {top} deleted four ways (logit difference, change, KL from the clean output):")
    for name, hooks in ways.items():
        score, divergence = _scores(model, clean, hooks, metric, kl, clean_logits)
        rows.append({"method": name, "logit_diff": score, "change": score - clean_score, "kl": divergence})
        print(f"   {name:<30} {score:+.3f}  ({score - clean_score:+.3f})  KL {divergence:.4f}")
    print(
        "   Zero asks 'what if the head were absent?'; resampling from corrupt asks 'what if it believed the"
        " other prompt?'. Only the second is a question about the circuit."
    )

    # 4. Whole components.
    second = ranked[1][0]
    layer = int(top[1 : top.index("H")])
    components = {
        f"{top}": [top],
        f"{top} + {second}": [top, second],
        f"all of L{layer}.attn": [f"L{layer}.attn"],
        f"L{layer}.mlp": [f"L{layer}.mlp"],
    }
    print("\n4. whole components, resampled from corrupt:")
    for name, addresses in components.items():
        score, _ = _scores(
            model, clean, ablate.hooks(model, addresses, "resample", source=corrupt), metric, kl, clean_logits
        )
        rows.append({"method": f"resample {name}", "logit_diff": score, "change": score - clean_score, "kl": None})
        print(f"   {name:<22} {score:+.3f}  ({score - clean_score:+.3f})")

    # 5. Patching: the clean head written into the corrupt run.
    corrupt_score = metric(model(corrupt_tokens)).mean().item()
    patched = model.run_with_hooks(corrupt_tokens, fwd_hooks=patch.hooks(model, top, clean_cache))
    patched_score = metric(patched).mean().item()
    recovered = (patched_score - corrupt_score) / (clean_score - corrupt_score)
    print(f"\n5. ablation asks whether {top} is necessary, patching whether it is sufficient:")
    print(
        f"   corrupt run {corrupt_score:+.3f}; with the clean {top} patched in {patched_score:+.3f}"
        f" ({recovered:.0%} of the way back to clean {clean_score:+.3f})"
    )
    rows.append(
        {
            "method": f"patch clean {top} into corrupt",
            "logit_diff": patched_score,
            "change": patched_score - corrupt_score,
            "kl": None,
        }
    )

    # 6. The circuit: EAP-IG scores every edge of the residual graph, the top ~10% are kept.
    circuit, report = _circuit_chapter(model, task, metric, args, out)

    # 7. The features that carry the answer.
    features = _features_chapter(model, task, metric, clean, corrupt_tokens, clean_score, args, out)

    # 8. One prompt's attribution graph, and the features on its paths from the indirect object to the answer.
    graph = _graph_chapter(model, task, args, out, movers=[name for name, _ in ranked[:QK_HEADS]])

    # 9. Save.
    (out / "story.json").write_text(
        json.dumps(
            {
                "model": args.model,
                "task": {"name": "ioi", "n": args.n, "seed": args.seed, "template": "store"},
                "clean_logit_diff": clean_score,
                "corrupt_logit_diff": corrupt_score,
                "top_head": top,
                "rows": rows,
                "circuit": {
                    "method": circuit.method,
                    "edges": len(circuit.edges),
                    "graph_edges": len(circuit.graph.edges),
                    "heads": circuit.heads,
                    "faithfulness": report["faithfulness"],
                    "held_out_faithfulness": report["held_out_faithfulness"],
                    "held_out_seed": args.seed + 1,
                },
                "features": features,
                "graph": graph,
                "hooked_version": hooked.__version__,
                "torch_version": torch.__version__,
                "command": "python -m hooked.demo " + " ".join(argv if argv is not None else []),
            },
            indent=2,
        )
    )
    print(
        f"\n9. saved to {out}/: head-sweep-resample.csv/.json/.png (layer x head), circuit.png, circuit.json,"
        f" circuit-edges.csv, circuit-faithfulness.csv/.json/.png,"
        + (" feature-scores.csv, feature-ablations.csv/.json," if features else "")
        + (" graph.png, graph-ablations.csv/.json," if graph else "")
        + f" story.json; {time.perf_counter() - started:.1f}s in all"
    )
    return out


def _circuit_chapter(model, task, metric, args, out: Path):
    """Chapter 6: discover the circuit with EAP-IG (about 10% of the graph's edges), print its heads and the
    q/k/v inputs it uses and its faithfulness on the discovery prompts and on held-out ones, save it."""
    from hooked import circuits
    from hooked.circuits.report import curve_sizes, measure_circuit, write_circuit

    graph = circuits.graph(model)
    n_edges = max(1, len(graph.edges) // 10)
    with torch.enable_grad():  # attribution differentiates the metric; main runs under no_grad
        circuit = circuits.discover(
            model, task.clean, task.corrupt, metric, method="eap-ig", n_edges=n_edges, task=task
        )
    held = tasks.ioi_heldout(n=args.n)  # held-out names in held-out templates (docs/ioi-models.md)
    held_metric = metrics.logit_diff(model, held.correct, held.incorrect)
    circuit.provenance["held_out"] = {
        "name": held.name,
        "n": len(held),
        "seed": held.seed,
        "split": held.params["split"],
    }
    report = measure_circuit(
        circuit,
        curve_sizes(len(graph.edges), [5, 10, 20, 50, n_edges, 100, 200]),
        (held.clean, held.corrupt, held_metric),
    )
    _, note = write_circuit(circuit, report, out, f"EAP-IG circuit of {args.model} (IOI)")

    print(
        f"\n6. circuit discovery: EAP-IG scores all {len(graph.edges)} edges of the residual graph (a writer -> an"
        f" input that reads it);\n   the top {n_edges} (10%), pruned to the {len(circuit.edges)} on paths from input"
        f" to logits, join {len(circuit.nodes)} nodes.\n   Its heads, the inputs its edges feed, and the strongest "
        "edge in:"
    )
    for head, inputs in circuit.heads.items():
        feeding = [edge for edge in circuit.edges if head in circuit.graph.heads_reading(edge.receiver)]
        strongest = max(feeding, key=lambda edge: abs(circuit.scores[str(edge)]), default=None)
        print(
            f"   {head:<7} {','.join(inputs):<6}"
            + (f" {strongest} ({circuit.scores[str(strongest)]:+.2f})" if strongest else "")
        )
    strongest = ", ".join(f"{edge} {circuit.scores[str(edge)]:+.2f}" for edge in circuit.edges[:4])
    print(f"   strongest edges: {strongest}")
    print(
        f"   faithfulness (1: the circuit alone, every other edge patched to corrupt, keeps the clean logit"
        f" difference):\n   {report['faithfulness']:.3f} on the {len(task)} discovery prompts,"
        f" {report['held_out_faithfulness']:.3f} on {len(held)} held-out prompts (held-out names in held-out templates)"
    )
    print(
        "   curve, edges kept: discovery / held-out  "
        + "  ".join(
            f"{row['edges']}: {row['faithfulness']:.2f}/{row['held_out_faithfulness']:.2f}" for row in report["curve"]
        )
    )
    print(
        f"   picture {out}/circuit.png; edges {out}/circuit-edges.csv; curve {out}/circuit-faithfulness.*"
        + (f" ({note})" if note else "")
    )
    return circuit, report


def _features_chapter(model, task, metric, clean, corrupt, clean_score: float, args, out: Path) -> dict | None:
    """Chapter 7: score every feature of the bundled residual SAE by attribution patching, then ablate the top ones
    together, random active ones, and each top one alone, in one sweep; the bundled transcoders in brief."""
    import hooked.sae

    bundled = hooked.sae.bundled_saes()
    name = f"{args.model}/{FEATURES_SAE}"
    if name not in bundled:
        print(f"\n7. features: {args.model} has no bundled dictionary (hooked/ioi-gpt2 has, docs/saes.md); skipped")
        return None
    sae = hooked.sae.load(name, model=model)
    with torch.enable_grad():  # attribution differentiates the metric
        scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=[sae], task=task)
    scores.to_csv(out / "feature-scores.csv")
    top = [feature for feature, _ in scores.top(TOP_FEATURES)]
    k = len(top)
    with model.saes([sae], use_error_term=True):
        source, own = _feature_caches(model, clean, corrupt)
        acts = {
            "clean": own[f"{sae.hook_name_out}.hook_sae_acts_post"],
            "corrupt": source[f"{sae.hook_name_out}.hook_sae_acts_post"],
        }
        fired = (acts["clean"] > 0) | (acts["corrupt"] > 0)
        active = [f for f in scores.features if fired[..., int(f.rsplit(".F", 1)[1])].any() and f not in top]
        rng = random.Random(args.seed)
        variants = {
            f"top {k} resampled": ablate.hooks(model, top, "resample", source=source),
            f"top {k} zeroed": ablate.hooks(model, top, "zero"),
            **{
                f"random {k} #{i}": ablate.hooks(
                    model, rng.sample(active, min(k, len(active))), "resample", source=source
                )
                for i in range(RANDOM_DRAWS)
            },
            **{f"{feature} alone": ablate.hooks(model, [feature], "resample", source=source) for feature in top},
        }
        sweep = hooked.sweep(model, clean, variants, metric, task=task)
    sweep.save(out, name="feature-ablations")
    change = sweep.change
    at_end = {f: [int((acts[run][:, -1, int(f.rsplit(".F", 1)[1])] > 0).sum()) for run in acts] for f in top}
    print(
        f"\n7. the features that carry the answer: {name} ({sae.cfg.d_sae} features, TopK k={sae.cfg.k}),"
        f"\n   spliced with its error term (the logit difference stays {sweep.base_score:+.3f}); attribution patching"
        f" scores all {len(scores)}\n   in one forward and backward. The top {k} (score: the estimated change when"
        " resampled from corrupt; alone: measured;\n   fires: on how many clean / corrupt prompts it is active at the"
        " last token):"
    )
    for feature in top:
        clean_n, corrupt_n = at_end[feature]
        print(
            f"   {feature:<20} score {scores[feature]:+.3f}   alone {change[f'{feature} alone']:+.3f}"
            f"   fires {clean_n} / {corrupt_n}"
        )
    randoms = [change[f"random {k} #{i}"] for i in range(RANDOM_DRAWS)]
    print(
        f"   ablated together, one sweep of {len(variants)} variants (logit difference, change):\n"
        f"   top {k} resampled from corrupt  {sweep.scores[f'top {k} resampled']:+.3f}"
        f"  ({change[f'top {k} resampled']:+.3f}; alone they add up to"
        f" {sum(change[f'{feature} alone'] for feature in top):+.3f})\n"
        f"   top {k} zeroed                  {sweep.scores[f'top {k} zeroed']:+.3f}"
        f"  ({change[f'top {k} zeroed']:+.3f})\n"
        f"   {k} random active features, resampled ({RANDOM_DRAWS} draws from the {len(active)} others active on these"
        f" prompts): {min(randoms):+.3f} to {max(randoms):+.3f}\n"
        f"   Each top feature is active at the last token of a few prompts only; zeroing them does not lower the"
        f"\n   logit difference, resampling them, which also switches on those the corrupt prompts use, does."
    )
    transcoders = _transcoder_features(model, task, metric, clean, corrupt, bundled, args)
    return {
        "sae": name,
        "top": [
            {"feature": f, "score": scores[f], "alone": change[f"{f} alone"], "fires_at_end": at_end[f]} for f in top
        ],
        "clean_logit_diff": clean_score,
        "spliced_logit_diff": sweep.base_score,
        "top_resampled": change[f"top {k} resampled"],
        "top_zeroed": change[f"top {k} zeroed"],
        "random_resampled": randoms,
        "other_active_features": len(active),
        "transcoders": transcoders,
    }


def _feature_caches(model, clean, corrupt):
    """The spliced dictionaries' features on the corrupt and on the clean prompts."""
    acts = lambda name: name.endswith("hook_sae_acts_post")  # noqa: E731
    return model.run_with_cache(corrupt, names_filter=acts)[1], model.run_with_cache(clean, names_filter=acts)[1]


def _transcoder_features(model, task, metric, clean, corrupt, bundled, args) -> dict | None:
    """The bundled transcoder set's top features, scored and resampled together as the SAE's (two lines)."""
    import hooked.sae

    name = f"{args.model}/{FEATURES_SETS}"
    if name not in bundled:
        return None
    layers = hooked.sae.load(name, model=model)
    with torch.enable_grad():
        scores = hooked.sae.attribute(model, clean, corrupt, metric, saes=layers, task=task)
    top = [feature for feature, _ in scores.top(TOP_FEATURES)]
    with model.saes(layers, use_error_term=True):
        source, _ = _feature_caches(model, clean, corrupt)
        variants = {"top": ablate.hooks(model, top, "resample", source=source)}
        sweep = hooked.sweep(model, clean, variants, metric, task=task)
    print(
        f"   The transcoders ({name}, every MLP replaced, error terms kept):\n   the top features "
        + ", ".join(f"{f} {scores[f]:+.2f}" for f in top[:3])
        + f", ...; the top {len(top)} resampled together: {sweep.scores['top']:+.3f} ({sweep.change['top']:+.3f})"
    )
    return {"set": name, "top": [{"feature": f, "score": scores[f]} for f in top], "top_resampled": sweep.change["top"]}


def _graph_chapter(model, task, args, out: Path, movers: list[str] = ()) -> dict | None:
    """Chapter 8: the attribution graph of the first prompt through the bundled transcoders, pruned and drawn; the
    features on the strongest paths from the indirect object's token to the answer's logit node, zeroed together
    on the real model (one sweep, with random active features and each alone) and by `graphs.intervene`."""
    import hooked.sae
    from hooked import graphs
    from hooked.graphs.paths import path_strengths, strongest_path

    name = f"{args.model}/{FEATURES_SETS}"
    if name not in hooked.sae.bundled_saes():
        print(f"\n8. attribution graph: {args.model} has no bundled transcoders (hooked/ioi-gpt2 has); skipped")
        return None
    transcoders = hooked.sae.load(name, model=model)
    prompt, answer, other = task.clean[0], task.correct[0], task.incorrect[0]
    answer_id, other_id = model.to_single_token(answer), model.to_single_token(other)
    with torch.enable_grad():  # attribution differentiates the replacement model; main runs under no_grad
        graph = graphs.attribute(model, prompt, transcoders)
    pruned = graph.prune(node_threshold=0.8, edge_threshold=0.98)
    replacement, completeness = graph.scores()
    graph.plot(out / "graph.png", tokenizer=model.tokenizer, title=f"{prompt!r} -> {answer!r}")
    logit_ids = graph.logit_token_ids.tolist()
    if answer_id not in logit_ids:
        print(f"\n8. attribution graph: {answer!r} is not among the logit nodes of {prompt!r}; skipped")
        return None
    io_position = int((graph.input_tokens == answer_id).nonzero()[0])
    source, target = graph.token_offset + io_position, graph.logit_offset + logit_ids.index(answer_id)
    strength = path_strengths(pruned, source, target)
    best = strongest_path(pruned, source, target)
    ranked = torch.argsort(strength[: graph.n_features], descending=True)[:PATH_FEATURES].tolist()
    on_path = [graph.feature_address(i) for i in ranked if strength[i] > 0]
    print(
        f"\n8. the attribution graph of one prompt (hooked.graphs, docs/graphs.md): {prompt!r} -> {answer!r},"
        f"\n   through {name} (every MLP replaced, its error a node): {graph.active_features.shape[0]} active features,"
        f" {graph.n_nodes} nodes;\n   pruned (node threshold 0.8, edge threshold 0.98) to {len(pruned.nodes)} nodes"
        f" and {len(pruned.edges())} edges; replacement score {replacement:.2f}, completeness {completeness:.2f};"
        f" picture {out}/graph.png"
    )
    print(
        f"   the strongest path from the indirect object's token {answer!r} @{io_position} to its logit (strength: the"
        f" product of each\n   edge's share of its target's input): "
        + " -> ".join(graph.node_label(i, model.tokenizer) for i in best)
        + f" ({float(strength[source]):.3f})"
    )
    qk = _qk_section(model, graph.input_tokens, transcoders, movers, other_id, io_position)
    if not on_path:
        print("   no feature lies on a kept path from that token to the answer; nothing to ablate")
        return None

    k = len(on_path)
    active = [
        f"L{layer}.{graph.feature_part}.F{feature}@{position}"
        for layer, position, feature in graph.active_features.tolist()
        if position > 0
    ]
    others = [address for address in active if address not in on_path]
    rng = random.Random(args.seed)
    draws = [rng.sample(others, k) for _ in range(RANDOM_DRAWS)]
    tokens = graph.input_tokens[None].to(model.device)
    metric = metrics.logit_diff(model, [answer], [other])
    with model.saes(transcoders, use_error_term=True):
        variants = {
            "path features zeroed": ablate.hooks(model, on_path, "zero"),
            **{f"random {k} #{i}": ablate.hooks(model, draw, "zero") for i, draw in enumerate(draws)},
            **{f"{address} alone": ablate.hooks(model, [address], "zero") for address in on_path},
        }
        sweep = hooked.sweep(model, tokens, variants, metric)
    sweep.save(out, name="graph-ablations")
    change = sweep.change
    ablated = graphs.intervene(model, tokens[0], transcoders, dict.fromkeys(on_path, 0.0))
    answer_drops = [
        graphs.intervene(model, tokens[0], transcoders, dict.fromkeys(draw, 0.0)).logit_change(answer_id)
        for draw in draws
    ]
    answer_drop = ablated.logit_change(answer_id)
    randoms = [change[f"random {k} #{i}"] for i in range(RANDOM_DRAWS)]
    print(f"   the {k} features on the strongest paths (strength of the best path through each; alone: the logit")
    print("   difference's change when it is zeroed by itself):")
    for i, address in zip(ranked, on_path, strict=False):
        print(f"   {address:<20} {float(strength[i]):.3f}   alone {change[f'{address} alone']:+.3f}")
    top_after = model.tokenizer.decode([int(ablated.logits[-1].argmax())]) if model.tokenizer else "?"
    path_score = sweep.scores["path features zeroed"]
    print(
        f"   zeroed together on the real model (transcoders spliced with their error term; one sweep of"
        f" {len(variants)} variants):\n"
        f"   path features: logit difference {sweep.base_score:+.3f} -> {path_score:+.3f}"
        f" ({change['path features zeroed']:+.3f}); by graphs.intervene the {answer!r} logit moves {answer_drop:+.3f},"
        f"\n   the {other!r} logit {ablated.logit_change(other_id):+.3f}, and the model still predicts {top_after!r}\n"
        f"   {k} random active features ({RANDOM_DRAWS} draws of the {len(others)} others): logit difference"
        f" {min(randoms):+.3f} to {max(randoms):+.3f}, {answer!r} logit {min(answer_drops):+.3f} to"
        f" {max(answer_drops):+.3f}"
    )
    if abs(ablated.logit_change(other_id)) > abs(answer_drop) / 2:
        print(
            "   The other name's logit falls almost as much: these features say 'a name comes next' more than which"
            " one,\n   so the logit difference, which chapter 2's heads carry, moves much less than the answer's logit."
        )
    return {
        "transcoders": name,
        "prompt": prompt,
        "answer": answer,
        "other": other,
        "io_position": io_position,
        "nodes": graph.n_nodes,
        "pruned_nodes": len(pruned.nodes),
        "pruned_edges": len(pruned.edges()),
        "replacement_score": replacement,
        "completeness_score": completeness,
        "strongest_path": [graph.node_label(i, model.tokenizer) for i in best],
        "path_features": [
            {"feature": address, "strength": float(strength[i]), "alone": change[f"{address} alone"]}
            for i, address in zip(ranked, on_path, strict=False)
        ],
        "logit_diff": sweep.base_score,
        "path_zeroed": change["path features zeroed"],
        "path_answer_logit": answer_drop,
        "path_other_logit": ablated.logit_change(other_id),
        "random_features": draws,
        "random_zeroed": randoms,
        "random_answer_logit": answer_drops,
        "qk": qk,
    }


def _qk_section(model, tokens, transcoders, movers, other_id: int, io_position: int) -> list[dict]:
    """Chapter 8, continued: why chapter 2's top heads attend where they do on the graph's prompt
    (`graphs.qk_attribution`, norms frozen): the key they attend to, their scores at the indirect object and at both
    mentions of the subject, and the key-side totals by kind that set the attended mention apart from the other."""
    from hooked.graphs.qk import QKRun

    if not movers:
        return []
    subject = (tokens == other_id).nonzero().flatten().tolist()
    heads = [(int(layer), int(head)) for layer, head in (name.removeprefix("L").split("H") for name in movers)]
    run = QKRun(model, tokens, transcoders, sorted({layer for layer, _ in heads}))
    query, label = run.n_pos - 1, lambda p: f"{model.tokenizer.decode([int(tokens[p])])!r} @{p}"
    print(
        "   why chapter 2's top heads attend where they do (graphs.qk_attribution: each score split into pairs of"
        f" nodes at the\n   query and the key, norms frozen; docs/graphs.md), from the last token {label(query)}:"
    )
    report = []
    for layer, head in heads:
        maps = run.head(layer, head)
        pattern = torch.softmax(run.model_scores(maps, query, list(range(run.n_pos))).float(), dim=0)
        key = int(pattern.argmax())
        qk = run.attribute(layer, head, query, None, top=3)
        named = {"IO": [io_position], "S": subject}
        where = ", ".join(f"{who} {label(p)} {qk.score(p):+.1f}" for who, ps in named.items() for p in ps)
        print(f"   L{layer}H{head} attends to {label(key)} (weight {float(pattern[key]):.2f}); its scores: {where}")
        row = {"head": f"L{layer}H{head}", "key": key, "weight": float(pattern[key]), "scores": qk.to_dict()["keys"]}
        twins = [p for p in subject if p != key] if key in subject else []
        if twins:  # the same token elsewhere: what tells the attended mention apart is not the token
            twin = twins[0]
            kinds = {"attention outputs": "attention", "features": "feature", "token": "token"}
            sums = {name: (_kind_total(qk, key, kind), _kind_total(qk, twin, kind)) for name, kind in kinds.items()}
            parts = ", ".join(f"{name} {here:+.1f} vs {there:+.1f}" for name, (here, there) in sums.items())
            terms, totals = qk.key_terms[qk.keys.index(key)], qk.key_totals(key)
            features = [(t.label, float(v)) for t, v in zip(terms, totals, strict=True) if t.kind == "feature"]
            best = sorted(features, key=lambda item: -item[1])[:3]
            print(f"     key side at {label(key)} vs the same token at {label(twin)}: {parts}")
            raising = ", ".join(f"{name} {value:+.2f}" for name, value in best)
            print(f"     the features at the attended key that raise its score most: {raising}")
            row.update({"twin": twin, "key_totals_by_kind": sums, "features_raising": best})
        report.append(row)
    on_subject = [row for row in report if "twin" in row]
    if report and len(on_subject) == len(report):
        token_small = all(abs(row["key_totals_by_kind"]["token"][0]) < 1 for row in on_subject)
        set_apart = all(
            row["key_totals_by_kind"][kind][0] > row["key_totals_by_kind"][kind][1]
            for row in on_subject
            for kind in ("attention outputs", "features")
        )
        print(
            "   None of them attends to the indirect object: they attend to the repeated subject and act through their"
            " values\n   (chapter 6's edges into them are v edges; chapter 2: resampling them lowers the logit"
            " difference most)."
        )
        if token_small and set_apart:
            print(
                "   The QK side shows how they find that mention: its token adds almost nothing (the same token at the"
                " first mention\n   scores far lower); what earlier heads wrote there and layer-0 features there set"
                " it apart."
            )
    return report


def _kind_total(qk, key: int, kind: str) -> float:
    """The key-side terms of one kind at `key`, their total contribution to the score."""
    terms, totals = qk.key_terms[qk.keys.index(key)], qk.key_totals(key)
    return sum(float(v) for t, v in zip(terms, totals, strict=True) if t.kind == kind)


if __name__ == "__main__":
    main()
