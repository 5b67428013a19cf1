"""Tensor and data parallelism on one CPU: memory per rank, forward time and a head sweep, 1 rank vs 2.

    .venv/bin/python benchmarks/distributed.py [--rounds 2] [--repeats 5] [--sections memory,forward,sweep]

Every measurement runs in ranks launched by this script with torchrun (`python -m
torch.distributed.run --standalone --nproc-per-node P benchmarks/distributed.py --worker ...`,
PYTHONPATH = the checkout, gloo on the CPU); each rank writes its figures as JSON to a folder given
on the command line, one file per rank. Launches alternate (P=1, P=2, P=1, P=2, ...), `--rounds` of
each; every figure is the median over launches.

Threads: each rank sets `torch.set_num_threads(max(1, os.cpu_count() // P))` (and OMP_NUM_THREADS
the same), so one rank and two ranks use the same cores: 1 rank x 2 threads vs 2 ranks x 1 thread
on a 2-core machine. Tensor parallelism on one machine therefore buys no speed here; the point of
the memory and forward sections is the memory per rank and that the split model computes the same
logits.

Checkpoints (benchmarks/common.py, random weights): GPT-2-small-shaped float32 (one file), loaded
as float32; Qwen3-MoE-shaped bfloat16 (`QWEN3_SHAPES["moe"]`: 4 layers, 16 experts, top-4, 200 MB
shards with an index file), loaded as bfloat16.

1. memory (both models; `hooked.load(dir, dtype, tp=P)` with P = 1 and 2). Per rank:
   * baseline: VmRSS after `import torch, hooked` and `hooked.distributed.init()` (so the single
     rank pays for its process group too); VmHWM is then reset to it (/proc/self/clear_refs "5",
     Linux >= 4.0), so the import's own peak cannot hide the load's;
   * load growth: VmHWM after the load - baseline; forward growth: VmHWM after one forward of a
     [4, 128] token batch (under torch.no_grad; a tensor-parallel forward runs without gradients
     anyway) - baseline; also the total VmHWM (baseline included) and the bytes of the rank's
     parameters (distinct storages);
   * ratio = (the larger of the two TP=2 ranks) / TP=1. The target, <= 0.6, is judged on the load
     growth; the total VmHWM ratio is printed too (it carries the baseline both pay, ~230 MiB of
     torch, so it is larger) and the forward growth carries the whole [4, 128, vocab] logits every
     rank returns (plus, at TP=2, its shard and the all-gather's buffers). Seen here: GPT-2 at TP=2
     keeps ~40 MiB more than its parameters after the load, freed read buffers that glibc keeps in
     the heap (its dynamic mmap threshold); with MALLOC_MMAP_THRESHOLD_=65536 the growth is 245
     MiB instead of 283 (ratio 0.51 instead of 0.59).
2. forward (the same launches): after that first forward (the warmup), `--repeats` forwards of the
   same batch, each after a barrier; the median of the slower rank; ratio TP=2 / TP=1 (no target:
   on 2 shared cores expect >= 1, the all-reduces and the logits all-gather come on top); the
   fastest forwards' ratio is printed too. Each rank's logits are saved; the parent compares every
   TP=2 rank's with the first TP=1 launch's: max |diff| relative to max |logit| at TP=1 (float32:
   <= 1e-4), with the mean |diff| and the share of positions whose argmax agrees. A bfloat16 model
   is also loaded once as float32 on one rank, and both bfloat16 runs are compared with it: how far
   bfloat16 rounding alone moves the logits. That is the yardstick for bfloat16 (a partial sum
   rounded to bfloat16 on each rank, then added, is not the same rounding as one matmul, and a
   near-tie in the router then picks other experts): TP=2 may be at most 1.1x as far from the
   float32 logits as TP=1.
3. sweep (GPT-2 shape, float32): every head (144 variants) zero-ablated at `blocks.L.attn.hook_z`
   (`ablate.zero(heads=h)`) on 4 prompts x 16 random tokens, metric `metrics.logit_diff` of tokens
   11 vs 13 at the last position; `hooked.load(dir, tp=1)` on 1 rank vs 2 data-parallel ranks
   (`hooked.sweep` deals the variants, sorted by the layer they start at, out to the ranks in turn
   and sums the table back). Per launch: a warmup sweep of 4 variants, a barrier, then
   one timed sweep of all 144 (wall time of the slower rank, and each rank's CPU time, which shows
   how the work was split); ratio 2 ranks / 1 rank (speedup = its inverse). The tables of every
   launch must equal the first 1-rank table (max |diff| <= 1e-5).

Times are wall times on whatever else the machine runs: with 2 threads on 2 cores, another busy
process stalls every multi-threaded op (a 160 ms MoE forward was seen taking 2 s), so the load
average before and after the run is printed; the memory figures do not depend on it.

Results: a summary table (section, model, TP=1, TP=2, ratio, target) after per-rank detail, and
everything (every rank of every launch) in runs/bench-distributed.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SECTIONS = ("memory", "forward", "sweep")
BATCH, POS = 4, 128  # the forward of the memory and forward sections
SWEEP_BATCH, SWEEP_POS = 4, 16
ANSWERS = (11, 13)  # logit[11] - logit[13] at the last position: the sweep's metric
N_LAYERS, N_HEADS = 12, 12  # GPT-2 small
WARMUP_HEADS = [(0, 0), (0, 1), (11, 0), (11, 1)]
MEMORY_TARGET = 0.6
SWEEP_TOLERANCE = 1e-5
TIMEOUT_S = 600  # of every collective and of every launch
OUT_JSON = Path("runs") / "bench-distributed.json"


def model_cases() -> dict[str, dict]:
    """name -> checkpoint directory, the dtype it is loaded in, its logits tolerance vs TP=1 (relative; None:
    judged against the float32 logits instead, see forward_rows)."""
    from common import gpt2_small_checkpoint, qwen3_sharded_checkpoint

    return {
        "GPT-2 small f32": dict(dir=str(gpt2_small_checkpoint()), dtype="float32", tolerance=1e-4),
        "Qwen3-MoE bf16": dict(dir=str(qwen3_sharded_checkpoint("moe")), dtype="bfloat16", tolerance=None),
    }


BF16_SLACK = 1.1  # bfloat16: TP=2's distance from the float32 logits over TP=1's


# ----------------------------------------------------------------------------- the ranks
def _start_rank(ranks: int):
    """Threads, imports, process group; returns (torch, dist, hooked, baseline /proc/self/status)."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))
    import torch.distributed as dist
    from common import proc_status

    import hooked
    import hooked.distributed

    hooked.distributed.init(timeout=TIMEOUT_S)
    dist.barrier()
    return torch, dist, hooked, proc_status()


def model_worker(args) -> dict:
    torch, dist, hooked, baseline = _start_rank(args.ranks)
    from common import proc_status, random_tokens, reset_peak_rss

    reset = reset_peak_rss()
    start = time.perf_counter()
    model = hooked.load(args.dir, dtype=getattr(torch, args.dtype), device="cpu", tp=args.ranks, timeout=TIMEOUT_S)
    load_s = time.perf_counter() - start
    loaded = proc_status()
    storages = {p.untyped_storage().data_ptr(): p.untyped_storage().nbytes() for p in model.parameters()}
    tokens = random_tokens(BATCH, POS, vocab=model.cfg.d_vocab)
    with torch.no_grad():
        logits = model(tokens)  # measured for memory, and the warmup of the timed forwards
        forwarded = proc_status()
        times = []
        for _ in range(args.repeats):
            dist.barrier()
            start = time.perf_counter()
            model(tokens)
            times.append(time.perf_counter() - start)
    torch.save(logits, Path(args.out) / f"logits-rank{dist.get_rank()}.pt")
    return {
        "tp": model.parallel.tp_size,
        "threads": torch.get_num_threads(),
        "peak_reset": reset,
        "baseline_rss": baseline["VmRSS"],
        "load_hwm": loaded["VmHWM"],
        "forward_hwm": forwarded["VmHWM"],
        "load_rss": loaded["VmRSS"],
        "param_bytes": sum(storages.values()),
        "load_s": load_s,
        "forward_s": times,
    }


def sweep_worker(args) -> dict:
    torch, dist, hooked, _ = _start_rank(args.ranks)
    from common import random_tokens

    from hooked import ablate, metrics

    model = hooked.load(args.dir, dtype=torch.float32, device="cpu", tp=1, timeout=TIMEOUT_S)
    tokens = random_tokens(SWEEP_BATCH, SWEEP_POS, vocab=model.cfg.d_vocab)
    metric = metrics.logit_diff(model, [ANSWERS[0]] * SWEEP_BATCH, [ANSWERS[1]] * SWEEP_BATCH)

    def variants(heads):
        return {f"L{layer}H{head}": [(f"blocks.{layer}.attn.hook_z", ablate.zero(heads=head))] for layer, head in heads}

    every_head = [(layer, head) for layer in range(N_LAYERS) for head in range(N_HEADS)]
    hooked.sweep(model, tokens, variants(WARMUP_HEADS), metric, progress=False)
    dist.barrier()
    start, cpu_start = time.perf_counter(), time.process_time()
    result = hooked.sweep(model, tokens, variants(every_head), metric, progress=False)
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return {
        "dp": model.parallel.dp_size,
        "threads": torch.get_num_threads(),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "variants": result.variants,
        "values": result.values.tolist(),
        "base": result.base.tolist(),
    }


def worker(args) -> None:
    result = (model_worker if args.worker == "model" else sweep_worker)(args)
    import torch.distributed as dist

    rank = dist.get_rank()
    Path(args.out, f"rank{rank}.json").write_text(json.dumps(dict(result, rank=rank)))
    dist.barrier()
    dist.destroy_process_group()


# ----------------------------------------------------------------------------- the parent
def launch(kind: str, ranks: int, out: Path, extra: list[str]) -> list[dict]:
    """Run the worker on `ranks` ranks under torchrun; every rank's JSON, in rank order."""
    from common import REPO_ROOT

    out.mkdir(parents=True, exist_ok=True)
    threads = str(max(1, (os.cpu_count() or 1) // ranks))
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(ranks),
        str(Path(__file__).resolve()),
        "--worker",
        kind,
        "--ranks",
        str(ranks),
        "--out",
        str(out),
        *extra,
    ]
    pythonpath = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, PYTHONPATH=pythonpath, OMP_NUM_THREADS=threads)
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise SystemExit(
            f"{kind} on {ranks} rank(s) failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-6000:]}"
        )
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(ranks)]


def compare_logits(references: dict, out: Path, ranks: int) -> dict[str, dict]:
    """Each rank's saved logits against each reference (then deleted): the largest max |diff| over the
    ranks, that over max |reference|, the mean |diff| and the share of positions with the same argmax."""
    import torch

    found = {name: {"max_abs": 0.0, "relative": 0.0, "mean_abs": 0.0, "argmax_agree": 1.0} for name in references}
    for rank in range(ranks):
        path = out / f"logits-rank{rank}.pt"
        logits = torch.load(path).float()
        for name, reference in references.items():
            diff = (logits - reference).abs()
            worst = found[name]
            worst["max_abs"] = max(worst["max_abs"], diff.max().item())
            worst["relative"] = worst["max_abs"] / reference.abs().max().item()
            worst["mean_abs"] = max(worst["mean_abs"], diff.mean().item())
            agree = (logits.argmax(-1) == reference.argmax(-1)).float().mean().item()
            worst["argmax_agree"] = min(worst["argmax_agree"], agree)
        path.unlink()
    return found


def run_models(cases: dict[str, dict], args, scratch: Path) -> dict[str, dict]:
    """The memory and forward sections: alternating launches at P=1 and P=2 of every model. A model
    loaded in a lower precision is also loaded once as float32 on one rank: that run's logits show
    how far rounding alone moves the logits, at TP=1 and at TP=2."""
    import torch

    results = {}
    for index, (name, case) in enumerate(cases.items()):
        runs: dict[int, list] = {1: [], 2: []}
        diffs: dict[int, list] = {1: [], 2: []}
        references = {}
        if case["dtype"] != "float32":
            out = scratch / f"model-{index}-float32"
            launch("model", 1, out, ["--dir", case["dir"], "--dtype", "float32", "--repeats", "0"])
            references["float32"] = torch.load(out / "logits-rank0.pt").float()
        for round_index in range(args.rounds):
            for ranks in (1, 2):
                out = scratch / f"model-{index}-{round_index}-{ranks}"
                start = time.perf_counter()
                ranks_out = launch(
                    "model",
                    ranks,
                    out,
                    ["--dir", case["dir"], "--dtype", case["dtype"], "--repeats", str(args.repeats)],
                )
                if "tp1" not in references:  # the first TP=1 launch
                    references["tp1"] = torch.load(out / "logits-rank0.pt").float()
                diffs[ranks].append(compare_logits(references, out, ranks))
                runs[ranks].append(ranks_out)
                growth = max(r["load_hwm"] - r["baseline_rss"] for r in ranks_out)
                print(
                    f"  {name}, TP={ranks}, round {round_index + 1}: load growth {growth / 2**20:.0f} MiB/rank,"
                    f" forward {median_of(ranks_out, 'forward_s') * 1e3:.0f} ms, launch "
                    f"{time.perf_counter() - start:.1f} s",
                    flush=True,
                )
        results[name] = dict(
            case, runs={str(k): v for k, v in runs.items()}, logits_diff={str(k): v for k, v in diffs.items()}
        )
    return results


def run_sweeps(directory: str, args, scratch: Path) -> dict:
    import torch

    runs: dict[int, list] = {1: [], 2: []}
    for round_index in range(args.rounds):
        for ranks in (1, 2):
            start = time.perf_counter()
            ranks_out = launch("sweep", ranks, scratch / f"sweep-{round_index}-{ranks}", ["--dir", directory])
            runs[ranks].append(ranks_out)
            cpu = ", ".join(f"{r['cpu_seconds']:.1f}" for r in ranks_out)
            print(
                f"  sweep, {ranks} rank(s), round {round_index + 1}: {max(r['seconds'] for r in ranks_out):.1f} s"
                f" (CPU s per rank: {cpu}),"
                f" launch {time.perf_counter() - start:.1f} s",
                flush=True,
            )
    reference = runs[1][0][0]
    worst = 0.0
    for ranks_out in runs[1] + runs[2]:
        for r in ranks_out:
            assert r["variants"] == reference["variants"], "the sweeps' variants differ"
            for key in ("values", "base"):
                worst = max(worst, (torch.tensor(r[key]) - torch.tensor(reference[key])).abs().max().item())
    return {"runs": {str(k): v for k, v in runs.items()}, "max_abs_diff": worst}


# ----------------------------------------------------------------------------- the report
def median_of(ranks_out: list[dict], key: str) -> float:
    """The slower rank's median of a list of times."""
    return max(statistics.median(r[key]) for r in ranks_out)


def over_launches(launches: list[list[dict]], value) -> float:
    """Median over launches of the largest value over a launch's ranks."""
    return statistics.median(max(value(r) for r in ranks_out) for ranks_out in launches)


def memory_rows(name: str, result: dict) -> tuple[list[tuple], list[tuple]]:
    from common import MiB

    runs = result["runs"]
    figures = {
        "load growth MiB": lambda r: r["load_hwm"] - r["baseline_rss"],
        "forward growth MiB": lambda r: r["forward_hwm"] - r["baseline_rss"],
        "load VmHWM MiB (total)": lambda r: r["load_hwm"],
        "forward VmHWM MiB (total)": lambda r: r["forward_hwm"],
        "parameters MiB": lambda r: r["param_bytes"],
    }
    summary = []
    for label, value in figures.items():
        one, two = over_launches(runs["1"], value), over_launches(runs["2"], value)
        met = "ok" if two / one <= MEMORY_TARGET else "NOT MET"
        target = f"<= {MEMORY_TARGET} {met} (judged)" if label == "load growth MiB" else "-"
        summary.append((f"memory: {label}", name, f"{one / MiB:.0f}", f"{two / MiB:.0f}", f"{two / one:.3f}", target))
    detail = []
    for tp in ("1", "2"):
        for rank in range(int(tp)):

            def med(value):
                return statistics.median(value(ranks_out[rank]) for ranks_out in runs[tp]) / MiB

            detail.append(
                (
                    f"{name}, TP={tp}, rank {rank}",
                    f"{med(lambda r: r['baseline_rss']):.0f}",
                    f"{med(lambda r: r['load_rss'] - r['baseline_rss']):.0f}",
                    *(f"{med(value):.0f}" for value in figures.values()),
                    f"{statistics.median(ranks_out[rank]['load_s'] for ranks_out in runs[tp]):.2f}",
                )
            )
    return summary, detail


def forward_rows(name: str, result: dict) -> tuple[list[tuple], list[str]]:
    runs, diffs = result["runs"], result["logits_diff"]
    one = statistics.median(median_of(ranks_out, "forward_s") for ranks_out in runs["1"])
    two = statistics.median(median_of(ranks_out, "forward_s") for ranks_out in runs["2"])

    def worst(tp: str, reference: str) -> dict:
        found = [d[reference] for d in diffs[tp]]
        return {key: (min if key == "argmax_agree" else max)(f[key] for f in found) for key in found[0]}

    tolerance = result["tolerance"]
    tp2 = worst("2", "tp1")
    # float32: TP=2 must equal TP=1 within rounding. bfloat16: splitting rounds partial sums, which can tip
    # router near-ties, so the yardstick is the float32 model: TP=2 may not be further from it than TP=1.
    check = (
        f"<= {tolerance:.0e} {'ok' if tp2['relative'] <= tolerance else 'NOT MET'}"
        if tolerance is not None
        else "see vs float32"
    )
    rows = [
        (
            "forward: [4,128] median ms",
            name,
            f"{one * 1e3:.0f}",
            f"{two * 1e3:.0f}",
            f"{two / one:.2f}",
            "none (2 cores)",
        ),
        (
            "forward: logits max|diff|/max|logit|, vs TP=1",
            name,
            f"{worst('1', 'tp1')['relative']:.1e}",
            f"{tp2['relative']:.1e}",
            "-",
            check,
        ),
    ]
    fastest = [
        statistics.median(max(min(r["forward_s"]) for r in ranks_out) for ranks_out in runs[tp]) for tp in ("1", "2")
    ]
    notes = [
        f"{name}, fastest forwards (median over launches): TP=1 {fastest[0] * 1e3:.0f} ms, TP=2 "
        f"{fastest[1] * 1e3:.0f} ms,"
        f" ratio {fastest[1] / fastest[0]:.2f}",
        f"{name}, TP=2 vs TP=1 logits: max |diff| {tp2['max_abs']:.3g}, mean |diff| {tp2['mean_abs']:.3g},"
        f" argmax agrees at {tp2['argmax_agree']:.1%} of positions",
    ]
    if "float32" in diffs["1"][0]:
        one_f, two_f = worst("1", "float32"), worst("2", "float32")
        ratio = two_f["relative"] / one_f["relative"]
        rows.append(
            (
                "forward: logits max|diff|/max|logit|, vs float32 TP=1",
                name,
                f"{one_f['relative']:.1e}",
                f"{two_f['relative']:.1e}",
                f"{ratio:.2f}",
                f"<= {BF16_SLACK} {'ok' if ratio <= BF16_SLACK else 'NOT MET'}",
            )
        )
        for tp, found in (("1", one_f), ("2", two_f)):
            notes.append(
                f"{name}, TP={tp} vs the float32 load at TP=1: max |diff| {found['max_abs']:.3g}, mean |diff|"
                f" {found['mean_abs']:.3g}, argmax agrees at {found['argmax_agree']:.1%} of positions"
            )
    return rows, notes


def sweep_rows(result: dict) -> list[tuple]:
    one = statistics.median(max(r["seconds"] for r in ranks_out) for ranks_out in result["runs"]["1"])
    two = statistics.median(max(r["seconds"] for r in ranks_out) for ranks_out in result["runs"]["2"])
    diff = result["max_abs_diff"]
    return [
        (
            "sweep: 144 heads, 4x16, wall s",
            "GPT-2 small f32",
            f"{one:.2f}",
            f"{two:.2f}",
            f"{two / one:.2f}",
            f"speedup {one / two:.2f}x",
        ),
        (
            "sweep: table max|diff| vs 1 rank",
            "GPT-2 small f32",
            "0",
            f"{diff:.1e}",
            "-",
            f"<= {SWEEP_TOLERANCE:.0e} {'ok' if diff <= SWEEP_TOLERANCE else 'FAILED'}",
        ),
    ]


def sweep_split(result: dict) -> str:
    """How the variants fell on the two ranks, measured (CPU time) and modelled (layers run)."""
    cpu = [statistics.median(ranks_out[rank]["cpu_seconds"] for ranks_out in result["runs"]["2"]) for rank in range(2)]
    one_cpu = statistics.median(ranks_out[0]["cpu_seconds"] for ranks_out in result["runs"]["1"])
    # A variant ablating a head of layer L re-runs blocks L..11; sorted by layer, they are dealt out in turn.
    cost = [(N_LAYERS - layer) for layer in range(N_LAYERS) for _ in range(N_HEADS)]
    shares = [sum(cost[0::2]), sum(cost[1::2])]
    return (
        f"sweep split over 2 ranks: CPU s per rank {cpu[0]:.1f} / {cpu[1]:.1f} (1 rank: {one_cpu:.1f});"
        f" work model (blocks re-run per variant, dealt out in turn): {shares[0]} / {shares[1]} blocks,"
        f" the busier rank has {max(shares) / sum(shares):.0%} of the work"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="launches of each of P=1 and P=2, alternating")
    parser.add_argument("--repeats", type=int, default=5, help="timed forwards per launch (after 1 warmup)")
    parser.add_argument("--sections", default=",".join(SECTIONS))
    parser.add_argument("--worker", choices=("model", "sweep"), help=argparse.SUPPRESS)
    parser.add_argument("--ranks", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--dir", help=argparse.SUPPRESS)
    parser.add_argument("--dtype", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    sections = args.sections.split(",")
    unknown = set(sections) - set(SECTIONS)
    if unknown:
        parser.error(f"unknown sections {sorted(unknown)}; choose from {', '.join(SECTIONS)}")

    from common import REPO_ROOT, environment, gpt2_small_checkpoint, table

    began, load_before = time.perf_counter(), os.getloadavg()
    cases = model_cases() if {"memory", "forward"} & set(sections) else {}
    print(environment())
    print(
        f"cpus {os.cpu_count()}: 1 rank x {os.cpu_count()} threads vs 2 ranks x {max(1, os.cpu_count() // 2)} "
        "thread(s);"
        f" {args.rounds} launches of each, alternating\n",
        flush=True,
    )
    scratch = Path(tempfile.mkdtemp(prefix="hooked-bench-distributed-"))
    try:
        models = run_models(cases, args, scratch) if cases else {}
        sweep = run_sweeps(str(gpt2_small_checkpoint()), args, scratch) if "sweep" in sections else None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    rows, detail = [], []
    for name, result in models.items():
        summary, per_rank = memory_rows(name, result)
        if "memory" in sections:
            rows += summary
            detail += per_rank
    notes = []
    for name, result in models.items():
        if "forward" in sections:
            forward, more = forward_rows(name, result)
            rows += forward
            notes += more
    if sweep is not None:
        rows += sweep_rows(sweep)
    if detail:
        print()
        print(
            table(
                [
                    "",
                    "baseline",
                    "held after load",
                    "load growth",
                    "forward growth",
                    "load VmHWM",
                    "forward VmHWM",
                    "parameters",
                    "load s",
                ],
                detail,
                title="per rank, MiB, medians over launches (growth = VmHWM - baseline VmRSS; held = VmRSS after the "
                "load - baseline)",
            )
        )
    print()
    print(
        table(
            ["section", "model", "TP=1 / 1 rank", "TP=2 / 2 ranks", "ratio", "target"],
            rows,
            title=f"Summary (medians over {args.rounds} launches of each; a TP=2 figure is its larger rank's;"
            " the sweep rows are tp=1 on 1 vs 2 data-parallel ranks)",
        )
    )
    if sweep is not None:
        notes.append(sweep_split(sweep))
    if notes:
        print("\n".join(notes))
    seconds = time.perf_counter() - began
    load = {"before": load_before, "after": os.getloadavg()}
    print(
        f"\nwall time {seconds:.0f} s; load average (1, 5, 15 min) before "
        f"{', '.join(f'{x:.2f}' for x in load['before'])},"
        f" after {', '.join(f'{x:.2f}' for x in load['after'])} (before: other jobs; this run alone keeps it near 2)"
    )

    out = REPO_ROOT / OUT_JSON
    out.parent.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "environment": environment(),
                "args": vars(args),
                "wall_s": seconds,
                "load_average": load,
                "summary": rows,
                "models": models,
                "sweep": sweep,
            },
            indent=1,
        )
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
