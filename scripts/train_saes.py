#!/usr/bin/env python
"""Train the sparse dictionaries bundled with hooked's IOI models, evaluate them on held-out prompts, save them.

    .venv/bin/python scripts/train_saes.py                  # writes hooked/bundled/ioi-*/saes/
    .venv/bin/python scripts/train_saes.py --small --out D  # a quick run at reduced size into D/ioi-*/saes/

What it writes (docs/saes.md, "Bundled dictionaries"), each in SAELens' format (`hooked.sae.save`):

- `ioi-gpt2/saes/blocks.2.hook_resid_post/`: a TopK SAE on the residual stream after layer 2, where the layer-2
  name movers (L2H0-L2H2, docs/circuits.md) have written the IOI answer and from which the layer-3 heads (the
  name mover L3H3, and L3H2, which reads L2H1 and L2H2) and the unembedding read it;
- `ioi-gpt2/saes/transcoders/layer_{i}/`: a transcoder per layer, `blocks.i.mlp.hook_in -> blocks.i.hook_mlp_out`;
- `ioi-qwen3moe/saes/transcoders/layer_{i}/`: the same for every mixture-of-experts block of the Qwen3-MoE twin;
- `ioi-*/saes/evaluation.json`: the settings, the command, and the evaluation table.

The transcoders are BatchTopK (k features per token on average over a batch), which SAELens saves as JumpReLU with
one threshold; the SAE is TopK. All train from one forward pass per model (`hooked.sae.train(dictionaries=...)`).

Data: IOI sentences from `hooked.tasks.ioi` (all 15 templates in both orders, and the store template), the clean
prompt followed by its answer and the corrupt prompt (S2 replaced by the IO) followed by its own, left-padded
prompts of different lengths with their attention mask, so the activations are those of prompts run alone.
Training draws `tasks.ioi(..., seed=TRAIN_SEED)`, evaluation `tasks.ioi(..., seed=EVAL_SEED)`: other prompts.

Deterministic: `hooked.sae.train(seed=0)` seeds the initialisation and the shuffling, torch runs deterministic
algorithms on `--threads` threads (1 by default: on a shared machine, torch's thread pool waits longer than these
small steps compute). The script exits 1 when a dictionary misses a bound of `BOUNDS`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

import hooked
import hooked.sae
from hooked import metrics, tasks

BUNDLED = Path(hooked.__file__).resolve().parent / "bundled"
TRAIN_SEED = 0  # tasks.ioi seed of the training prompts
EVAL_SEED = 2029  # and of the held-out ones
SAE_POINT = "blocks.2.hook_resid_post"

# What the shipped dictionaries meet on the held-out prompts, each alone ("dictionary") and a transcoder set with
# all its layers spliced at once ("set"). docs/saes.md states them; the script and tests/sae/test_bundled.py check
# them, the reduced --small run included.
BOUNDS = {
    "dictionary": {
        "l0_max": 16.0,  # mean active features per token
        "fvu_max": 0.1,
        "ce_increase_max": 0.3,  # ce_spliced - ce_clean, nats
        "loss_recovered_min": 0.95,  # where zeroing the point costs >= CE_ZERO_MIN nats; elsewhere it is noise
        "logit_diff_ratio_min": 0.8,  # the IOI logit difference with the dictionary spliced / the clean model's
    },
    "set": {"ce_increase_max": 0.5, "loss_recovered_min": 0.9, "logit_diff_ratio_min": 0.8},
}
CE_ZERO_MIN = 1.0


def settings(small: bool) -> dict:
    """The training settings: the full run, or the reduced one the slow test repeats (--small)."""
    return {
        "prompts": 3000 if small else 12000,  # tasks.ioi pairs of the mixed templates (and a quarter of store ones)
        "n_tokens": 200_000 if small else 600_000,
        "batch_tokens": 512 if small else 1024,
        "eval_prompts": 250,
    }


def dictionaries(model_name: str, n_layers: int) -> dict[str, list[dict]]:
    """name -> the specs trained (hooked.sae.train's `dictionaries=` entries): one for an SAE, one per layer for a
    transcoder set."""
    transcoders = [
        dict(
            hook_name=f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            architecture="batchtopk",
            d_sae=256,
            k=8,
            lr=1e-2,
            dead_feature_window=100,
        )
        for layer in range(n_layers)
    ]
    found = {"transcoders": transcoders}
    if model_name == "hooked/ioi-gpt2":
        found = {
            SAE_POINT: [
                dict(hook_name=SAE_POINT, architecture="topk", d_sae=512, k=8, lr=3e-3, dead_feature_window=100)
            ],
            **found,
        }
    return found


def ioi_texts(seed: int, n: int) -> tuple[list[str], tasks.Task]:
    """The sentences of `n` mixed-template and n/4 store-template IOI pairs: each clean prompt with its answer, each
    corrupt one with its own (the S name); and the task of the clean prompts (answers cut off), for the logit
    difference."""
    texts, parts = [], []
    for template, count in (("mixed", n), ("store", max(1, n // 4))):
        task = tasks.ioi(count, seed=seed, template=template)
        texts += [prompt + answer for prompt, answer in zip(task.clean, task.correct, strict=True)]
        texts += [prompt + answer for prompt, answer in zip(task.corrupt, task.incorrect, strict=True)]
        parts.append(task)
    both = tasks.Task(
        "ioi",
        parts[0].clean + parts[1].clean,
        parts[0].corrupt + parts[1].corrupt,
        parts[0].correct + parts[1].correct,
        parts[0].incorrect + parts[1].incorrect,
        seed,
        {"templates": ["mixed", "store"]},
    )
    return texts, both


@torch.no_grad()
def evaluate(model, named: dict[str, list], texts: list[str], task: tasks.Task) -> list[dict]:
    """The table: `hooked.sae.evaluate`'s columns per dictionary, the IOI logit difference with it spliced, and a
    row per set with all its layers spliced at once (CE against every layer's point zeroed)."""
    metric = metrics.logit_diff(model, task.correct, task.incorrect)
    prompts, prompt_mask = model.tokens_and_mask(task.clean, None, None)
    clean_diff = metric(model(prompts, attention_mask=prompt_mask)).mean().item()
    rows = []
    for name, ds in named.items():
        table = hooked.sae.evaluate(model, ds, texts)
        for index, (d, row) in enumerate(zip(ds, table, strict=True)):
            spliced = model.run_with_saes(prompts, saes=[d], attention_mask=prompt_mask)
            label = name if len(ds) == 1 else f"{name}/layer_{index}"
            rows.append(_row(label, row, metric(spliced).mean().item(), clean_diff))
        if len(ds) > 1:
            rows.append(_whole_set(model, name, ds, texts, metric, prompts, prompt_mask, clean_diff, table))
    return rows


def _row(label: str, row: dict, logit_diff: float, clean_diff: float) -> dict:
    keep = ("d_sae", "l0", "fvu", "ce_clean", "ce_spliced", "ce_zero_ablated", "loss_recovered")
    return {
        "dictionary": label,
        "points": row["hook_name"] + (f" -> {row['hook_name_out']}" if row["hook_name_out"] else ""),
        **{key: row[key] for key in keep},
        "dead_features": row["dead_features"],
        "dense_features": row["dense_features"],
        "logit_diff_clean": clean_diff,
        "logit_diff_spliced": logit_diff,
        "n_tokens": row["n_tokens"],
    }


def _whole_set(model, name, ds, texts, metric, prompts, prompt_mask, clean_diff, table) -> dict:
    """Every layer of the set spliced at once, against every point it writes zeroed."""
    tokens, mask = model.tokens_and_mask(texts, None, None)
    zero = [(d.hook_name_out, lambda activation, hook: torch.zeros_like(activation)) for d in ds]
    spliced, zeroed = [], []
    for start in range(0, len(texts), 32):
        rows, real = tokens[start : start + 32], mask[start : start + 32]
        kwargs = dict(attention_mask=real, return_type="loss", loss_per_token=True)
        pairs = real[:, :-1] & real[:, 1:]
        spliced.append(model.run_with_saes(rows, saes=ds, **kwargs)[pairs])
        zeroed.append(model.run_with_hooks(rows, fwd_hooks=zero, **kwargs)[pairs])
    ce_spliced, ce_zero = (torch.cat(values).double().mean().item() for values in (spliced, zeroed))
    ce_clean = table[0]["ce_clean"]
    logit_diff = metric(model.run_with_saes(prompts, saes=ds, attention_mask=prompt_mask)).mean().item()
    return {
        "dictionary": f"{name} (all {len(ds)} layers at once)",
        "points": "",
        "d_sae": sum(d.cfg.d_sae for d in ds),
        "l0": sum(row["l0"] for row in table),
        "fvu": None,
        "ce_clean": ce_clean,
        "ce_spliced": ce_spliced,
        "ce_zero_ablated": ce_zero,
        "loss_recovered": (ce_zero - ce_spliced) / (ce_zero - ce_clean),
        "dead_features": sum(row["dead_features"] for row in table),
        "dense_features": sum(row["dense_features"] for row in table),
        "logit_diff_clean": clean_diff,
        "logit_diff_spliced": logit_diff,
        "n_tokens": table[0]["n_tokens"],
    }


def misses(row: dict, bounds: dict = BOUNDS) -> list[str]:
    """The bounds `row` misses (a set's row, all layers at once, has "set" bounds; its L0 is its layers' sum)."""
    out = []
    limits = bounds["set" if row["fvu"] is None else "dictionary"]
    if "l0_max" in limits and row["l0"] > limits["l0_max"]:
        out.append(f"L0 {row['l0']:.2f} > {limits['l0_max']}")
    if "fvu_max" in limits and row["fvu"] > limits["fvu_max"]:
        out.append(f"FVU {row['fvu']:.4f} > {limits['fvu_max']}")
    if row["ce_spliced"] - row["ce_clean"] > limits["ce_increase_max"]:
        out.append(f"CE +{row['ce_spliced'] - row['ce_clean']:.3f} > {limits['ce_increase_max']}")
    costly = row["ce_zero_ablated"] - row["ce_clean"] >= CE_ZERO_MIN
    if costly and row["loss_recovered"] < limits["loss_recovered_min"]:
        out.append(f"loss recovered {row['loss_recovered']:.4f} < {limits['loss_recovered_min']}")
    if row["logit_diff_spliced"] < limits["logit_diff_ratio_min"] * row["logit_diff_clean"]:
        out.append(f"logit difference {row['logit_diff_spliced']:.3f} < {limits['logit_diff_ratio_min']} x clean")
    return out


def markdown(model_name: str, rows: list[dict]) -> str:
    """The rows as docs/saes.md's table (tests/sae/test_bundled.py parses it back)."""
    lines = []
    for row in rows:
        fvu = "-" if row["fvu"] is None else f"{row['fvu']:.4f}"
        lines.append(
            f"| `{model_name}/saes/{row['dictionary']}` | {row['d_sae']} | {row['l0']:.2f} | {fvu} |"
            f" {row['ce_clean']:.4f} | {row['ce_spliced']:.4f} | {row['ce_zero_ablated']:.4f} |"
            f" {row['loss_recovered']:.4f} | {row['dead_features']} | {row['dense_features']} |"
            f" {row['logit_diff_clean']:.3f} | {row['logit_diff_spliced']:.3f} |"
        )
    return "\n".join(lines)


def run(model_name: str, args, config: dict) -> tuple[list[dict], dict[str, list]]:
    model = hooked.load(model_name)
    specs = dictionaries(model_name, model.cfg.n_layers)
    texts, _ = ioi_texts(TRAIN_SEED, config["prompts"])
    tokens, mask = model.tokens_and_mask(texts, None, None)
    flat = [spec for group in specs.values() for spec in group]
    started = time.perf_counter()
    trained = hooked.sae.train(
        model,
        tokens,
        attention_mask=mask,
        dictionaries=flat,
        n_tokens=config["n_tokens"],
        batch_tokens=config["batch_tokens"],
        seed=args.seed,
        progress=args.progress,
    )
    seconds = time.perf_counter() - started
    named, at = {}, 0
    for name, group in specs.items():
        named[name] = trained[at : at + len(group)]
        at += len(group)
    for d in trained:  # what the data was, in the words of SAELens' config
        d.cfg.metadata.update(
            model_name=model_name,
            dataset_path=f"hooked.tasks.ioi(seed={TRAIN_SEED}), scripts/train_saes.py",
            prepend_bos=model.default_prepend_bos,  # the rows came padded, with BOS where the model prepends it
        )
    print(f"{model_name}: trained {len(trained)} dictionaries on {config['n_tokens']:,} tokens in {seconds:.0f} s")
    eval_texts, eval_task = ioi_texts(EVAL_SEED, config["eval_prompts"])
    rows = evaluate(model, named, eval_texts, eval_task)
    record = {
        "trained_by": "scripts/train_saes.py",
        "command": " ".join(["python", "scripts/train_saes.py", *args.argv]),
        "settings": {**config, "seed": args.seed, "threads": args.threads},
        "specs": specs,
        "train_seed": TRAIN_SEED,
        "eval_seed": EVAL_SEED,
        "bounds": BOUNDS,
        "train_seconds": round(seconds, 1),
        "hooked_version": hooked.__version__,
        "torch_version": torch.__version__,
        "rows": rows,
    }
    return rows, {"named": named, "record": record}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=BUNDLED,
        help="parent directory; writes OUT/ioi-<model>/saes/ (default: %(default)s)",
    )
    parser.add_argument("--models", nargs="+", default=["gpt2", "qwen3moe"], choices=["gpt2", "qwen3moe"])
    parser.add_argument("--small", action="store_true", help="fewer prompts and tokens (the slow test's run)")
    parser.add_argument("--seed", type=int, default=0, help="hooked.sae.train's seed")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--progress", action="store_true", help="show hooked.sae.train's progress bar")
    parser.add_argument("--no-save", action="store_true", help="train and evaluate in memory only")
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    config = settings(args.small)
    failed = False
    for key in args.models:
        model_name = f"hooked/ioi-{key}"
        rows, result = run(model_name, args, config)
        print(markdown(model_name, rows))
        for row in rows:
            for miss in misses(row):
                print(f"  MISSED: {row['dictionary']}: {miss}")
                failed = True
        if not args.no_save:
            where = args.out / f"ioi-{key}" / "saes"
            for name, ds in result["named"].items():
                hooked.sae.save(ds[0] if len(ds) == 1 else ds, where / name)
            (where / "evaluation.json").write_text(json.dumps(result["record"], indent=2) + "\n")
            print(f"  saved to {where}/")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
