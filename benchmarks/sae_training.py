"""Training throughput (tokens/s) and peak memory of `hooked.sae.train` vs SAELens 6.54's trainer and eai-sparsify's.

    .venv/bin/python benchmarks/sae_training.py [--steps 50] [--rounds 3] [--d-sae 2048] [--k 32] [--layer 2]
                                                [--threads N]

One TopK SAE on the bundled IOI GPT-2 (hooked/ioi-gpt2: 4 layers, d_model 128, context 64), same for all three:
hook point (`blocks.2.hook_resid_post`, eai-sparsify's `h.2`, the same residual stream; `--layer`), width, k,
batches of 4096 tokens (64 rows of 64), Adam at one learning rate, float32, CPU, the same token rows (IOI prompts,
joined and cut by `hooked.sae.training.token_rows`), `--steps` steps each. No checkpoints, no logging; nothing
makes dead features within so few steps, so no library computes AuxK.

* hooked: `hooked.sae.train(model, rows, ...)` with an 8-batch shuffle buffer.
* SAELens: `LanguageModelSAETrainingRunner(cfg, override_model=..., override_dataset=...).run()` on TransformerLens
  3.9's HookedTransformer with the same weights (`common.transformer_lens_gpt2`), `TopKTrainingSAEConfig` at its
  defaults, its activation store with 64-row forward batches and the same 8 x 4096 tokens in its mixing buffer
  (SAELens 6.54's `activations_store.py` sizes it n_batches_in_buffer x context_size tokens, so 512).
* eai-sparsify: `Trainer(TrainConfig(SaeConfig(num_latents, k), optimizer="adam", ...), dataset, model).fit()` on
  transformers' GPT2Model with the same weights; its Triton decoder is for GPUs, so SPARSIFY_DISABLE_TRITON=1 gives
  its eager (embedding_bag) one. It runs the whole model (a forward hook cannot stop it); the other two stop after
  the block they read (`stop_at_layer`): `--layer 3`, the last block, takes that difference away.

Training quality (`--quality`): hooked and SAELens only, each trained on the same tokens once per seed (`--seeds`,
0 1 2): TopK d_sae 256, k 8, 512 tokens a step (`--batch-tokens`), Adam lr 3e-3, 200,704 tokens (3,136 rows of 64)
of IOI sentences (each prompt followed by its answer, clean and corrupt: the text the model was trained on, joined
and cut as above), both libraries' dead-feature window at their default 1000 steps. Both dictionaries then go
through the same `hooked.sae.evaluate` on held-out sentences (`tasks.ioi(300, seed=EVAL_SEED)`, each prompt alone,
left-padded with its attention mask): FVU, loss recovered (spliced cross-entropy against clean and zero-ablated),
dead features (active on no held-out token). SAELens' run is seeded by `torch.manual_seed(seed)` (its
initialisation and its mixing buffer's permutations draw from torch's global generator). `--ablations` adds hooked
with each of its training changes taken back (`--variant`: no gradient clip, b_dec at the mean, both), to say what
each bought.

    .venv/bin/python benchmarks/sae_training.py --quality --ablations --threads 1

Each run is a fresh subprocess (`--worker <library>`), the libraries taking turns, `--rounds` times; the table gives
the median. Timed: the training call alone (model, data and imports ready; a throwaway Adam has imported what
torch.optim imports on first use), in wall time and in the process's CPU time (on a shared machine, run with
`--threads 1` and read tokens/CPU-s: another job holding a core does not change it). Memory: the peak of the
resident set during that call above what it was just before (VmHWM, reset first through /proc/self/clear_refs),
which counts the dictionary, its optimiser state, the activation buffers and each step's temporaries. Threads:
torch's default unless `--threads`.
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
from pathlib import Path

import torch
from common import BENCH_DIR, MiB, environment, proc_status, quiet_transformers, reset_peak_rss, table

import hooked
import hooked.sae

LIBRARIES = ("hooked", "saelens", "sparsify")


def hook_names(layer: int) -> tuple[str, str]:
    """hooked's (and TransformerLens') name of the residual stream after block `layer`, and eai-sparsify's: the
    output of transformers' GPT2Model.h[layer]."""
    return f"blocks.{layer}.hook_resid_post", f"h.{layer}"


CONTEXT = 64
BATCH_TOKENS = 4096
LR = 5e-4
# --quality: the issue's setting (TopK, 256 features, k 8, ~200k tokens), at the bundled dictionaries' batch and lr
QUALITY = {"d_sae": 256, "k": 8, "rows": 3136, "batch_tokens": 512, "lr": 3e-3}
EVAL_SEED = 2029  # tasks.ioi seed of the held-out sentences (scripts/train_saes.py's)
# hooked with its training changes taken back, by patching hooked.sae.training's modules (--variant)
VARIANTS = ("default", "no-clip", "mean-b_dec", "before")


def bundled_dir() -> Path:
    from hooked.weights.sources import bundled_models

    return bundled_models()["hooked/ioi-gpt2"]


def token_rows(n_rows: int) -> torch.Tensor:
    """[n_rows CONTEXT] token ids of IOI prompts, cached under BENCH_DIR for the workers."""
    path = BENCH_DIR / f"sae-training-rows-{n_rows}.pt"
    if path.exists():
        return torch.load(path)
    from hooked.interventions import tasks
    from hooked.sae.training import token_rows as rows_of

    model = hooked.load("hooked/ioi-gpt2")
    texts = tasks.ioi(n_rows * CONTEXT // 12 + 100, seed=0).clean
    rows = torch.cat(list(rows_of(model, texts, CONTEXT, True).batches(256, repeat=False)))[:n_rows]
    if len(rows) < n_rows:
        raise RuntimeError(f"only {len(rows)} rows of IOI prompts; ask for fewer steps")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rows, path)
    return rows


def sentences(task) -> list[str]:
    """Each clean prompt followed by its answer, and each corrupt one by its own: the sentences the model learnt."""
    pairs = zip(task.clean, task.correct, task.corrupt, task.incorrect, strict=True)
    return [text for clean, correct, corrupt, incorrect in pairs for text in (clean + correct, corrupt + incorrect)]


def sentence_rows(n_rows: int) -> torch.Tensor:
    """[n_rows CONTEXT] token ids of IOI sentences (tasks.ioi seed 0), joined and cut, cached under BENCH_DIR."""
    path = BENCH_DIR / f"sae-training-sentences-{n_rows}.pt"
    if path.exists():
        return torch.load(path)
    from hooked.interventions import tasks
    from hooked.sae.training import token_rows as rows_of

    model = hooked.load("hooked/ioi-gpt2")
    texts = sentences(tasks.ioi(n_rows * CONTEXT // 28 + 100, seed=0))
    rows = torch.cat(list(rows_of(model, texts, CONTEXT, True).batches(256, repeat=False)))[:n_rows]
    if len(rows) < n_rows:
        raise RuntimeError(f"only {len(rows)} rows of IOI sentences")
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(rows, path)
    return rows


def held_out_quality(model, dictionary) -> dict:
    """hooked.sae.evaluate's FVU, loss recovered, dead features and L0 on held-out sentences, each run alone."""
    from hooked.interventions import tasks

    tokens, mask = model.tokens_and_mask(sentences(tasks.ioi(300, seed=EVAL_SEED)), None, None)
    row = hooked.sae.evaluate(model, [dictionary], tokens, attention_mask=mask)[0]
    return {key: float(row[key]) for key in ("fvu", "loss_recovered", "dead_features", "l0")}


def patch_variant(variant: str) -> None:
    """Take back hooked's gradient clip and / or its geometric-median b_dec, to measure what each bought."""
    from hooked.sae.training import loop, trainers

    if variant in ("no-clip", "before"):
        loop.MAX_GRAD_NORM = float("inf")  # clip_grad_norm_ scales by min(1, inf / norm): no clip
    if variant in ("mean-b_dec", "before"):
        trainers.geometric_median = lambda points: points.mean(0)


def measure(fn) -> tuple[float, float, int]:
    """(wall seconds of fn(), this process's CPU seconds during it, peak RSS growth in bytes during it)."""
    gc.collect()
    reset_peak_rss()
    before = proc_status().get("VmRSS", 0)
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu
    return seconds, cpu_seconds, proc_status().get("VmHWM", 0) - before


def worker(library: str, args) -> dict:
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quality:
        rows = sentence_rows(QUALITY["rows"])
        d_sae, k, batch_tokens, lr = QUALITY["d_sae"], QUALITY["k"], args.batch_tokens, QUALITY["lr"]
    else:
        rows = token_rows(args.steps * BATCH_TOKENS // CONTEXT)
        d_sae, k, batch_tokens, lr = args.d_sae, args.k, BATCH_TOKENS, LR
    n_tokens = rows.numel()
    trained = {}
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])  # torch.optim's first use imports torch._dynamo
    if library == "hooked":
        patch_variant(args.variant)
        model = hooked.load("hooked/ioi-gpt2")

        def run():
            trained["sae"] = hooked.sae.train(
                model, rows, hook_name=hook_names(args.layer)[0], architecture="topk", d_sae=d_sae, k=k, lr=lr,
                batch_tokens=batch_tokens, n_tokens=n_tokens, buffer_batches=8, progress=False, seed=args.seed,
            )  # fmt: skip

    elif library == "saelens":
        from common import transformer_lens_gpt2
        from datasets import Dataset
        from sae_lens import LanguageModelSAERunnerConfig, LanguageModelSAETrainingRunner, LoggingConfig
        from sae_lens.saes.topk_sae import TopKTrainingSAEConfig

        model = transformer_lens_gpt2(bundled_dir())
        dataset = Dataset.from_dict({"input_ids": rows.tolist()})
        torch.manual_seed(args.seed)  # its initialisation and its mixing buffer's permutations
        cfg = LanguageModelSAERunnerConfig(
            sae=TopKTrainingSAEConfig(d_in=model.cfg.d_model, d_sae=d_sae, k=k),
            model_name="ioi-gpt2",
            hook_name=hook_names(args.layer)[0],
            dataset_path="",
            is_dataset_tokenized=True,
            streaming=False,
            context_size=CONTEXT,
            prepend_bos=False,  # the rows begin with BOS already
            training_tokens=n_tokens,
            train_batch_size_tokens=batch_tokens,
            store_batch_size_prompts=batch_tokens // CONTEXT,
            n_batches_in_buffer=8 * batch_tokens // CONTEXT,  # its buffer holds this x context_size tokens
            lr=lr,
            device="cpu",
            dtype="float32",
            logger=LoggingConfig(log_to_wandb=False),
            output_path=None,
            checkpoint_path=None,
            n_checkpoints=0,
            verbose=False,
        )
        runner = LanguageModelSAETrainingRunner(cfg, override_dataset=dataset, override_model=model)

        def run():
            trained["sae"] = runner.run()
    else:
        os.environ["SPARSIFY_DISABLE_TRITON"] = "1"
        quiet_transformers()
        from datasets import Dataset
        from sparsify import SaeConfig, TrainConfig, Trainer
        from transformers import GPT2Model

        model = GPT2Model.from_pretrained(bundled_dir(), dtype=torch.float32).eval()
        dataset = Dataset.from_dict({"input_ids": rows.tolist()}).with_format("torch")
        save_dir = tempfile.mkdtemp(prefix="sparsify-bench-")
        cfg = TrainConfig(
            SaeConfig(num_latents=args.d_sae, k=args.k),
            batch_size=BATCH_TOKENS // CONTEXT,
            optimizer="adam",
            lr=LR,
            lr_warmup_steps=0,
            hookpoints=[hook_names(args.layer)[1]],
            log_to_wandb=False,
            save_dir=save_dir,
            save_every=10**9,
        )
        trainer = Trainer(cfg, dataset, model)
        run = trainer.fit
    seconds, cpu_seconds, peak = measure(run)
    out = {"seconds": seconds, "cpu": cpu_seconds, "tokens": n_tokens, "peak": peak, "threads": torch.get_num_threads()}
    if args.quality:
        dictionary = trained["sae"]
        if library == "saelens":
            dictionary = hooked.sae.from_saelens(dictionary)  # ranking by decoder norm kept, as SAELens runs it
        out.update(held_out_quality(hooked.load("hooked/ioi-gpt2"), dictionary))
    return out


def run_worker(library: str, args, seed: int = 0, variant: str = "default") -> dict:
    command = [sys.executable, __file__, "--worker", library, "--steps", str(args.steps), "--d-sae", str(args.d_sae)]
    command += ["--k", str(args.k), "--layer", str(args.layer)] + (
        ["--threads", str(args.threads)] if args.threads else []
    )
    command += ["--seed", str(seed), "--variant", variant, "--batch-tokens", str(args.batch_tokens)]
    command += ["--quality"] if args.quality else []
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {library} worker failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=50, help="training steps of 4096 tokens")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--d-sae", type=int, default=2048)
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--layer", type=int, default=2, help="the block whose output (hook_resid_post) is read")
    parser.add_argument("--threads", type=int, default=None, help="torch threads in every worker")
    parser.add_argument("--libraries", nargs="+", choices=LIBRARIES, default=list(LIBRARIES))
    parser.add_argument("--quality", action="store_true", help="hooked vs SAELens: held-out FVU, loss recovered")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="--quality: one run per seed")
    parser.add_argument("--ablations", action="store_true", help="--quality: hooked with each change taken back")
    parser.add_argument("--batch-tokens", type=int, default=QUALITY["batch_tokens"], help="--quality: tokens a step")
    parser.add_argument("--worker", choices=LIBRARIES, help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--variant", choices=VARIANTS, default="default", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return
    if args.quality:
        quality(args)
        return

    print(environment())
    token_rows(args.steps * BATCH_TOKENS // CONTEXT)  # built once, before the workers read it
    runs: dict[str, list[dict]] = {library: [] for library in args.libraries}
    for _ in range(args.rounds):
        for library in args.libraries:
            runs[library].append(run_worker(library, args))
    threads = runs[args.libraries[0]][0]["threads"]
    speed = {lib: statistics.median(r["tokens"] / r["seconds"] for r in results) for lib, results in runs.items()}
    per_cpu = {lib: statistics.median(r["tokens"] / r["cpu"] for r in results) for lib, results in runs.items()}
    peak = {lib: statistics.median(r["peak"] for r in results) for lib, results in runs.items()}
    ours = args.libraries[0]
    rows = [
        (
            library,
            f"{speed[library]:,.0f}",
            " ".join(f"{r['tokens'] / r['seconds']:,.0f}" for r in runs[library]),
            f"{speed[ours] / speed[library]:.2f}",
            f"{per_cpu[library]:,.0f}",
            f"{per_cpu[ours] / per_cpu[library]:.2f}",
            f"{peak[library] / MiB:.0f}",
            f"{peak[ours] / peak[library]:.2f}",
        )
        for library in args.libraries
    ]
    title = (
        f"\nTopK SAE at {hook_names(args.layer)[0]} of hooked/ioi-gpt2: d_sae {args.d_sae}, k {args.k},"
        f" {BATCH_TOKENS} tokens a step, {args.steps} steps, Adam lr {LR}, float32, CPU, {threads} torch threads;"
        f" median of {args.rounds} runs"
    )
    headers = [
        "library", "tokens/s", "each run", f"{ours} speed-up", "tokens/CPU-s", f"{ours} speed-up (CPU)",
        "peak RSS growth MiB", f"{ours} / it",
    ]  # fmt: skip
    print(table(headers, rows, title))
    print(
        "tokens/CPU-s counts this process's CPU time alone: with --threads 1 it does not charge a library for the"
        " time other jobs hold the cores (with more threads it counts their spinning too)"
    )
    print("targets: hooked >= 1.5x SAELens and >= 1x eai-sparsify in tokens/s; peak memory <= theirs (ratio <= 1)")


def quality(args) -> None:
    """hooked and SAELens on the same tokens, one run per seed each, taking turns; the means, and hooked's ratios."""
    print(environment())
    sentence_rows(QUALITY["rows"])
    runs = {"hooked": [], "saelens": []}
    variants = [v for v in VARIANTS if v != "default"] if args.ablations else []
    for variant in variants:
        runs[f"hooked ({variant})"] = []
    for seed in args.seeds:
        runs["hooked"].append(run_worker("hooked", args, seed))
        runs["saelens"].append(run_worker("saelens", args, seed))
        for variant in variants:
            runs[f"hooked ({variant})"].append(run_worker("hooked", args, seed, variant))

    def mean(name: str, key: str) -> float:
        return statistics.fmean(r[key] for r in runs[name])

    def speed(name: str, clock: str = "seconds") -> float:
        return statistics.median(r["tokens"] / r[clock] for r in runs[name])

    rows = [
        (
            name,
            f"{mean(name, 'fvu'):.4f}",
            " ".join(f"{r['fvu']:.4f}" for r in results),
            f"{mean(name, 'fvu') / mean('saelens', 'fvu'):.3f}",
            f"{mean(name, 'loss_recovered'):.4f}",
            " ".join(f"{r['loss_recovered']:.4f}" for r in results),
            f"{mean(name, 'loss_recovered') - mean('saelens', 'loss_recovered'):+.4f}",
            f"{mean(name, 'dead_features'):.1f}",
            f"{speed(name):,.0f}",
            f"{speed(name) / speed('saelens'):.2f}",
            f"{speed(name, 'cpu'):,.0f}",
            f"{speed(name, 'cpu') / speed('saelens', 'cpu'):.2f}",
        )
        for name, results in runs.items()
    ]
    threads = runs["hooked"][0]["threads"]
    title = (
        f"\nTopK SAE at {hook_names(args.layer)[0]} of hooked/ioi-gpt2: d_sae {QUALITY['d_sae']}, k {QUALITY['k']},"
        f" {args.batch_tokens} tokens a step, {runs['hooked'][0]['tokens']:,} tokens, Adam lr {QUALITY['lr']},"
        f" float32, CPU, {threads} torch threads; seeds {' '.join(map(str, args.seeds))}; held out: hooked.sae.evaluate"
        " on 600 IOI sentences, each alone"
    )
    headers = [
        "trainer", "FVU (mean)", "each seed", "/ SAELens", "loss recovered", "each seed", "- SAELens",
        "dead features", "tokens/s", "/ SAELens", "tokens/CPU-s", "/ SAELens",
    ]  # fmt: skip
    print(table(headers, rows, title))
    print("targets: hooked's FVU / SAELens' <= 1, loss recovered - SAELens' >= 0, tokens/s / SAELens' >= 1.5")


if __name__ == "__main__":
    main()
