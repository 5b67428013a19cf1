"""The main job of `make demo`: load GPT-2, look inside it, ablate components by sweeps.

    python -m hooked.demo                 # a random GPT-2 checkpoint built locally (no network)
    python -m hooked.demo --model gpt2    # the real GPT-2 small, from the Hugging Face cache

With no --model the weights are random (this machine cannot download), so the numbers show the
mechanics, not GPT-2's behaviour: the same code on `gpt2` measures GPT-2 small's indirect-object
logit difference.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import hooked
from hooked import ablate, metrics

PROMPTS = ["When Mary and John went to the store, John gave a drink to", "When Tom and Anna went to the park, Anna gave a ball to"]
ANSWERS = [(" Mary", " John"), (" Tom", " Anna")]


def random_checkpoint(directory: Path) -> Path:
    from hooked.testing import build_gpt2_checkpoint

    if not (directory / "config.json").exists():
        build_gpt2_checkpoint(directory, n_layer=4, n_embd=128, n_head=4, n_positions=128)
    return directory


def logit_diff(model: hooked.HookedTransformer, logits: torch.Tensor) -> float:
    correct = torch.tensor([model.to_single_token(c) for c, _ in ANSWERS])
    wrong = torch.tensor([model.to_single_token(w) for _, w in ANSWERS])
    last = logits[:, -1]
    return (last.gather(-1, correct[:, None]) - last.gather(-1, wrong[:, None])).mean().item()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", help="hub id or checkpoint directory (default: a random local GPT-2)")
    args = parser.parse_args(argv)
    torch.set_grad_enabled(False)

    source = args.model or random_checkpoint(Path("runs/demo-gpt2"))
    start = time.perf_counter()
    model = hooked.load(source)
    cfg = model.cfg
    print(f"loaded {source} in {time.perf_counter() - start:.2f}s: {cfg.n_layers} layers, {cfg.n_heads} heads, "
          f"d_model {cfg.d_model}, {len(model.hook_names)} hook points" + ("" if args.model else " (random weights)"))

    print("\nhook points of block 0 for a 12-token prompt:")
    for name, shape in model.hook_shapes(batch=1, pos=12).items():
        if name.startswith("blocks.0."):
            print(f"  {name:<32} {list(shape)}")

    logits, cache = model.run_with_cache(PROMPTS)
    print(f"\nrun_with_cache on {len(PROMPTS)} prompts (left-padded): {len(cache)} activations, "
          f"{cache.nbytes() / 2**20:.1f} MiB; cache['pattern', 0] is {list(cache['pattern', 0].shape)}")
    probs = logits[0, -1].softmax(-1)
    top = probs.topk(5)
    print(f"top next tokens after {PROMPTS[0]!r}:")
    for p, token in zip(top.values, top.indices):
        print(f"  {p.item():.4f} {model.to_string([int(token)])!r}")

    clean = logit_diff(model, logits)
    print(f"\nlogit difference (IO - S), clean: {clean:+.4f}")
    correct = [model.to_single_token(c) for c, _ in ANSWERS]
    wrong = [model.to_single_token(w) for _, w in ANSWERS]
    metric = metrics.logit_diff(model, correct, wrong)
    tokens = model.to_tokens(PROMPTS)
    start = time.perf_counter()
    mlps = hooked.sweep(model, tokens, {a: ablate.hooks(model, a, "zero") for a in ablate.components(model, "mlps")}, metric)
    print(f"zero-ablating each MLP ({len(mlps)} variants, one sweep, {time.perf_counter() - start:.2f}s):")
    for name, change in mlps.change.items():
        print(f"  {name:<8} {mlps.scores[name]:+.4f}  ({change:+.4f})")
    heads = hooked.sweep(model, tokens, {a: ablate.hooks(model, a, "zero") for a in ablate.components(model, "heads")}, metric)
    print(f"zero-ablating each head at hook_z ({len(heads)} variants), the largest changes:")
    for name, change in heads.top(5):
        print(f"  {name:<8} {heads.scores[name]:+.4f}  ({change:+.4f})")
    run_dir = heads.save(Path("runs/demo"), name="heads")
    print(f"head sweep table, JSON with provenance and heatmap saved to {run_dir}/")

    stack, labels = cache.decompose_resid(pos_slice=-1, return_labels=True)
    attrs = cache.logit_attrs(stack, torch.tensor(correct), incorrect_tokens=torch.tensor(wrong), pos_slice=-1).mean(1)
    print("direct logit attribution of each residual component:")
    for label, value in zip(labels, attrs):
        print(f"  {label:<12} {value.item():+.4f}")


if __name__ == "__main__":
    main()
