"""The same small benchmarks on two revisions of hooked, in one run: is the newer one slower?

    .venv/bin/python benchmarks/before_after.py --before 676c880 [--after HEAD] [--rounds 3] [--repeats 5] [--threads 1]
                                                [--benchmarks sweep,splice,sae-train,graph,eap,sae-attribute,patch]

A refactor that should move no number and no millisecond (issue 28's restructure, issue 40's shared result tables and
eval-mode context) is checked by running the benchmarks of the wings it touched on the tree before and the tree after,
interleaved, on the same machine and venv. Each revision is checked out with `git worktree add --detach` under
$HOOKED_BENCH_DIR/before-after (default /tmp/hooked-bench/before-after); `--after` defaults to this checkout as it is
(uncommitted edits included). Every measurement is a fresh subprocess whose `hooked` is imported from its revision's
tree (PYTHONPATH; the worker checks `hooked.__file__`), and the revisions take turns (before, after; after, before; ...)
for `--rounds` rounds, so a machine that slows down over the run slows both alike.

The workloads are small versions of the scripts in this folder, on the bundled `hooked/ioi-gpt2` (4 layers, d_model
128) and its bundled SAE and transcoders, so that one run takes minutes on two CPU cores:

| name | what is timed | small version of |
|---|---|---|
| sweep | `hooked.sweep`, every head zero-ablated on 32 IOI prompts, then `to_csv` | benchmarks/sweep.py |
| splice | `model.run_with_saes` with the residual SAE, 32 IOI prompts | benchmarks/saes.py (splice) |
| sae-train | `hooked.sae.train`, TopK d_sae 256, 20 steps of 512 tokens | benchmarks/sae_training.py |
| graph | `hooked.graphs.attribute`, one IOI prompt through the transcoders | benchmarks/graphs.py (time) |
| eap | `circuits.attribute(method="eap-ig", steps=5)`, 16 prompts, then `to_csv` | benchmarks/circuits.py |
| sae-attribute | `hooked.sae.attribute` of the residual SAE's features, 16 prompts, then `to_csv` | |
| patch | `patch.attribution` of every head's output, 16 prompts, then `to_csv` | |

Each worker runs its workload once to warm up, then `--repeats` times; the table gives, per revision, the median over
rounds of each round's median wall time, the ratio after / before, and whether both revisions computed the same
numbers (a checksum of the result; with one thread the kernels run in the same order, so equal means bit-equal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WORK = Path(os.environ.get("HOOKED_BENCH_DIR", "/tmp/hooked-bench")) / "before-after"
BENCHMARKS = ("sweep", "splice", "sae-train", "graph", "eap", "sae-attribute", "patch")


# ----------------------------------------------------------------------------- the workloads (run in the worker)
def workload(name: str):
    """(the callable to time, a function of its result giving a checksum float)."""
    import torch

    import hooked
    import hooked.sae
    from hooked import ablate, circuits, graphs, metrics, patch, tasks

    model = hooked.load("hooked/ioi-gpt2")
    task = tasks.ioi(32, seed=0, model=model)
    small = tasks.ioi(16, seed=1, model=model)
    sae = hooked.sae.load("hooked/ioi-gpt2/saes/blocks.2.hook_resid_post")
    out = Path(tempfile.mkdtemp(prefix="before-after-"))

    def written(result) -> float:
        """The checksum of a result, after writing its CSV (the result tables are what issue 40 moved)."""
        result.to_csv(out / "result.csv")
        return float(result.values.double().sum())

    if name == "sweep":
        heads = [f"L{layer}H{head}" for layer in range(model.cfg.n_layers) for head in range(model.cfg.n_heads)]
        variants = {head: ablate.hooks(model, head, "zero") for head in heads}
        metric = metrics.logit_diff(model, task)
        return lambda: hooked.sweep(model, task.clean, variants, metric, progress=False), written
    if name == "splice":
        tokens = model.to_tokens(task.clean)

        def splice():
            with torch.no_grad():
                return model.run_with_saes(tokens, saes=[sae])

        return splice, lambda logits: float(logits.double().sum())
    if name == "sae-train":
        texts = tasks.ioi(300, seed=2).clean
        settings = dict(hook_name="blocks.2.hook_resid_post", architecture="topk", d_sae=256, k=8)
        settings.update(n_tokens=20 * 512, batch_tokens=512, context_size=32, lr=3e-3, progress=False)
        return lambda: hooked.sae.train(model, texts, **settings), lambda trained: float(
            trained.W_dec.detach().double().sum()
        )
    if name == "graph":
        transcoders = hooked.sae.load("hooked/ioi-gpt2/saes/transcoders")
        prompt = task.clean[0]
        return (
            lambda: graphs.attribute(model, prompt, transcoders, max_n_logits=4, progress=False),
            lambda graph: float(graph.adjacency.to_dense().double().sum()),
        )
    metric = metrics.logit_diff(model, small)
    if name == "eap":
        return lambda: circuits.attribute(model, small.clean, small.corrupt, metric, method="eap-ig", steps=5), written
    if name == "sae-attribute":

        def features_written(scores) -> float:
            scores.to_csv(out / "features.csv")
            return float(scores.scores.double().sum())

        return lambda: hooked.sae.attribute(model, small.clean, small.corrupt, metric, saes=[sae]), features_written
    if name == "patch":
        _, clean_cache = model.run_with_cache(small.clean)
        return lambda: patch.attribution(model, small.corrupt, clean_cache, metric), written
    raise ValueError(f"no benchmark {name!r}; they are {', '.join(BENCHMARKS)}")


def worker(job: dict) -> dict:
    import torch

    import hooked

    tree = Path(job["tree"]).resolve()
    if not Path(hooked.__file__).resolve().is_relative_to(tree):
        raise SystemExit(f"the worker imported hooked from {hooked.__file__}, not from {tree}")
    torch.set_num_threads(job["threads"])
    run, checksum = workload(job["name"])
    check = checksum(run())  # warm: first-call imports and dispatch
    times = []
    for _ in range(job["repeats"]):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return {"times": times, "check": check}


# ----------------------------------------------------------------------------- the revisions (run in the parent)
def git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=True).stdout.strip()


def checkout(revision: str | None) -> tuple[str, Path]:
    """(label, tree) of a revision: a detached worktree of it under WORK, or this checkout for None."""
    if revision is None:
        dirty = bool(git("status", "--porcelain", "--untracked-files=no"))
        return git("rev-parse", "--short", "HEAD") + ("+edits" if dirty else ""), ROOT
    commit = git("rev-parse", "--short", revision)
    tree = WORK / commit
    if not (tree / "hooked" / "__init__.py").exists():
        WORK.mkdir(parents=True, exist_ok=True)
        git("worktree", "add", "--detach", str(tree), commit)
    return commit, tree


def measure(tree: Path, name: str, threads: int, repeats: int, python: str) -> dict:
    job = {"tree": str(tree), "name": name, "threads": threads, "repeats": repeats}
    env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(
        [python, str(Path(__file__).resolve()), "--worker", json.dumps(job)],
        capture_output=True,
        text=True,
        cwd=tree,
        env=env,
        check=False,
    )
    if done.returncode != 0:
        raise SystemExit(f"{name} on {tree} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", metavar="REV", help="the revision to compare against (required; 676c880)")
    parser.add_argument("--after", default=None, metavar="REV", help="default: this checkout, edits included")
    parser.add_argument("--benchmarks", default=",".join(BENCHMARKS), help=f"some of {','.join(BENCHMARKS)}")
    parser.add_argument("--rounds", type=int, default=3, help="fresh subprocesses per revision and benchmark")
    parser.add_argument("--repeats", type=int, default=5, help="timed calls in each subprocess, after one warm-up")
    parser.add_argument("--threads", type=int, default=1, help="torch threads in every worker (default 1)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter of the workers (one venv for both)")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))))
        return
    if args.before is None:
        parser.error("--before REV is required: the revision to compare against")
    names = [name for name in args.benchmarks.split(",") if name]
    unknown = sorted(set(names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"no benchmark {', '.join(unknown)}; they are {', '.join(BENCHMARKS)}")
    revisions = [checkout(args.before), checkout(args.after)]
    print(f"before {revisions[0][0]} ({revisions[0][1]}), after {revisions[1][0]} ({revisions[1][1]})")
    when = time.strftime("%Y-%m-%d %H:%M %Z")
    print(f"{args.rounds} rounds x {args.repeats} timed calls, {args.threads} thread(s), {when}")
    rows = []
    for name in names:
        medians: list[list[float]] = [[], []]
        checks: list[set[float]] = [set(), set()]
        for round_ in range(args.rounds):
            order = (0, 1) if round_ % 2 == 0 else (1, 0)  # take turns: neither always runs first
            for which in order:
                result = measure(revisions[which][1], name, args.threads, args.repeats, args.python)
                medians[which].append(statistics.median(result["times"]))
                checks[which].add(result["check"])
        before, after = (statistics.median(m) for m in medians)
        same = "yes" if checks[0] == checks[1] and len(checks[0]) == 1 else f"no: {checks[0]} vs {checks[1]}"
        rows.append((name, before * 1e3, after * 1e3, after / before, same))
        print(f"  {name}: {before * 1e3:.1f} ms -> {after * 1e3:.1f} ms ({after / before:.3f})", flush=True)
    print()
    print("| benchmark | before ms | after ms | after / before | same numbers |")
    print("|---|---|---|---|---|")
    for name, before, after, ratio, same in rows:
        print(f"| {name} | {before:.1f} | {after:.1f} | {ratio:.3f} | {same} |")


if __name__ == "__main__":
    main()
