"""Attribution graphs: `hooked.graphs.attribute` against circuit-tracer 0.5.0's `attribute`, time and peak memory.

    .venv/bin/python benchmarks/graphs.py [--lengths 64,256,1024] [--time-length 64] [--rounds 3] [--threads 1]
                                          [--max-feature-nodes 256] [--batch-size 32] [--edges-per-row 64]

The same random Llama-shaped checkpoint (4 layers, d_model 128, 4 heads, d_mlp 512, vocabulary 300, context
1,024; `build_llama_checkpoint` of tests/graphs/circuit_tracer_reference.py) and the same random JumpReLU transcoder set
(d_sae 1,024 per layer, thresholds set for a few dozen active features per token), written in circuit-tracer's
format and loaded by each library's own loader. circuit-tracer runs in its own venv (it pins
transformers<=4.57.3; tests/circuit_tracer_venv.py builds it), on TransformerLens 3.2.1 built offline as
tests/graphs/circuit_tracer_side.py builds it for the parity tests. The prompt is the first `length` ids of a
fixed random sequence starting with BOS.

1. time: both at `--time-length` tokens with every feature a node (`max_feature_nodes=None`), the same
   `--batch-size` and logit settings; each run a fresh subprocess, the libraries taking turns, `--rounds` times;
   wall time and process CPU time of the `attribute` call alone (model, transcoders and imports ready).
   Target: hooked <= 1.0x circuit-tracer.
2. memory: at each of `--lengths`, `max_feature_nodes=--max-feature-nodes`: the peak resident memory of the
   `attribute` call above what it was just before (VmHWM after /proc/self/clear_refs), for circuit-tracer
   (a dense N x N adjacency; its TransformerLens attention keeps each layer's [batch, heads, pos, pos] pattern
   for the backward passes), hooked with a dense adjacency (circuit-tracer's), and hooked with
   `edges_per_row=--edges-per-row` (a sparse adjacency). Targets: hooked grows at most linearly in tokens;
   at 1,024 tokens at most half of circuit-tracer's peak.

Both graphs of the time case are compared before the figures are printed (max |difference| of the adjacency):
a benchmark of a wrong answer is worthless.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from common import BENCH_DIR, MiB, environment, proc_status, reset_peak_rss, table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.circuit_tracer_venv import venv_python  # noqa: E402
from tests.graphs.circuit_tracer_reference import _fill, build_llama_checkpoint, random_transcoder_set  # noqa: E402

N_LAYERS, D_MODEL, N_HEADS, D_MLP, VOCAB, N_CTX, D_SAE = 4, 128, 4, 512, 300, 1024, 1024
SPARSE_JUMPRELU = {"threshold": (6.5, 0.3), "W_skip": (0.0, 0.1), "": (0.0, 0.3)}  # a few dozen features per token
WORK = BENCH_DIR / "graphs"

# circuit-tracer's side, run by the circuit-tracer venv's python: argv = checkpoint, transcoders, job json
CIRCUIT_TRACER_WORKER = """
import gc, json, sys, time
import torch
sys.path.insert(0, sys.argv[4])
from circuit_tracer_side import replacement_model
from circuit_tracer import attribute
job = json.loads(sys.argv[3])
if job["threads"]:
    torch.set_num_threads(job["threads"])
model, hf = replacement_model(__import__("pathlib").Path(sys.argv[1]), __import__("pathlib").Path(sys.argv[2]))
del hf
tokens = torch.tensor(job["tokens"])
def status():
    values = {}
    for line in open("/proc/self/status"):
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0]) * 1024
    return values
gc.collect()
open("/proc/self/clear_refs", "w").write("5")
before = status()["VmRSS"]
start, cpu = time.perf_counter(), time.process_time()
graph = attribute(tokens, model, **job["settings"])
seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
peak = status()["VmHWM"] - before
if job.get("save"):
    torch.save(graph.adjacency_matrix, job["save"])
print(json.dumps({"seconds": seconds, "cpu": cpu_seconds, "peak": peak, "nodes": graph.adjacency_matrix.shape[0],
                  "active": int(graph.active_features.shape[0])}))
"""


def build() -> tuple[Path, Path, list[int]]:
    """The checkpoint, the transcoder folder (circuit-tracer's format) and the longest prompt's ids."""
    import hooked.sae

    checkpoint = WORK / "llama"
    if not (checkpoint / "config.json").exists():
        build_llama_checkpoint(
            checkpoint, n_layers=N_LAYERS, d_model=D_MODEL, n_heads=N_HEADS, d_mlp=D_MLP, vocab_size=VOCAB, n_ctx=N_CTX
        )
    folder = WORK / "transcoders"
    if not (folder / "config.yaml").exists():
        transcoders = random_transcoder_set(N_LAYERS, D_MODEL, D_SAE, skip=False)
        for layer, transcoder in enumerate(transcoders):
            _fill(transcoder, layer, SPARSE_JUMPRELU)
        hooked.sae.save(transcoders, folder, format="circuit-tracer")
    config = json.loads((checkpoint / "config.json").read_text())
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, config["vocab_size"], (N_CTX - 1,), generator=generator).tolist()
    return checkpoint, folder, [config["bos_token_id"], *ids]


def hooked_worker(job: dict) -> dict:
    import hooked
    import hooked.sae
    from hooked import graphs

    if job["threads"]:
        torch.set_num_threads(job["threads"])
    model = hooked.load(job["checkpoint"])
    transcoders = hooked.sae.load(job["transcoders"], model=model)
    tokens = torch.tensor(job["tokens"])
    graphs.attribute(model, tokens[:8], transcoders, max_n_logits=2)  # warm: first-call imports and dispatch
    gc.collect()
    reset_peak_rss()
    before = proc_status().get("VmRSS", 0)
    start, cpu = time.perf_counter(), time.process_time()
    graph = graphs.attribute(model, tokens, transcoders, **job["settings"], progress=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    peak = proc_status().get("VmHWM", 0) - before
    if job.get("save"):
        torch.save(graph.adjacency.to_dense(), job["save"])
    return {
        "seconds": seconds,
        "cpu": cpu_seconds,
        "peak": peak,
        "nodes": graph.n_nodes,
        "active": int(graph.active_features.shape[0]),
    }


def run(library: str, job: dict) -> dict:
    if library == "circuit-tracer":
        settings = {k: v for k, v in job["settings"].items() if k != "edges_per_row"}
        payload = json.dumps({**job, "settings": settings})
        command = [str(venv_python()), "-c", CIRCUIT_TRACER_WORKER, job["checkpoint"], job["transcoders"], payload]
        command.append(str(ROOT / "tests" / "graphs"))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": ""}
    else:
        command = [sys.executable, __file__, "--worker", json.dumps(job)]
        env = dict(os.environ)
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"the {library} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="64,256,1024")
    parser.add_argument("--time-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--max-feature-nodes", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--edges-per-row", type=int, default=64)
    parser.add_argument("--sections", default="time,memory")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(hooked_worker(json.loads(args.worker))))
        return

    print(environment())
    print(f"load average {os.getloadavg()[0]:.2f} at the start")
    WORK.mkdir(parents=True, exist_ok=True)
    checkpoint, folder, tokens = build()
    base = {"checkpoint": str(checkpoint), "transcoders": str(folder), "threads": args.threads}
    logits = {"max_n_logits": 10, "desired_logit_prob": 0.95, "batch_size": args.batch_size}

    if "time" in args.sections.split(","):
        job = {**base, "tokens": tokens[: args.time_length], "settings": {**logits, "max_feature_nodes": None}}
        # correctness first: the two graphs of this case
        ours = run("hooked", {**job, "save": str(WORK / "hooked.pt")})
        run("circuit-tracer", {**job, "save": str(WORK / "ct.pt")})
        a, b = torch.load(WORK / "hooked.pt"), torch.load(WORK / "ct.pt")
        difference = (a - b).abs().max().item() if a.shape == b.shape else float("nan")
        print(
            f"\n{args.time_length} tokens: {ours['active']} active features, {ours['nodes']} nodes;"
            f" max |adjacency hooked - circuit-tracer| = {difference:.2e} (max |entry| {b.abs().max().item():.2f})"
        )
        runs = {"hooked": [], "circuit-tracer": []}
        for _ in range(args.rounds):
            for library in runs:
                runs[library].append(run(library, job))
        wall = {lib: statistics.median(r["seconds"] for r in rs) for lib, rs in runs.items()}
        cpu = {lib: statistics.median(r["cpu"] for r in rs) for lib, rs in runs.items()}
        rows = [
            (
                lib,
                f"{wall[lib]:.2f}",
                " ".join(f"{r['seconds']:.2f}" for r in runs[lib]),
                f"{wall['hooked'] / wall[lib]:.2f}",
                f"{cpu[lib]:.2f}",
                f"{cpu['hooked'] / cpu[lib]:.2f}",
            )
            for lib in runs
        ]
        print(f"\n1. attribute, {args.time_length} tokens, every feature a node, batch {args.batch_size}")
        print(table(["", "median s", "runs", "hooked / this", "median CPU s", "hooked / this (CPU)"], rows))

    if "memory" in args.sections.split(","):
        lengths = [int(n) for n in args.lengths.split(",")]
        variants = {
            "circuit-tracer": {},
            "hooked (dense)": {},
            f"hooked (edges_per_row={args.edges_per_row})": {"edges_per_row": args.edges_per_row},
        }
        peaks: dict[str, list[float]] = {name: [] for name in variants}
        nodes = []
        for length in lengths:
            for name, extra in variants.items():
                settings = {**logits, "max_feature_nodes": args.max_feature_nodes, **extra}
                result = run(
                    "circuit-tracer" if name == "circuit-tracer" else "hooked",
                    {**base, "tokens": tokens[:length], "settings": settings},
                )
                peaks[name].append(result["peak"] / MiB)
            nodes.append(result["nodes"])
        header = ["peak MiB above start", *(f"{n} tokens" for n in lengths), "growth per 4x tokens"]
        rows = []
        for name, values in peaks.items():
            growth = " ".join(f"{b / a:.1f}x" for a, b in zip(values, values[1:], strict=False) if a > 0)
            rows.append((name, *(f"{v:.0f}" for v in values), growth))
        ratio = [f"{h / c:.2f}" for h, c in zip(peaks[list(variants)[2]], peaks["circuit-tracer"], strict=True)]
        rows.append(("sparse hooked / circuit-tracer", *ratio, ""))
        print(
            f"\n2. peak memory of attribute, max_feature_nodes={args.max_feature_nodes}, batch {args.batch_size}"
            f" (graph nodes: {', '.join(map(str, nodes))})"
        )
        print(table(header, rows))
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
