"""Ablation sweeps: `hooked.sweep` vs a `run_with_hooks` loop, transformers hooks, nnsight and TransformerLens.

    make bench-sweep      # a venv with the `bench` extra (nnsight, TransformerLens), then this script, ~6 min quiet
    .venv/bin/python benchmarks/sweep.py [--repeats 2] [--peer-repeats 1] [--sections heads,mlps,neurons]
    .venv/bin/python benchmarks/sweep.py --layers 0,11 --neurons 16 --neuron-sample 4   # a quick check
    .venv/bin/python benchmarks/sweep.py --profile     # where one head sweep spends its time, then exit

GPT-2-small shape (benchmarks/common.py, random weights), float32, CPU, 8 prompts of 15 random
tokens; metric = logit[A] - logit[B] at the last position (A, B = `ANSWERS`), one value per prompt.

1. heads: the clean run and every head zero-ablated at `blocks.L.attn.hook_z`, 145 x 8 values, by
   * loop: `model.run_with_hooks(tokens, fwd_hooks=[(name, ablate.zero(heads=h))])` 145 times, the
     metric on the full logits; the baseline of every ratio;
   * sweep: `hooked.sweep(model, tokens, {"L0H0": ablate.hooks(model, "L0H0", "zero"), ...}, metric)`;
   * transformers: `GPT2LMHeadModel` (its default attention), a forward pre-hook on
     `transformer.h[l].attn.c_proj` zeroing head h's 64 columns of its input, 145 forwards;
   * nnsight 0.8.1: one `model.trace()` with 145 `tracer.invoke(tokens)` blocks, each zeroing
     `model.transformer.h[l].attn.c_proj.input[:, :, h*64:(h+1)*64]` and saving the two logits;
   * TransformerLens 3.9: the same loop as the first with `HookedTransformer.run_with_hooks`, hook_z.
2. mlps: the clean run and every MLP zeroed at `blocks.L.hook_mlp_out` (13 x 8): loop vs sweep.
3. neurons: the clean run and each of the 3,072 neurons of `blocks.6.mlp.hook_post` zeroed: sweep vs
   loop. Neither runs all 3,072 by default: the loop runs `--neuron-sample` (64) evenly spaced
   neurons plus the clean run, the sweep `--neurons` (512), and both times are scaled to 3,073
   variants (each is linear in them: the sweep's chunks all start at the same stage and hold the
   same rows). `--neurons 3072` runs the whole sweep (6x longer), which also shows that its peak
   does not grow with the number of variants.

Every method runs in a fresh subprocess (`--python`; the peers with `--peer-python`) that loads its
model, warms up with one forward, then times one run, so no figure includes another method's heap.
Rounds are interleaved (loop, sweep, transformers, nnsight, TransformerLens, then again); the table
gives the median over rounds, the ratio of the fastest runs, and the worker's CPU time (user +
system), which a busy machine inflates less than wall time. Peak memory is the worker's VmHWM during
the run (reset through /proc/self/clear_refs just before it), so it counts the loaded weights too;
"extra" is that peak minus the RSS just before the run. Peaks are the lowest over rounds: in some
runs and not others glibc leaves freed logits buffers in the heap (the loop's RSS was seen to climb
in 23 MiB steps, one [8 15 50257] float32 buffer each, to +350 MiB; with the dynamic mmap threshold
fixed, MALLOC_MMAP_THRESHOLD_=16777216, it stays within 80 MiB), which measures the allocator's luck
rather than what a method keeps alive. Every method's values are compared with the loop's (max abs
difference): a benchmark of a wrong answer is worthless. `--layers` keeps the heads and MLPs of
some layers only.

transformers 5 checkpoints have no `n_ctx` in config.json, which TransformerLens 3.9 reads, and
`HookedTransformer.from_pretrained` accepts hub names only; the worker therefore copies config.json
with `n_ctx` added to a temporary folder and runs what `from_pretrained` runs (`loading.
get_pretrained_model_config` on that folder, `get_pretrained_state_dict` from the transformers
model) without weight processing: TransformerLens' default `fold_value_biases=True` moves v's bias
into b_O, after which zeroing hook_z no longer zeroes the head's output (a different ablation).
nnsight's `TransformersModel` wants a tokenizer even for token ids; the worker gives it a tiny
byte-level one (`hooked.testing.build_tokenizer`) that never runs. Both run offline (HF_HUB_OFFLINE=1).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
from common import MiB, environment, gpt2_small_checkpoint, proc_status, random_tokens, reset_peak_rss, table

BATCH, POS = 8, 15
ANSWERS = (11, 13)  # token ids A and B of the metric logit[A] - logit[B]
N_LAYERS, N_HEADS, D_HEAD, D_MLP = 12, 12, 64, 3072
NEURON_LAYER = 6
SECTIONS = {
    "heads": ("loop", "sweep", "transformers", "nnsight", "transformer_lens"),
    "mlps": ("loop", "sweep"),
    "neurons": ("loop", "sweep"),
}
PEERS = {"transformers", "nnsight", "transformer_lens"}
INSTALL = {
    "nnsight": "pip install nnsight==0.8.1, or `make bench-sweep`",
    "transformer_lens": "pip install transformer-lens==3.9.0, or `make bench-sweep`",
}


def heads_of(layers) -> list[tuple[int, int]]:
    return [(layer, head) for layer in layers for head in range(N_HEADS)]


# ----------------------------------------------------------------------------- the worker
class Missing(Exception):
    """A peer library is not installed in the worker's interpreter."""


def hooked_model():
    import hooked

    return hooked.load(gpt2_small_checkpoint(), dtype=torch.float32, device="cpu")


def hooked_metric(model):
    from hooked import metrics

    return metrics.logit_diff(model, [ANSWERS[0]] * BATCH, [ANSWERS[1]] * BATCH)


def logit_diff(logits: torch.Tensor) -> torch.Tensor:
    return (logits[:, -1, ANSWERS[0]] - logits[:, -1, ANSWERS[1]]).float()


def neuron_sample(count: int) -> list[int]:
    return sorted({round(i * (D_MLP - 1) / max(count - 1, 1)) for i in range(count)})


def prepare(section: str, method: str, args) -> tuple[Callable, Callable]:
    """Load the method's model; return (a warm-up callable, the run: () -> (labels, values [variant prompt]))."""
    tokens = random_tokens(BATCH, POS)
    heads = heads_of(args.layers)
    if method in ("loop", "sweep"):
        import hooked
        from hooked import ablate

        model = hooked_model()
        metric = hooked_metric(model)
        if section == "heads":
            labels = [f"L{layer}H{head}" for layer, head in heads]
            single = [(f"blocks.{layer}.attn.hook_z", lambda h=head: ablate.zero(heads=h)) for layer, head in heads]
        elif section == "mlps":
            labels = [f"L{layer}.mlp" for layer in args.layers]
            single = [(f"blocks.{layer}.hook_mlp_out", lambda: ablate.zero()) for layer in args.layers]
        else:
            neurons = neuron_sample(args.neurons if method == "sweep" else args.neuron_sample)
            labels = [f"L{NEURON_LAYER}.N{n}" for n in neurons]
            single = [(f"blocks.{NEURON_LAYER}.mlp.hook_post", lambda n=n: ablate.zero(neurons=n)) for n in neurons]

        if method == "loop":

            def run():
                values = [metric(model(tokens))]
                for name, make in single:
                    values.append(metric(model.run_with_hooks(tokens, fwd_hooks=[(name, make())])))
                return ["clean", *labels], torch.stack(values)
        else:

            def run():
                variants = {label: ablate.hooks(model, label, "zero") for label in labels}
                result = hooked.sweep(model, tokens, variants, metric, progress=False)
                return ["clean", *result.variants], torch.cat([result.base[None], result.values])

        return lambda: model(tokens), run

    import transformers
    from common import quiet_transformers

    quiet_transformers()
    checkpoint = gpt2_small_checkpoint()
    if method == "transformers":
        model = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()

        def zero_head(head):
            def pre_hook(module, inputs):  # c_proj's input: [batch pos n_heads*d_head], heads side by side
                inputs[0][..., head * D_HEAD : (head + 1) * D_HEAD] = 0

            return pre_hook

        def run():
            values = [logit_diff(model(tokens, use_cache=False).logits)]
            for layer, head in heads:
                handle = model.transformer.h[layer].attn.c_proj.register_forward_pre_hook(zero_head(head))
                try:
                    values.append(logit_diff(model(tokens, use_cache=False).logits))
                finally:
                    handle.remove()
            return ["clean", *(f"L{layer}H{head}" for layer, head in heads)], torch.stack(values)

        return lambda: model(tokens, use_cache=False), run

    if method == "nnsight":
        try:
            import nnsight
            from nnsight import TransformersModel
        except ImportError as error:
            raise Missing(str(error)) from error
        from hooked.testing import build_tokenizer

        folder = Path(tempfile.mkdtemp())
        build_tokenizer(folder)  # the pipeline insists on a tokenizer; token ids never reach it
        tokenizer = transformers.PreTrainedTokenizerFast(
            tokenizer_file=str(folder / "tokenizer.json"), eos_token="<|endoftext|>"
        )
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()
        model = TransformersModel(hf_model, tokenizer=tokenizer)
        a, b = ANSWERS

        def run():
            with model.trace() as tracer:
                values = nnsight.save([])
                with tracer.invoke(tokens):
                    logits = model.lm_head.output
                    values.append(logits[:, -1, a] - logits[:, -1, b])
                for layer, head in heads:
                    with tracer.invoke(tokens):
                        model.transformer.h[layer].attn.c_proj.input[:, :, head * D_HEAD : (head + 1) * D_HEAD] = 0
                        logits = model.lm_head.output
                        values.append(logits[:, -1, a] - logits[:, -1, b])
            return ["clean", *(f"L{layer}H{head}" for layer, head in heads)], torch.stack([v.float() for v in values])

        def warmup():
            with model.trace(tokens):
                model.lm_head.output.save()

        return warmup, run

    if method == "transformer_lens":
        try:
            import transformer_lens
            import transformer_lens.loading_from_pretrained as loading
        except ImportError as error:
            raise Missing(str(error)) from error
        hf_model = transformers.GPT2LMHeadModel.from_pretrained(checkpoint).eval()
        folder = Path(tempfile.mkdtemp())
        config = json.loads((checkpoint / "config.json").read_text())
        config["n_ctx"] = config["n_positions"]  # transformers 5 dropped it; TransformerLens 3.9 reads it
        (folder / "config.json").write_text(json.dumps(config))
        cfg = loading.get_pretrained_model_config(
            str(folder), hf_cfg=hf_model.config.to_dict(), fold_ln=False, device="cpu", dtype=torch.float32
        )
        state_dict = loading.get_pretrained_state_dict(str(folder), cfg, hf_model, dtype=torch.float32)
        model = transformer_lens.HookedTransformer(cfg, tokenizer=None, move_to_device=False)
        model.load_and_process_state_dict(
            state_dict, fold_ln=False, center_writing_weights=False, center_unembed=False, fold_value_biases=False
        )
        model.eval()
        del hf_model, state_dict

        def zero_head(head):
            def hook(z, hook):  # [batch pos head_index d_head]
                z[:, :, head] = 0
                return z

            return hook

        def run():
            values = [logit_diff(model(tokens))]
            for layer, head in heads:
                logits = model.run_with_hooks(tokens, fwd_hooks=[(f"blocks.{layer}.attn.hook_z", zero_head(head))])
                values.append(logit_diff(logits))
            return ["clean", *(f"L{layer}H{head}" for layer, head in heads)], torch.stack(values)

        return lambda: model(tokens), run

    raise ValueError(f"unknown method {method!r}")


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("torch", "transformers", "nnsight", "transformer-lens"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            pass
    return found


def worker(args) -> None:
    section, method = args.worker.split(":")
    warnings.filterwarnings("ignore")
    try:
        warm, run = prepare(section, method, args)
    except Missing as error:
        Path(args.out).write_text(json.dumps({"missing": str(error)}))
        return
    with torch.no_grad():
        warm()
        gc.collect()
        before = proc_status().get("VmRSS", 0)
        reset = reset_peak_rss()
        start, cpu_start = time.perf_counter(), time.process_time()
        labels, values = run()
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
        peak = proc_status().get("VmHWM", 0)
    Path(args.out).write_text(
        json.dumps(
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "labels": labels,
                "values": values.tolist(),
                "rss_before": before,
                "peak": peak,
                "peak_reset": reset,
                "versions": versions(),
            }
        )
    )


# ----------------------------------------------------------------------------- the driver
def spawn(section: str, method: str, args) -> dict:
    python = args.peer_python if method in PEERS else args.python
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as file:
        out = file.name
    command = [
        python,
        __file__,
        "--worker",
        f"{section}:{method}",
        "--out",
        out,
        "--neuron-sample",
        str(args.neuron_sample),
        "--neurons",
        str(args.neurons),
        "--layers",
        ",".join(map(str, args.layers)),
    ]
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    completed = subprocess.run(command, env=env, capture_output=True, text=True)
    try:
        if completed.returncode != 0:
            tail = "\n".join((completed.stderr or completed.stdout).strip().splitlines()[-6:])
            return {"error": f"exit {completed.returncode}:\n{tail}"}
        return json.loads(Path(out).read_text())
    finally:
        Path(out).unlink(missing_ok=True)


def run_section(section: str, args) -> dict[str, dict]:
    """Interleaved rounds of fresh workers; per method the runs, the first run's values and any failure."""
    methods = list(SECTIONS[section])
    if not args.peers:
        methods = [m for m in methods if m not in PEERS]
    results: dict[str, dict] = {m: {"runs": []} for m in methods}
    rounds = max(args.repeats, args.peer_repeats, args.neuron_repeats)
    for round_index in range(rounds):
        for method in methods:
            state = results[method]
            wanted = (
                args.peer_repeats if method in PEERS else args.neuron_repeats if section == "neurons" else args.repeats
            )
            if "missing" in state or "error" in state or round_index >= wanted:
                continue
            out = spawn(section, method, args)
            if "missing" in out or "error" in out:
                state.update(out)
                print(
                    f"  {section} {method}: {out.get('error') or 'not installed (' + INSTALL[method] + ')'}", flush=True
                )
                continue
            state["runs"].append(out)
            state.setdefault("values", torch.tensor(out["values"]))
            state.setdefault("labels", out["labels"])
            print(
                f"  {section} {method}: round {round_index + 1}, {out['seconds']:.1f} s, peak {out['peak'] / MiB:.0f} "
                "MiB",
                flush=True,
            )
    return results


def summarise(section: str, results: dict[str, dict]) -> list[tuple]:
    loop = results["loop"]
    if not loop["runs"]:
        return []
    full = D_MLP + 1  # variants of the full neuron sweep, the clean run included

    def seconds(method: str, key: str = "seconds", pick=statistics.median) -> float:
        """Over the method's runs; in the neuron section scaled to all 3,072 neurons (both methods are linear
        in them)."""
        value = pick(r[key] for r in results[method]["runs"])
        ran = len(results[method]["labels"])
        return value * full / ran if section == "neurons" and ran < full else value

    loop_peak = min(r["peak"] for r in loop["runs"])
    by_label = dict(zip(loop["labels"], loop["values"], strict=True))
    rows = []
    for method, state in results.items():
        name = f"{section}: {method}"
        if not state["runs"]:
            rows.append((name, "not installed" if "missing" in state else "failed", *[""] * 10))
            continue
        if section == "neurons" and len(state["labels"]) < full:
            name += f" ({len(state['labels']) - 1} of {D_MLP} run, x {full / len(state['labels']):.1f})"
        peak = min(r["peak"] for r in state["runs"])
        extra = min(r["peak"] - r["rss_before"] for r in state["runs"])
        index = {label: i for i, label in enumerate(state["labels"])}
        diff = max(
            (state["values"][index[label]] - by_label[label]).abs().max().item()
            for label in state["labels"]
            if label in by_label
        )
        rows.append(
            (
                name,
                len(state["runs"]),
                f"{seconds(method):.1f}",
                f"{seconds('loop') / seconds(method):.2f}",
                f"{seconds('loop', pick=min) / seconds(method, pick=min):.2f}",
                f"{seconds(method, 'cpu_seconds'):.1f}",
                f"{seconds('loop', 'cpu_seconds') / seconds(method, 'cpu_seconds'):.2f}",
                f"{peak / MiB:.0f}",
                f"{peak / loop_peak:.2f}",
                f"{extra / MiB:.0f}",
                f"{diff:.1e}",
            )
        )
    return rows


def work_model(layers) -> str:
    """FLOPs of the head sweep relative to the loop, from the row-stages each computes (a model, not a measurement)."""
    d_model, vocab = 768, 50257
    per_token_block = 2 * (4 * d_model * d_model + 2 * d_model * D_MLP)  # qkv+out, mlp in+out (multiply-adds x2)
    tokens = BATCH * POS
    block_flops = N_LAYERS * per_token_block * tokens
    unembed = 2 * d_model * vocab * tokens
    heads = heads_of(layers)
    loop = (1 + len(heads)) * (block_flops + unembed)
    # The base run computes every block; a variant ablating layer L joins at block L (its attention half).
    # Both read only 2 logits at the last position.
    sweep = block_flops + sum((N_LAYERS - layer) * per_token_block * tokens for layer, _ in heads)
    return (
        f"work model of the head section (matmul FLOPs; attention scores, norms and GELU left out): the loop"
        f" {loop / 1e12:.2f} TFLOP ({(1 + len(heads)) * unembed / loop:.0%} of it the unembedding), the sweep"
        f" {sweep / 1e12:.2f} TFLOP, {loop / sweep:.2f}x less; a larger speed-up comes from larger matmuls"
    )


def profile(args) -> None:
    """cProfile and torch.profiler on one head sweep, in this process."""
    import cProfile
    import pstats

    import hooked
    from hooked import ablate

    model = hooked_model()
    metric = hooked_metric(model)
    tokens = random_tokens(BATCH, POS)
    labels = [f"L{layer}H{head}" for layer, head in heads_of(range(N_LAYERS))]

    def once():
        variants = {label: ablate.hooks(model, label, "zero") for label in labels}
        return hooked.sweep(model, tokens, variants, metric, progress=False)

    with torch.no_grad():
        model(tokens)
    once()
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.runcall(once)
    print(f"one head sweep under cProfile: {time.perf_counter() - start:.1f} s\n")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(18)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=False) as prof:
        once()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2, help="rounds of hooked's loop and sweep (and transformers)")
    parser.add_argument("--peer-repeats", type=int, default=1, help="rounds of nnsight and TransformerLens")
    parser.add_argument("--sections", default="heads,mlps,neurons")
    parser.add_argument(
        "--layers",
        default=",".join(map(str, range(N_LAYERS))),
        help="the heads and MLPs of these layers only (e.g. 0,11 for a quick check)",
    )
    parser.add_argument(
        "--neurons", type=int, default=512, help="neurons the sweep runs in the neuron section (all: 3072)"
    )
    parser.add_argument("--neuron-sample", type=int, default=64, help="neurons the loop runs in the neuron section")
    parser.add_argument("--neuron-repeats", type=int, default=2, help="rounds of the neuron section")
    parser.add_argument("--python", default=sys.executable, help="interpreter of the hooked workers")
    parser.add_argument("--peer-python", default=None, help="interpreter of the peer workers (default: --python)")
    parser.add_argument("--no-peers", dest="peers", action="store_false", help="hooked's loop and sweep only")
    parser.add_argument("--profile", action="store_true", help="profile one head sweep in this process and exit")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.peer_python = args.peer_python or args.python
    args.layers = [int(layer) for layer in args.layers.split(",")]
    if args.worker:
        return worker(args)
    if args.profile:
        return profile(args)

    gpt2_small_checkpoint()  # built once, before any worker needs it
    print(environment())
    print(
        f"GPT-2 small shape, random weights, float32, CPU; {BATCH} prompts x {POS} tokens; metric logit[{ANSWERS[0]}]"
        f" - logit[{ANSWERS[1]}] at the last position; every method in a fresh process, rounds interleaved\n"
    )
    rows = []
    summaries = {}
    for section in args.sections.split(","):
        print(f"{section}:", flush=True)
        results = run_section(section, args)
        summaries[section] = results
        rows += summarise(section, results)
    for section, results in summaries.items():
        peers = {m: s["runs"][0]["versions"] for m, s in results.items() if s["runs"] and m in PEERS}
        if peers:
            print(f"\n{section} peer versions: " + "; ".join(f"{m}: {v}" for m, v in peers.items()))
    print()
    print(
        table(
            [
                "method",
                "runs",
                "seconds",
                "x faster than loop",
                "same, of mins",
                "CPU s",
                "x less CPU",
                "peak MiB",
                "peak / loop's",
                "extra MiB",
                "max |diff| vs loop",
            ],
            rows,
            title="Summary (times: medians over runs, 'of mins' the ratio of the fastest runs, CPU s the worker's"
            " user+system time; peak: the lowest over runs, extra: peak minus the RSS before the run)",
        )
    )
    print()
    if "heads" in summaries:
        print(work_model(args.layers))
    print(targets(summaries))


def targets(summaries: dict) -> str:
    lines = [
        "",
        "targets: head sweep >= 3x faster than the loop and >= 4x faster than nnsight; sweep peak <= 1.5x the loop's",
    ]
    heads = summaries.get("heads")

    def ratio(results, slower, faster, key="seconds", pick=statistics.median):
        return pick(r[key] for r in results[slower]["runs"]) / pick(r[key] for r in results[faster]["runs"])

    if heads and heads["sweep"]["runs"]:
        for peer, label in (("loop", "the run_with_hooks loop"), ("nnsight", "nnsight's trace")):
            if heads.get(peer, {}).get("runs"):
                lines.append(
                    f"  heads: sweep vs {label}: {ratio(heads, peer, 'sweep'):.2f}x faster (medians),"
                    f" {ratio(heads, peer, 'sweep', pick=min):.2f}x (fastest runs),"
                    f" {ratio(heads, peer, 'sweep', 'cpu_seconds'):.2f}x less CPU time"
                )
            else:
                lines.append(f"  heads: {peer} not measured")
    for section, results in summaries.items():
        if results["sweep"]["runs"] and results["loop"]["runs"]:
            lines.append(
                f"  {section}: sweep peak / loop peak = {1 / ratio(results, 'loop', 'sweep', 'peak', pick=min):.2f}"
            )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
