"""Forward pass, no hooks: hooked's Llama, Mistral, GPT-NeoX (Pythia), Mixtral, OLMo 2, Gemma 2 and Gemma 3 against
transformers.

    .venv/bin/python benchmarks/families_forward.py [--repeats 10] [--batch 4] [--pos 128] [--only FAMILY] [--cpu-time]

Random checkpoints of benchmarks/common.py's FAMILY_SHAPES, sized for a 2-core CPU: d_model 1024, 16 query
heads, 4 layers, vocab 32000; Llama with 8 kv heads, d_mlp 2816 and Llama 3.1's rope scaling; Mistral with
8 kv heads and a 4096-token sliding window (longer than the prompt, as Mistral 7B v0.1's); GPT-NeoX with a
parallel residual, rotary on a quarter of each head and d_mlp 4096; Mixtral with 8 experts of width 1024,
top-2; OLMo 2 with 8 kv heads and d_mlp 2816; Gemma 2 with 8 kv heads, head_dim 64, d_mlp 2816, the released
softcaps (50 on the scores, 30 on the logits) and a 4096-token window on alternate layers, against transformers'
eager path (transformers 5.24 has no SDPA path for Gemma 2; a softcapped hooked model runs eager on CPU too).
Gemma 3 as Gemma 2 without the softcaps, with per-head q/k norms, a 64-token window on alternate layers (shorter
than the prompt) and two rotary tables (local base 1e4; global 1e6 with linear scaling 8), against SDPA.
Transformers runs SDPA for every other family. Float32, CPU, random tokens
[batch pos], torch.inference_mode, interleaved A B A B after warmup; transformers gets `use_cache=False`.
Read the ratio of medians (target: hooked <= 1.0). Also prints the max abs difference of the logits.
`--cpu-time` runs on one torch thread and times process CPU time (`time.process_time`), the measure a busy
shared machine moves least.
Checkpoints are written once under $HOOKED_BENCH_DIR (default /tmp/hooked-bench) and reused.
"""

from __future__ import annotations

import argparse
import functools
import time

import torch
from common import (
    BENCH_DIR,
    FAMILY_COMMON,
    FAMILY_SHAPES,
    compare,
    environment,
    family_checkpoint,
    quiet_transformers,
    random_tokens,
    table,
    timing_table,
    transformers_checkpoint,
)

import hooked

# family -> (transformers config class, model class, config kwargs, attention implementation of the reference)
SHAPES = {name: (*shape, "sdpa") for name, shape in FAMILY_SHAPES.items()}
SHAPES["gemma2"] = (
    "Gemma2Config",
    "Gemma2ForCausalLM",
    dict(
        FAMILY_COMMON,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=2816,
        query_pre_attn_scalar=64,
        sliding_window=4096,
    ),
    "eager",
)
SHAPES["gemma3"] = (
    "Gemma3TextConfig",
    "Gemma3ForCausalLM",
    dict(
        FAMILY_COMMON,
        num_key_value_heads=8,
        head_dim=64,
        intermediate_size=2816,
        query_pre_attn_scalar=64,
        sliding_window=64,
        sliding_window_pattern=2,
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
        },
    ),
    "sdpa",
)


def run(family: str, args) -> tuple[list, float, bool]:
    import transformers

    config_name, model_name, config_kwargs, implementation = SHAPES[family]
    directory = (
        family_checkpoint(family)
        if family in FAMILY_SHAPES
        else transformers_checkpoint(BENCH_DIR / f"{family}-float32", config_name, model_name, config_kwargs)
    )
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    reference_class = getattr(transformers, model_name)
    reference = reference_class.from_pretrained(
        directory, attn_implementation=implementation, dtype=torch.float32
    ).eval()
    tokens = random_tokens(args.batch, args.pos, vocab=FAMILY_COMMON["vocab_size"])
    with torch.inference_mode():
        ours = model(tokens)
        theirs = reference(tokens, use_cache=False).logits
        diff, identical = (ours - theirs).abs().max().item(), torch.equal(ours, theirs)
        timings = compare(
            {
                f"transformers ({implementation})": functools.partial(reference, tokens, use_cache=False),
                "hooked": functools.partial(model, tokens),
            },
            repeats=args.repeats,
            warmup=args.warmup,
            clock=time.process_time if args.cpu_time else time.perf_counter,
        )
    del model, reference
    return timings, diff, identical


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--pos", type=int, default=128)
    parser.add_argument("--only", choices=list(SHAPES), default=None)
    parser.add_argument(
        "--cpu-time", action="store_true", help="one torch thread, process CPU time instead of wall time"
    )
    args = parser.parse_args()
    quiet_transformers()
    if args.cpu_time:
        torch.set_num_threads(1)
    print(environment())
    for family in [args.only] if args.only else list(SHAPES):
        timings, diff, identical = run(family, args)
        clock = "process CPU time, 1 thread" if args.cpu_time else "wall time"
        title = (
            f"\n{family}, forward, float32, batch {args.batch} x {args.pos} tokens, {args.repeats} runs each, {clock}"
            " (target: hooked <= 1.0)"
        )
        print(timing_table(timings, unit="ms", title=title))
        print(
            table(
                ["", "value"],
                [("max |logits hooked - logits transformers|", f"{diff:.3g}"), ("bit-identical", str(identical))],
            )
        )


if __name__ == "__main__":
    main()
