"""What hooks cost: a no-op hook on (nearly) every hook point vs no hooks, and one HookPoint call.

    .venv/bin/python benchmarks/hook_overhead.py [--repeats 6] [--decode-repeats 20] [--batch 4] [--pos 128]
                                                 [--no-transformer-lens] [--cpu-time]

GPT-2-small shape (benchmarks/common.py), float32, CPU, torch.inference_mode, runs interleaved
A B C A B C ... after warmup; ratios of medians against "no hooks" measured in the same run.

1. Forward [batch pos] (default 4 x 128) with `run_with_hooks(tokens, fwd_hooks=[(filter, noop)])`,
   `noop = lambda x, hook: None`, so the figure includes registering and removing the hooks:
   * "every hook point except eager-path ones": all points but `attn.hook_attn_scores`,
     `attn.hook_pattern`, `attn.hook_result`, `ln*.hook_scale`, `ln*.hook_normalized`, and the split
     inputs `hook_q_input` / `hook_k_input` / `hook_v_input`. Listening to those switches the layer to
     another computation (eager attention instead of SDPA, per-head output einsum, step-by-step
     LayerNorm, one normalised copy of the stream per head), which is a cost of the hook's *meaning*,
     not of the hook mechanism. Target: <= 1.15.
   * "every hook point incl. eager-path ones": all of them, for reference (no target).
   * "every point a default cache keeps": all but the split q/k/v inputs and hook_mlp_in, which
     TransformerLens computes only behind flags, and `mlp.hook_in`, which it has not (TransformerLens'
     point set, plus `attn.hook_result`, which TransformerLens caches only after
     `set_use_attn_result(True)`). Target: <= 1.15.
   * "run_with_cache()": a cache of every default point. Target: <= 1.3. With no other hook in the call
     the cache keeps the activations themselves (hooked/cache.py); the next row runs the same cache
     inside a `model.hooks()` block holding one no-op hook, which makes it copy every activation (what
     every cache did before), to show what the copies cost.
   * TransformerLens 3.9 on the same weights (`common.transformer_lens_gpt2`): its forward and its
     `run_with_cache()` (its default point set: the same minus `attn.hook_result`, plus the unembedding's
     `hook_in` / `hook_out`). A last table gives hooked's `run_with_cache()` over TransformerLens'.
     Target: <= 0.7. `--no-transformer-lens` leaves them out.
2. Cost of one call, ns: an unhooked `HookPoint`, `nn.Identity`, a bare Python function, and a
   HookPoint with one no-op hook (timeit-style loops, interleaved); and the cost of registering and
   removing the no-op hooks once (a `model.hooks(...)` context with no forward), which
   `run_with_hooks` pays on every call.
3. The same as 1 for a decode-like shape, batch 1 x 8 tokens (the model has no KV cache yet, so a
   short prompt stands in for one decode step), where per-call Python overhead weighs most. One
   extra row runs a second copy of the model with the same hooks attached once (`add_hook`), to
   separate the cost of registering hooks on every call from the cost of calling them.

`--cpu-time` runs section 1 alone on one torch thread and times process CPU time (`time.process_time`),
which a busy shared machine disturbs far less than wall time.
"""

from __future__ import annotations

import argparse
import re
import time

import torch
from common import (
    compare,
    environment,
    gpt2_small_checkpoint,
    random_tokens,
    table,
    timing_table,
    transformer_lens_gpt2,
)
from torch import nn

import hooked
from hooked import HookPoint

EAGER_PATH = re.compile(
    r"(?:^|\.)(?:attn\.hook_(?:attn_scores|pattern|result)|ln\w*\.hook_(?:scale|normalized)|hook_[qkv]_input)$"
)


def noop(activation, hook):
    return None


def not_eager_path(name: str) -> bool:
    return EAGER_PATH.search(name) is None


RUN_WITH_CACHE = "run_with_cache() (target <= 1.3)"
TL_RUN_WITH_CACHE = "TransformerLens 3.9 run_with_cache()"


def cache_with_another_hook(model, tokens):
    """run_with_cache with one more hook in the call (a no-op at hook_embed): the cache then copies everything."""
    with model.hooks(fwd_hooks=[("hook_embed", noop)]):
        return model.run_with_cache(tokens)


def forward_rows(
    model,
    tokens,
    repeats: int,
    warmup: int,
    held_model=None,
    cache_rows: bool = False,
    tl_model=None,
    clock=time.perf_counter,
):
    fns = {
        "no hooks": lambda: model(tokens),
        "every hook point except eager-path ones": lambda: model.run_with_hooks(
            tokens, fwd_hooks=[(not_eager_path, noop)]
        ),
        "every hook point incl. eager-path ones": lambda: model.run_with_hooks(
            tokens, fwd_hooks=[(lambda name: True, noop)]
        ),
    }
    if cache_rows:
        # TransformerLens' point set: the split q/k/v inputs and hook_mlp_in exist there only behind flags, and
        # a cache without a filter leaves them out here too (model.default_cache_names()), with mlp.hook_in.
        default = set(model.default_cache_names())
        fns["every point a default cache keeps (TransformerLens' set)"] = lambda: model.run_with_hooks(
            tokens, fwd_hooks=[(lambda name: name in default, noop)]
        )
        fns[RUN_WITH_CACHE] = lambda: model.run_with_cache(tokens)
        fns["run_with_cache() with one other hook (copies every activation)"] = lambda: cache_with_another_hook(
            model, tokens
        )
    if tl_model is not None:
        fns["TransformerLens 3.9 forward"] = lambda: tl_model(tokens)
        fns[TL_RUN_WITH_CACHE] = lambda: tl_model.run_with_cache(tokens)
    if held_model is not None:  # a second copy with the same hooks attached once (add_hook), for good
        fns["same, registered once (add_hook, second copy)"] = lambda: held_model(tokens)
    return compare(fns, repeats=repeats, warmup=warmup, clock=clock)


def micro_rows(calls: int, repeats: int):
    x = torch.zeros(8)
    point, identity = HookPoint("batch"), nn.Identity()
    with_hook = HookPoint("batch")
    root = hooked.HookedRootModule()
    root.point = with_hook
    root.setup_hooks()
    root.add_hook("point", noop)

    def bare(t):
        return t

    def loop(fn):
        def run():
            for _ in range(calls):
                fn(x)

        return run

    return compare(
        {
            "bare function": loop(bare),
            "HookPoint, no hook": loop(point),
            "nn.Identity": loop(identity),
            "HookPoint, one no-op hook": loop(with_hook),
        },
        repeats=repeats,
        warmup=1,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--pos", type=int, default=128)
    parser.add_argument("--decode-repeats", type=int, default=20)
    parser.add_argument("--no-transformer-lens", action="store_true", help="leave out TransformerLens' rows")
    parser.add_argument(
        "--cpu-time",
        action="store_true",
        help="section 1 only, on one torch thread, timed in process CPU time (steadier on a busy machine)",
    )
    args = parser.parse_args()

    model = hooked.load(gpt2_small_checkpoint(), dtype=torch.float32, device="cpu")
    names = model.hook_names
    cheap = [n for n in names if not_eager_path(n)]
    print(environment())
    print(f"{len(names)} hook points: {len(cheap)} outside the eager path, {len(names) - len(cheap)} on it")

    with torch.inference_mode():
        tokens = random_tokens(args.batch, args.pos)
        tl_model = None if args.no_transformer_lens else transformer_lens_gpt2(gpt2_small_checkpoint())
        if args.cpu_time:
            torch.set_num_threads(1)
        clock = time.process_time if args.cpu_time else time.perf_counter
        timings = forward_rows(
            model, tokens, args.repeats, args.warmup, cache_rows=True, tl_model=tl_model, clock=clock
        )
        unit = "process CPU time, 1 thread" if args.cpu_time else "wall time"
        print(
            timing_table(
                timings,
                title=f"\n1. forward with no-op hooks, float32, batch {args.batch} x {args.pos}, {args.repeats} runs "
                "each,"
                f" {unit} (target: first hooked row <= 1.15)",
            )
        )
        if tl_model is not None:
            by_name = {t.name: t for t in timings}
            ours, theirs = by_name[RUN_WITH_CACHE], by_name[TL_RUN_WITH_CACHE]
            print()
            print(
                table(
                    ["", "hooked ms", "TransformerLens ms", "ratio hooked / TransformerLens"],
                    [
                        (
                            "median",
                            f"{ours.median * 1e3:.2f}",
                            f"{theirs.median * 1e3:.2f}",
                            f"{ours.median / theirs.median:.3f}",
                        ),
                        (
                            "min",
                            f"{min(ours.samples) * 1e3:.2f}",
                            f"{min(theirs.samples) * 1e3:.2f}",
                            f"{min(ours.samples) / min(theirs.samples):.3f}",
                        ),
                    ],
                    title="   run_with_cache(), default points, hooked vs TransformerLens 3.9 (target <= 0.7)",
                )
            )
            del tl_model
        if args.cpu_time:
            return

        calls = 200_000
        micro = micro_rows(calls, repeats=7)
        rows = [
            (
                t.name,
                f"{t.median / calls * 1e9:.0f}",
                f"{min(t.samples) / calls * 1e9:.0f}",
                f"{t.median / micro[0].median:.2f}",
            )
            for t in micro
        ]
        print()
        print(
            table(
                ["", "median ns/call", "min ns/call", "ratio vs bare function"],
                rows,
                title=f"2. one call on an 8-float tensor, loops of {calls:,} calls, 7 loops each",
            )
        )

        contexts = 200

        def register(fwd_hooks):
            def run():
                for _ in range(contexts):
                    with model.hooks(fwd_hooks=fwd_hooks):
                        pass

            return run

        reg = compare(
            {
                f"{len(cheap)} points (all except eager-path)": register([(not_eager_path, noop)]),
                f"{len(names)} points (all)": register([(lambda name: True, noop)]),
            },
            repeats=7,
            warmup=1,
        )
        rows = [(t.name, f"{t.median / contexts * 1e6:.0f}", f"{min(t.samples) / contexts * 1e6:.0f}") for t in reg]
        print()
        print(
            table(
                ["register + remove a no-op hook on", "median us", "min us"],
                rows,
                title="   what run_with_hooks adds per call besides the hook calls (model.hooks context, no forward)",
            )
        )

        tokens = random_tokens(1, 8)
        held_model = hooked.load(gpt2_small_checkpoint(), dtype=torch.float32, device="cpu")
        held_model.add_hook(not_eager_path, noop)
        timings = forward_rows(model, tokens, args.decode_repeats, 5, held_model=held_model)
        print(
            timing_table(
                timings, title=f"\n3. decode-like forward (no KV cache): batch 1 x 8, {args.decode_repeats} runs each"
            )
        )


if __name__ == "__main__":
    main()
