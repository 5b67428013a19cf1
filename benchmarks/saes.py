"""Sparse dictionaries: `run_with_saes` against SAELens' `HookedSAETransformer`, a feature sweep against a loop.

    .venv/bin/python benchmarks/saes.py [--sections splice,sweep] [--repeats 5] [--batch 8] [--pos 128]
                                        [--architectures standard,topk] [--features 1000] [--cpu-time]
    .venv/bin/python benchmarks/saes.py --sections sweep --sweep-model gpt2-small   # the sweep at GPT-2 small

Needs SAELens 6.54 (the dev extra) beside TransformerLens 3.9. Random weights, float32, CPU, torch.inference_mode,
timed interleaved (A B C A B C ...) after warmup; every figure is a ratio against a peer measured in the same run.

1. splice: one 16x SAE (d_sae = 16 * 768 = 12,288) on `blocks.6.hook_resid_post` of a GPT-2-small-shaped model
   (benchmarks/common.py), `--batch` x `--pos` random tokens (default 8 x 128), for each of `--architectures`
   (default standard: ReLU; topk: k = `--k`, 32), `apply_b_dec_to_input=True` (as SAELens' GPT-2 residual SAEs),
   `use_error_term=False`. The same tensors make hooked's `Dictionary` and SAELens' `StandardSAE` / `TopKSAE`;
   the same checkpoint makes `hooked.load`'s model and SAELens' `HookedSAETransformer` (TransformerLens 3.9,
   unprocessed: `common.transformer_lens_gpt2`). Rows:
   * hooked `model.run_with_saes(tokens, saes=[sae])` and SAELens' `HookedSAETransformer.run_with_saes`;
   * hooked's plain forward and SAELens' model's plain forward (no SAE);
   * the SAE's two matrix products alone, `x @ W_enc` and `acts @ W_dec`, on the block's real activations x
     [batch pos 768] and their features.
   Targets: hooked run_with_saes <= 0.7 x SAELens', and <= hooked forward + the two matrix products (1.0 plus
   noise). Beside them, untimed: the floor (hooked run_with_saes' matrix products alone, profiled, over SAELens'
   median: the ratio if nothing else took time) and each run's minor page faults per call. Both logits are
   compared (max abs difference) before timing: a benchmark of a wrong answer is worthless.
2. sweep: the clean run and each of `--features` features zeroed (default 1,000: features 0..999), metric
   logit[A] - logit[B] at the last position, `--sweep-batch` x `--sweep-pos` random tokens (default 2 x 16),
   `use_error_term=True` (the features are edited, the rest of the activation kept), by
   * hooked.sweep: `with model.saes([sae], use_error_term=True): hooked.sweep(model, tokens, {f"F{i}":
     ablate.hooks(model, f"L{layer}.resid_post.F{i}", "zero"), ...}, metric)`, the variants built in the timing;
   * hooked loop: per feature `with model.saes([sae], use_error_term=True): model.run_with_hooks(tokens,
     fwd_hooks=[(point.hook_sae_acts_post, zero feature i)])`, the splice made on every call as `run_with_saes`
     makes it (SAELens' `run_with_hooks_with_saes`), the metric on the full logits;
   * SAELens loop: `HookedSAETransformer.run_with_hooks_with_saes(tokens, saes=[sae], fwd_hooks=[...])`, the same
     hook, the SAE's `use_error_term=True`.
   The loops run `--loop-sample` evenly spaced features (default 50) and their times are scaled to all of them
   (a loop is linear in its features); their values are compared with the sweep's. `--sweep-model small` (the
   default) is a GPT-2-shaped slice, 6 layers, d_model 256, 4 heads, d_mlp 1024, vocab 50257, a 16x SAE (4,096
   features) on `blocks.3.hook_resid_post`, because a loop of 1,000 GPT-2-small forwards takes minutes on 2
   cores; `--sweep-model gpt2-small` runs the GPT-2-small shape with the SAE on `blocks.6.hook_resid_post`.

`--cpu-time` runs on one torch thread and times process CPU time (`time.process_time`), which other jobs on a busy
shared machine disturb far less than wall time. The load average (`os.getloadavg`) is printed before and after.
"""

from __future__ import annotations

import argparse
import os
import resource
import time
import warnings

import torch
from common import (
    BENCH_DIR,
    GPT2_SMALL,
    Timing,
    compare,
    environment,
    gpt2_small_checkpoint,
    quiet_transformers,
    random_tokens,
    table,
    timing_table,
    transformer_lens_gpt2,
    transformers_checkpoint,
)
from torch import Tensor

import hooked
from hooked import ablate, metrics
from hooked.sae import Dictionary, DictionaryConfig

ANSWERS = (11, 13)  # token ids A and B of the sweep's metric logit[A] - logit[B]
EXPANSION = 16  # d_sae = 16 * d_model
# The sweep's default model: GPT-2's vocabulary and layout, small enough that a 1,000-forward loop fits in minutes.
SMALL = dict(n_layer=6, n_embd=256, n_head=4, vocab_size=50257, n_positions=1024)


# ----------------------------------------------------------------------------- models and dictionaries
def checkpoint(name: str):
    """(checkpoint directory, the layer the SAE reads) of `--sweep-model`."""
    if name == "gpt2-small":
        return gpt2_small_checkpoint(), 6
    return transformers_checkpoint(BENCH_DIR / "gpt2-sae-sweep", "GPT2Config", "GPT2LMHeadModel", SMALL), 3


def sae_tensors(d_in: int, seed: int = 0) -> dict[str, Tensor]:
    """Random SAE weights in SAELens' layout (W_enc [d_in d_sae], W_dec [d_sae d_in]): unit decoder rows, the
    encoder their transpose (SAELens' initialisation), small biases. Dense products cost the same at any sparsity."""
    generator = torch.Generator().manual_seed(seed)
    d_sae = EXPANSION * d_in
    W_dec = torch.randn(d_sae, d_in, generator=generator)
    W_dec /= W_dec.norm(dim=-1, keepdim=True)
    return {
        "W_enc": W_dec.T.contiguous(),
        "W_dec": W_dec,
        "b_enc": -0.1 * torch.rand(d_sae, generator=generator),
        "b_dec": 0.1 * torch.randn(d_in, generator=generator),
    }


def hooked_sae(tensors: dict[str, Tensor], hook_name: str, architecture: str, k: int) -> Dictionary:
    d_in, d_sae = tensors["W_enc"].shape
    cfg = DictionaryConfig(
        d_in=d_in,
        d_sae=d_sae,
        hook_name=hook_name,
        architecture=architecture,
        k=k if architecture == "topk" else None,
        apply_b_dec_to_input=True,
    )
    sae = Dictionary(cfg)
    with torch.no_grad():
        for name, tensor in tensors.items():
            getattr(sae, name).copy_(tensor)
    return sae


def saelens_sae(tensors: dict[str, Tensor], hook_name: str, architecture: str, k: int):
    from sae_lens import StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
    from sae_lens.saes.sae import SAEMetadata

    d_in, d_sae = tensors["W_enc"].shape
    common = dict(d_in=d_in, d_sae=d_sae, apply_b_dec_to_input=True, metadata=SAEMetadata(hook_name=hook_name))
    if architecture == "topk":
        sae = TopKSAE(TopKSAEConfig(k=k, **common))
    else:
        sae = StandardSAE(StandardSAEConfig(**common))
    sae.load_state_dict(tensors)
    return sae.eval()


def saelens_model(directory):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from sae_lens import HookedSAETransformer
    return transformer_lens_gpt2(directory, model_class=HookedSAETransformer)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} cpus"


# ----------------------------------------------------------------------------- 1. splice
def splice_section(args, clock) -> None:
    directory = gpt2_small_checkpoint()
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    theirs = saelens_model(directory)
    tokens = random_tokens(args.batch, args.pos)
    hook_name = "blocks.6.hook_resid_post"
    tensors = sae_tensors(GPT2_SMALL["n_embd"])
    for architecture in args.architectures.split(","):
        ours_sae = hooked_sae(tensors, hook_name, architecture, args.k)
        their_sae = saelens_sae(tensors, hook_name, architecture, args.k)
        with torch.inference_mode():
            x = model.run_with_cache(tokens, names_filter=[hook_name])[1][hook_name]
            acts = ours_sae.encode(x)
            W_enc, W_dec = ours_sae.W_enc, ours_sae.W_dec
            ours = model.run_with_saes(tokens, saes=[ours_sae])
            reference = theirs.run_with_saes(tokens, saes=[their_sae])
            checks = [
                ("max |logits hooked - logits SAELens|", f"{(ours - reference).abs().max().item():.3g}"),
                ("max |logits|", f"{reference.abs().max().item():.3g}"),
                ("max |features hooked - features SAELens|", f"{(acts - their_sae.encode(x)).abs().max().item():.3g}"),
                (
                    "features active per token (L0)",
                    f"{(acts > 0).sum(-1).float().mean().item():.0f} of {acts.shape[-1]}",
                ),
            ]
            del ours, reference
            runs = (
                lambda: model.run_with_saes(tokens, saes=[ours_sae]),
                lambda: theirs.run_with_saes(tokens, saes=[their_sae]),
            )
            timings = compare(
                {
                    "hooked run_with_saes": runs[0],
                    "SAELens HookedSAETransformer.run_with_saes": runs[1],
                    "hooked forward (no SAE)": lambda: model(tokens),
                    "the SAE's two matrix products (x @ W_enc, acts @ W_dec)": lambda: (x @ W_enc, acts @ W_dec),
                    "TransformerLens 3.9 forward (HookedSAETransformer, no SAE)": lambda: theirs(tokens),
                },
                repeats=args.repeats,
                warmup=args.warmup,
                clock=clock,
            )
            floor = matrix_products(runs[0])
            faults = [
                ("minor page faults per call, hooked run_with_saes", page_faults(runs[0])),
                ("minor page faults per call, SAELens run_with_saes", page_faults(runs[1])),
            ]
        print(
            timing_table(
                timings,
                title=f"\n1. run_with_saes, {architecture} SAE"
                f"{f' (k={args.k})' if architecture == 'topk' else ''}, d_sae {acts.shape[-1]} on {hook_name},"
                f" batch {args.batch} x {args.pos}, {args.repeats} runs each",
            )
        )
        print()
        print(table(["", "value"], checks + faults))
        print()
        print(table(["", "median", "min", "target"], splice_targets(timings, floor)))


def matrix_products(fn, calls: int = 3) -> float:
    """Seconds per call that `fn` spends in matrix products (aten::addmm, mm, bmm: self time, torch.profiler).

    hooked's forward is bit-identical with transformers, so these products are the same calls transformers makes;
    the time `fn` takes beyond them is everything that could be changed without changing the logits' rounding.
    """
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        for _ in range(calls):
            fn()
    products = ("aten::addmm", "aten::mm", "aten::bmm")
    return sum(e.self_cpu_time_total for e in profile.key_averages() if e.key in products) / 1e6 / calls


def page_faults(fn, calls: int = 3) -> str:
    """Minor page faults per call of `fn` (getrusage): fresh pages the kernel maps for glibc's large blocks.

    Each costs the kernel ~1-2 us; how many a forward takes depends on glibc's trimming of freed memory, so they
    are part of both runs' times and of their variance (docs/benchmarks.md, "Sparse dictionaries").
    """
    fn()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(calls):
        fn()
    return f"{(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls:,.0f}"


def splice_targets(timings: list[Timing], floor: float) -> list[tuple]:
    ours, theirs, forward, products, _ = timings

    def ratios(pick) -> tuple[float, float]:
        ours_time = pick(ours.samples)
        return ours_time / pick(theirs.samples), ours_time / (pick(forward.samples) + pick(products.samples))

    median = ratios(lambda samples: Timing("", samples).median)
    fastest = ratios(min)
    return [
        ("hooked run_with_saes / SAELens run_with_saes", f"{median[0]:.3f}", f"{fastest[0]:.3f}", "<= 0.7"),
        (
            "hooked run_with_saes / (hooked forward + the two products)",
            f"{median[1]:.3f}",
            f"{fastest[1]:.3f}",
            "<= 1.0 (+ noise)",
        ),
        (
            "hooked's matrix products alone (profiled) / SAELens run_with_saes: the ratio if nothing else took time",
            f"{floor / theirs.median:.3f}",
            f"{floor / min(theirs.samples):.3f}",
            "",
        ),
    ]


# ----------------------------------------------------------------------------- 2. sweep
def zero_feature(feature: int):
    def hook(acts: Tensor, hook) -> Tensor:  # [batch pos d_sae]
        acts[..., feature] = 0
        return acts

    return hook


def logit_diff(logits: Tensor) -> Tensor:
    return (logits[:, -1, ANSWERS[0]] - logits[:, -1, ANSWERS[1]]).float()


def sweep_section(args, clock) -> None:
    directory, layer = checkpoint(args.sweep_model)
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    theirs = None if args.no_saelens else saelens_model(directory)
    d_model = model.cfg.d_model
    hook_name = f"blocks.{layer}.hook_resid_post"
    acts_name = f"{hook_name}.hook_sae_acts_post"
    tensors = sae_tensors(d_model)
    ours_sae = hooked_sae(tensors, hook_name, "standard", args.k)
    their_sae = saelens_sae(tensors, hook_name, "standard", args.k)
    their_sae.use_error_term = True
    tokens = random_tokens(args.sweep_batch, args.sweep_pos, vocab=model.cfg.d_vocab)
    features = list(range(args.features))
    step = max(1, len(features) // args.loop_sample)
    sample = features[::step][: args.loop_sample]
    metric = metrics.logit_diff(model, [ANSWERS[0]] * len(tokens), [ANSWERS[1]] * len(tokens))
    shape = f"{model.cfg.n_layers} layers, d_model {d_model}, vocab {model.cfg.d_vocab}"

    def sweep():
        with model.saes([ours_sae], use_error_term=True):
            variants = {f"F{i}": ablate.hooks(model, f"L{layer}.resid_post.F{i}", "zero") for i in features}
            result = hooked.sweep(model, tokens, variants, metric, progress=False)
        return torch.stack([result.base] + [result[f"F{i}"] for i in sample])

    def loop():
        values = [logit_diff(model.run_with_saes(tokens, saes=[ours_sae], use_error_term=True))]
        for i in sample:
            with model.saes([ours_sae], use_error_term=True):
                values.append(logit_diff(model.run_with_hooks(tokens, fwd_hooks=[(acts_name, zero_feature(i))])))
        return torch.stack(values)

    def saelens_loop():
        values = [logit_diff(theirs.run_with_saes(tokens, saes=[their_sae], use_error_term=True))]
        for i in sample:
            logits = theirs.run_with_hooks_with_saes(tokens, saes=[their_sae], fwd_hooks=[(acts_name, zero_feature(i))])
            values.append(logit_diff(logits))
        return torch.stack(values)

    fns = {"hooked.sweep": sweep, "hooked run_with_saes loop": loop}
    if theirs is not None:
        fns["SAELens run_with_hooks_with_saes loop"] = saelens_loop
    values = {}
    with torch.inference_mode():
        for name, fn in list(fns.items()):  # the warmup, and the values compared
            try:
                values[name] = fn()
            except RuntimeError as error:
                print(f"\n2. {name} failed, left out: {str(error).splitlines()[0]}")
                del fns[name]
        if "hooked.sweep" not in fns:
            return
        timings = compare(fns, repeats=args.sweep_repeats, warmup=0, clock=clock)
    scale = {name: (len(features) + 1) / (len(sample) + 1) if name != "hooked.sweep" else 1.0 for name in fns}
    rows = []
    sweep_time = timings[0].median
    for t in timings:
        seconds = t.median * scale[t.name]
        diff = (values[t.name] - values["hooked.sweep"]).abs().max().item()
        rows.append(
            (
                t.name if scale[t.name] == 1 else f"{t.name} ({len(sample)} of {len(features)} run, scaled)",
                f"{seconds:.1f}",
                f"{min(t.samples) * scale[t.name]:.1f}",
                f"{seconds / sweep_time:.2f}",
                f"{diff:.1e}",
            )
        )
    print()
    print(
        table(
            ["", "median s", "min s", "x the sweep's time (the sweep's speed-up)", "max |diff| vs sweep"],
            rows,
            title=f"2. {len(features):,} features zeroed one at a time, {args.sweep_model} ({shape}), 16x SAE on"
            f" {hook_name} (d_sae {EXPANSION * d_model}), use_error_term=True, {args.sweep_batch} x {args.sweep_pos}"
            f" tokens, {args.sweep_repeats} runs each (target: the loop >= 3x the sweep's time)",
        )
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default="splice,sweep")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs of each row of the splice section")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--pos", type=int, default=128)
    parser.add_argument("--architectures", default="standard", help="standard, topk or both: standard,topk")
    parser.add_argument("--k", type=int, default=32, help="k of the topk SAE")
    parser.add_argument("--sweep-model", choices=("small", "gpt2-small"), default="small")
    parser.add_argument("--features", type=int, default=1000)
    parser.add_argument("--loop-sample", type=int, default=50, help="features each loop runs (scaled to all)")
    parser.add_argument("--sweep-batch", type=int, default=2)
    parser.add_argument("--sweep-pos", type=int, default=16)
    parser.add_argument("--sweep-repeats", type=int, default=2)
    parser.add_argument("--no-saelens", action="store_true", help="leave SAELens' loop out of the sweep section")
    parser.add_argument("--cpu-time", action="store_true", help="one torch thread, timed in process CPU time")
    args = parser.parse_args()

    quiet_transformers()
    if args.cpu_time:
        torch.set_num_threads(1)
    clock = time.process_time if args.cpu_time else time.perf_counter
    print(environment())
    print(f"{load_average()}; {'process CPU time, 1 thread' if args.cpu_time else 'wall time'}")
    sections = args.sections.split(",")
    if "splice" in sections:
        splice_section(args, clock)
    if "sweep" in sections:
        sweep_section(args, clock)
    print(f"\n{load_average()} (at the end)")


if __name__ == "__main__":
    main()
