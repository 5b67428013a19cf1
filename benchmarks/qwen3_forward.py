"""Forward pass, no hooks: hooked's Qwen3 and Qwen3-MoE vs transformers (SDPA), same weights.

    .venv/bin/python benchmarks/qwen3_forward.py [--repeats 10] [--batch 4] [--pos 128] [--only dense|moe]

Random checkpoints shaped like a slice of the real models, sized for a 2-core CPU:
dense  = Qwen3-0.6B's layer shape (d_model 1024, 16 query / 8 kv heads of head_dim 128, so o_proj is
         [1024, 2048]; d_mlp 3072), 8 layers, vocab 32000, untied;
MoE    = 4 layers, d_model 1024, 16/8 heads of 128, 16 experts, top-4, expert width 768 (Qwen3-30B-A3B's),
         norm_topk_prob, vocab 32000.
Float32, CPU, random tokens [batch pos], torch.inference_mode, interleaved A B A B after warmup;
transformers gets `use_cache=False` and its default expert kernel ("grouped_mm"). Read the ratio of
medians (targets: dense <= 1.05, MoE <= 1.10). Checkpoints are written once under
$HOOKED_BENCH_DIR (default /tmp/hooked-bench) and reused.
"""

from __future__ import annotations

import argparse
import functools

import torch
from common import (
    BENCH_DIR,
    QWEN3_COMMON,
    QWEN3_SHAPES,
    compare,
    environment,
    quiet_transformers,
    random_tokens,
    table,
    timing_table,
    transformers_checkpoint,
)

import hooked

SHAPES = QWEN3_SHAPES


def checkpoint(kind: str, seed: int = 0):
    """A random float32 checkpoint directory of the given shape, written once (norm weights randomised)."""
    return transformers_checkpoint(BENCH_DIR / f"qwen3-{kind}", *SHAPES[kind], seed=seed)


def run(kind: str, args) -> tuple[list, float, bool]:
    import transformers

    directory = checkpoint(kind)
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    reference = (
        getattr(transformers, SHAPES[kind][1])
        .from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32)
        .eval()
    )
    tokens = random_tokens(args.batch, args.pos, vocab=QWEN3_COMMON["vocab_size"])
    with torch.inference_mode():
        ours = model(tokens)
        theirs = reference(tokens, use_cache=False).logits
        diff, identical = (ours - theirs).abs().max().item(), torch.equal(ours, theirs)
        timings = compare(
            {
                "transformers (sdpa)": functools.partial(reference, tokens, use_cache=False),
                "hooked": functools.partial(model, tokens),
            },
            repeats=args.repeats,
            warmup=args.warmup,
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
    args = parser.parse_args()
    quiet_transformers()
    print(environment())
    targets = {"dense": 1.05, "moe": 1.10}
    for kind in [args.only] if args.only else list(SHAPES):
        timings, diff, identical = run(kind, args)
        title = (
            f"\nQwen3 {kind}, forward, float32, batch {args.batch} x {args.pos} tokens, {args.repeats} runs each"
            f" (target: hooked <= {targets[kind]:.2f})"
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
