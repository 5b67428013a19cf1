"""Circuits: what edge attribution, faithfulness, ACDC and path patching cost, against plain forwards.

    .venv/bin/python benchmarks/circuits.py [--repeats 5] [--sections eap,faithfulness,acdc,path]

1. eap: `circuits.attribute(model, clean, corrupt, metric, method="eap")` over all 32,491 edges of a
   GPT-2-small-shaped model (benchmarks/common.py, random weights, float32), 8 prompts x 15 random
   tokens, against one forward + backward of the same batch (`metric(model(clean)).sum().backward()`),
   interleaved. Target: at most 4x the time. Peak memory: VmHWM above the RSS of the loaded model
   (reset through /proc/self/clear_refs), each method once in a fresh process; target: EAP's at most 2x
   the forward + backward's (which allocates the parameters' gradients, 475 MiB, EAP none).
   EAP-IG with 5 steps is timed too (no target).
2. faithfulness: `Circuit.faithfulness` of circuits of 10, 1,000 and 30,000 edges on the same model and
   prompts, against one plain forward: every edge outside the circuit is patched, in one batched
   forward whatever the circuit's size; the call also records the clean and corrupt runs it compares
   with, so that forward alone (on runs recorded once) is timed too.
3. acdc: `circuits.discover(method="acdc", threshold=0.1)` on the bundled `hooked/ioi-gpt2` with 32 IOI
   prompts: wall time (target under 60 s on this 2-core CPU), forwards run, and the trials (one
   forward each, sequentially: the ratio is the target, >= 10x fewer).
4. path: path patching each of the bundled model's 16 heads -> logits (direct edges), as one
   `path_patch_sweep` against the loop a user writes by hand with plain hooks (capture the head's
   write on the clean run, add corrupt - clean at the final residual stream, one forward per head);
   the two must agree to float rounding (max difference printed).
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time

import torch
from common import (
    compare,
    environment,
    gpt2_small_checkpoint,
    proc_status,
    random_tokens,
    reset_peak_rss,
    rss,
    table,
    timing_table,
)

import hooked
from hooked import circuits, metrics, tasks

MiB = 1024**2


def peak_extra(fn) -> tuple[float, object]:
    """(VmHWM above the RSS just before, in MiB; fn's result)."""
    gc.collect()
    before = rss()
    reset_peak_rss()
    result = fn()
    peak = proc_status().get("VmHWM", 0)
    return (peak - before) / MiB, result


def _gpt2_small_setup():
    model = hooked.load(gpt2_small_checkpoint())
    clean, corrupt = random_tokens(8, 15, seed=0), random_tokens(8, 15, seed=1)
    metric = metrics.logit_diff(model, [11] * 8, [13] * 8)

    def forward_backward():
        model.zero_grad(set_to_none=True)
        metric(model(clean)).sum().backward()
        model.zero_grad(set_to_none=True)

    fns = {
        "forward + backward": forward_backward,
        "EAP, every edge": lambda: circuits.attribute(model, clean, corrupt, metric, method="eap"),
        "EAP-IG (5 steps)": lambda: circuits.attribute(model, clean, corrupt, metric, method="eap-ig", steps=5),
    }
    return model, fns


def memory_worker(name: str) -> None:
    """In a fresh process: the model loaded, then the peak resident memory above that while `name` runs once."""
    _, fns = _gpt2_small_setup()
    extra, _ = peak_extra(fns[name])
    print(json.dumps({"extra_mib": extra}))


def eap_section(repeats: int) -> None:
    model, fns = _gpt2_small_setup()
    timings = compare(fns, repeats=repeats, warmup=1)
    print(
        timing_table(
            timings,
            unit="ms",
            title=f"EAP over {len(circuits.graph(model).edges):,} edges, GPT-2 small shape, 8 x 15 tokens, float32",
        )
    )
    rows, base = [], None
    for name in fns:  # each in a process of its own: an earlier run's freed heap would hide a later one's peak
        done = subprocess.run(
            [sys.executable, __file__, "--memory-worker", name], capture_output=True, text=True, check=True
        )
        extra = json.loads(done.stdout.strip().splitlines()[-1])["extra_mib"]
        base = extra if base is None else base
        rows.append((name, f"{extra:.0f}", f"{extra / base:.2f}"))
    print(
        table(
            ["", "peak above the loaded model's RSS, MiB", "ratio vs forward + backward"],
            rows,
            "memory (each in a fresh process)",
        )
    )
    print(f"(weights: {sum(p.numel() * p.element_size() for p in model.parameters()) / MiB:.0f} MiB)\n")


def faithfulness_section(repeats: int) -> None:
    model = hooked.load(gpt2_small_checkpoint())
    clean, corrupt = random_tokens(8, 15, seed=0), random_tokens(8, 15, seed=1)
    metric = metrics.logit_diff(model, [11] * 8, [13] * 8)
    scores = circuits.attribute(model, clean, corrupt, metric, method="eap")
    ranking = scores.ranking()
    graph = scores.graph

    def circuit(n: int) -> circuits.Circuit:
        edges = ranking[:n]
        return circuits.Circuit(graph, edges, {str(e): scores[e] for e in graph.edges}, "eap", model=model)

    from hooked.circuits.experiment import Experiment

    experiment = Experiment.of(model, clean, corrupt, metric)  # the clean and corrupt runs, recorded once
    fns = {"one forward": lambda: model(clean)}
    for n in (10, 1000, 30000):
        c = circuit(n)
        fns[f"faithfulness, {n:,} edges"] = lambda c=c: c.faithfulness(clean, corrupt, metric)
        complement = (~c.mask() & graph.edge_mask())[None]
        fns[f"  its patched forward alone, {n:,} edges"] = lambda m=complement: experiment.values(m)
    with torch.no_grad():
        timings = compare(fns, repeats=repeats, warmup=1)
    print(
        timing_table(
            timings,
            unit="ms",
            title="Circuit.faithfulness (records the clean and corrupt runs, then one"
            " patched forward) vs one forward, GPT-2 small shape, 8 x 15",
        )
    )
    print()


def acdc_section() -> None:
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(32, seed=0)
    clean, corrupt = model.to_tokens(task.clean), model.to_tokens(task.corrupt)
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    start = time.perf_counter()
    found = circuits.discover(model, clean, corrupt, metric, method="acdc", threshold=0.1)
    elapsed = time.perf_counter() - start
    stats = found.provenance["circuits"]
    rows = [
        (
            "hooked/ioi-gpt2, 32 prompts, threshold 0.1",
            f"{elapsed:.1f}",
            stats["forwards"],
            stats["trials"],
            f"{stats['trials'] / stats['forwards']:.1f}",
            len(found.edges),
            f"{found.faithfulness():.3f}",
        )
    ]
    print(
        table(
            ["", "wall s", "forwards", "trials (sequential forwards)", "fewer forwards", "edges kept", "faithfulness"],
            rows,
            "ACDC, speculative batches of 32 trials",
        )
    )
    print()


def path_section(repeats: int) -> None:
    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(32, seed=0)
    clean, corrupt = model.to_tokens(task.clean), model.to_tokens(task.corrupt)
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    heads = [f"L{layer}H{head}" for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
    final = f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"

    def by_hand() -> list[float]:
        values = []
        with torch.no_grad():
            _, corrupt_cache = model.run_with_cache(
                corrupt, names_filter=lambda name: name.endswith("attn.hook_result")
            )
            for address in heads:
                layer, head = (int(x) for x in address[1:].split("H"))
                name = f"blocks.{layer}.attn.hook_result"
                written = {}

                def keep(result, hook, head=head):
                    written["clean"] = result[:, :, head].clone()

                def add(resid, hook, name=name, head=head):
                    return resid + corrupt_cache[name][:, :, head] - written["clean"]

                logits = model.run_with_hooks(clean, fwd_hooks=[(name, keep), (final, add)])
                values.append(float(metric(logits).mean()))
        return values

    def batched() -> list[float]:
        result = circuits.path_patch_sweep(model, clean, corrupt, {h: ([h], ["logits"]) for h in heads}, metric)
        return [float(result[h].mean()) for h in heads]

    difference = max(abs(a - b) for a, b in zip(by_hand(), batched(), strict=True))
    timings = compare({"hand-written loop": by_hand, "path_patch_sweep": batched}, repeats=repeats, warmup=1)
    print(
        timing_table(
            timings,
            unit="ms",
            title=f"path patching {len(heads)} heads -> logits, hooked/ioi-gpt2, 32 prompts"
            f" (max difference {difference:.2e})",
        )
    )
    print()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sections", default="eap,faithfulness,acdc,path")
    parser.add_argument("--memory-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_worker:
        return memory_worker(args.memory_worker)
    print(environment(), "\n")
    sections = args.sections.split(",")
    if "eap" in sections:
        eap_section(args.repeats)
    if "faithfulness" in sections:
        faithfulness_section(args.repeats)
    if "acdc" in sections:
        acdc_section()
    if "path" in sections:
        path_section(args.repeats)


if __name__ == "__main__":
    main()
