"""Forward pass, no hooks: hooked's GPT-2 vs transformers' `GPT2LMHeadModel` (SDPA), same weights.

    .venv/bin/python benchmarks/forward.py [--repeats 10] [--batch 4] [--pos 128]

GPT-2-small shape (benchmarks/common.py), float32, CPU, random tokens [batch pos]. Both models run
under torch.inference_mode, interleaved A B A B after warmup; transformers is called with
`use_cache=False` (it would otherwise build a KV cache hooked does not have). The figure to read
is the ratio of medians (target <= 1.05); absolute times depend on the machine and its load.
Also prints the max abs difference of the two models' logits (hooked's float32 forward is meant
to be bit-identical to transformers', so 0 is expected).
"""

from __future__ import annotations

import argparse

import torch
from common import compare, environment, gpt2_small_checkpoint, quiet_transformers, random_tokens, table, timing_table
from transformers import GPT2LMHeadModel

import hooked


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--pos", type=int, default=128)
    args = parser.parse_args()

    quiet_transformers()
    directory = gpt2_small_checkpoint()
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    reference = GPT2LMHeadModel.from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32).eval()
    tokens = random_tokens(args.batch, args.pos)

    with torch.inference_mode():
        ours = model(tokens)
        theirs = reference(tokens, use_cache=False).logits
        diff = (ours - theirs).abs().max().item()
        timings = compare(
            {
                "transformers (sdpa)": lambda: reference(tokens, use_cache=False),
                "hooked": lambda: model(tokens),
            },
            repeats=args.repeats,
            warmup=args.warmup,
        )

    print(environment())
    print(
        timing_table(
            timings,
            title=f"\nforward, float32, batch {args.batch} x {args.pos} tokens, {args.repeats} runs each (target: "
            "hooked <= 1.05)",
        )
    )
    print()
    print(
        table(
            ["", "value"],
            [
                ("max |logits hooked - logits transformers|", f"{diff:.3g}"),
                ("max |logits|", f"{theirs.abs().max().item():.3g}"),
                ("bit-identical", str(torch.equal(ours, theirs))),
            ],
        )
    )


if __name__ == "__main__":
    main()
