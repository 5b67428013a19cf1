"""Forward pass, no hooks: hooked's Llama, Mistral, GPT-NeoX (Pythia), Mixtral and OLMo 2 vs transformers (SDPA).

    .venv/bin/python benchmarks/families_forward.py [--repeats 10] [--batch 4] [--pos 128] [--only FAMILY]

Random checkpoints of benchmarks/common.py's FAMILY_SHAPES, sized for a 2-core CPU: d_model 1024, 16 query
heads, 4 layers, vocab 32000; Llama with 8 kv heads, d_mlp 2816 and Llama 3.1's rope scaling; Mistral with
8 kv heads and a 4096-token sliding window (longer than the prompt, as Mistral 7B v0.1's); GPT-NeoX with a
parallel residual, rotary on a quarter of each head and d_mlp 4096; Mixtral with 8 experts of width 1024,
top-2; OLMo 2 with 8 kv heads and d_mlp 2816. Float32, CPU, random tokens
[batch pos], torch.inference_mode, interleaved A B A B after warmup; transformers gets `use_cache=False`.
Read the ratio of medians (target: hooked <= 1.0). Also prints the max abs difference of the logits.
Checkpoints are written once under $HOOKED_BENCH_DIR (default /tmp/hooked-bench) and reused.
"""

from __future__ import annotations

import argparse

import torch
from common import FAMILY_COMMON, FAMILY_SHAPES, compare, environment, family_checkpoint, quiet_transformers, random_tokens, table, timing_table

import hooked


def run(family: str, args) -> tuple[list, float, bool]:
    import transformers

    directory = family_checkpoint(family)
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    reference_class = getattr(transformers, FAMILY_SHAPES[family][1])
    reference = reference_class.from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32).eval()
    tokens = random_tokens(args.batch, args.pos, vocab=FAMILY_COMMON["vocab_size"])
    with torch.inference_mode():
        ours = model(tokens)
        theirs = reference(tokens, use_cache=False).logits
        diff, identical = (ours - theirs).abs().max().item(), torch.equal(ours, theirs)
        timings = compare(
            {"transformers (sdpa)": lambda: reference(tokens, use_cache=False), "hooked": lambda: model(tokens)},
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
    parser.add_argument("--only", choices=list(FAMILY_SHAPES), default=None)
    args = parser.parse_args()
    quiet_transformers()
    print(environment())
    for family in [args.only] if args.only else list(FAMILY_SHAPES):
        timings, diff, identical = run(family, args)
        title = (f"\n{family}, forward, float32, batch {args.batch} x {args.pos} tokens, {args.repeats} runs each"
                 " (target: hooked <= 1.0)")
        print(timing_table(timings, unit="ms", title=title))
        print(table(["", "value"], [("max |logits hooked - logits transformers|", f"{diff:.3g}"), ("bit-identical", str(identical))]))


if __name__ == "__main__":
    main()
