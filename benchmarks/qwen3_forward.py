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
import os
import shutil

import torch
from common import BENCH_DIR, compare, environment, quiet_transformers, random_tokens, table, timing_table

import hooked

COMMON = dict(vocab_size=32000, hidden_size=1024, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
              max_position_embeddings=4096, rope_parameters={"rope_type": "default", "rope_theta": 1e6})
SHAPES = {
    "dense": ("Qwen3Config", "Qwen3ForCausalLM", dict(COMMON, num_hidden_layers=8, intermediate_size=3072)),
    "moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(COMMON, num_hidden_layers=4, intermediate_size=3072, num_experts=16,
                                                         num_experts_per_tok=4, moe_intermediate_size=768, norm_topk_prob=True,
                                                         initializer_range=0.05)),
}


def checkpoint(kind: str, seed: int = 0):
    """A random checkpoint directory of the given shape, written once (norm weights randomised)."""
    import transformers

    from hooked.testing import randomize_norms

    directory = BENCH_DIR / f"qwen3-{kind}"
    if (directory / "config.json").exists() and list(directory.glob("*.safetensors")):
        return directory
    config_name, model_name, kwargs = SHAPES[kind]
    torch.manual_seed(seed)
    model = getattr(transformers, model_name)(getattr(transformers, config_name)(**kwargs)).eval()
    randomize_norms(model, seed)
    partial = directory.with_name(directory.name + f".partial-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)
    model.save_pretrained(partial)
    directory.parent.mkdir(parents=True, exist_ok=True)
    try:
        partial.rename(directory)
    except OSError:  # another process got there first
        shutil.rmtree(partial, ignore_errors=True)
    return directory


def run(kind: str, args) -> tuple[list, float, bool]:
    import transformers

    directory = checkpoint(kind)
    model = hooked.load(directory, dtype=torch.float32, device="cpu")
    reference = getattr(transformers, SHAPES[kind][1]).from_pretrained(directory, attn_implementation="sdpa", dtype=torch.float32).eval()
    tokens = random_tokens(args.batch, args.pos, vocab=COMMON["vocab_size"])
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
    parser.add_argument("--only", choices=list(SHAPES), default=None)
    args = parser.parse_args()
    quiet_transformers()
    print(environment())
    targets = {"dense": 1.05, "moe": 1.10}
    for kind in [args.only] if args.only else list(SHAPES):
        timings, diff, identical = run(kind, args)
        title = (f"\nQwen3 {kind}, forward, float32, batch {args.batch} x {args.pos} tokens, {args.repeats} runs each"
                 f" (target: hooked <= {targets[kind]:.2f})")
        print(timing_table(timings, unit="ms", title=title))
        print(table(["", "value"], [("max |logits hooked - logits transformers|", f"{diff:.3g}"), ("bit-identical", str(identical))]))


if __name__ == "__main__":
    main()
