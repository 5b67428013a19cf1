"""Generation speed: hooked's `generate` (KV cache) against transformers' `generate` on the same checkpoint.

    .venv/bin/python benchmarks/generate.py [--batches 1,8] [--new 64] [--prompt 16] [--repeats 5]
                                            [--models gpt2] [--device cpu] [--dtype float32]

For each model and batch: greedy decoding of `--new` tokens after a `--prompt`-token prompt (random
ids, no end-of-sequence stop on either side), timed interleaved (A B C A B C ...) after one warmup
round. Rows:

* transformers `GPT2LMHeadModel.generate(do_sample=False)` / `Qwen3ForCausalLM.generate`, SDPA, the
  baseline (its own DynamicCache);
* `model.generate(tokens, new, stop_at_eos=False)`: hooked with its preallocated KV cache;
* the same with a no-op hook on every hook point, registered for the call (`fwd_hooks=`). Listening at
  `hook_pattern` / `hook_attn_scores` switches attention to the eager path, at `hook_result` adds the
  per-head output einsum, at `ln*.hook_*` the step-by-step norm: that row pays for them;
* the same with a no-op hook on every point except those eager-path ones (the mechanism's own cost);
* on CUDA, hooked with every call forced onto the Triton kernel (`attention_backend("triton")`),
  decode steps included, to compare with the default (SDPA on decode steps).

Before timing, the greedy tokens of hooked and transformers are compared and the result printed.
tokens/s = batch * new / median seconds; "vs transformers" is the ratio of tokens/s (>1: hooked faster).

Models: `gpt2` is GPT-2 small's shapes (benchmarks/common.py, random weights); `qwen3-0.6b` is
Qwen3-0.6B's shapes (28 layers, d_model 1024, 16 query / 8 kv heads of 128, d_mlp 3072, vocab 151936,
tied), random, built once under $HOOKED_BENCH_DIR.
"""

from __future__ import annotations

import argparse
import re

import torch
from common import (
    BENCH_DIR,
    compare,
    environment,
    gpt2_small_checkpoint,
    quiet_transformers,
    random_tokens,
    table,
    transformers_checkpoint,
)

import hooked

EAGER_PATH = re.compile(r"(?:^|\.)(?:attn\.hook_(?:attn_scores|pattern|result)|ln\w*\.hook_(?:scale|normalized))$")

QWEN3_06B = dict(
    hidden_size=1024,
    num_hidden_layers=28,
    num_attention_heads=16,
    num_key_value_heads=8,
    head_dim=128,
    intermediate_size=3072,
    vocab_size=151936,
    tie_word_embeddings=True,
    max_position_embeddings=40960,
)


def noop(activation, hook):
    return None


def checkpoint(name: str):
    if name == "gpt2":
        return gpt2_small_checkpoint(), "GPT2LMHeadModel"
    if name == "qwen3-0.6b":
        return transformers_checkpoint(
            BENCH_DIR / "qwen3-0.6b-shaped", "Qwen3Config", "Qwen3ForCausalLM", QWEN3_06B
        ), "Qwen3ForCausalLM"
    raise SystemExit(f"unknown model {name!r}: gpt2, qwen3-0.6b")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batches", default="1,8")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--prompt", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--models", default="gpt2")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: float32 on CPU, bfloat16 on CUDA")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype or ("bfloat16" if args.device.startswith("cuda") else "float32"))
    quiet_transformers()
    import transformers

    print(environment())
    summary = []
    for model_name in args.models.split(","):
        directory, hf_class = checkpoint(model_name)
        model = hooked.load(directory, dtype=dtype, device=args.device)
        hf = getattr(transformers, hf_class).from_pretrained(directory, dtype=dtype, attn_implementation="sdpa")
        hf = hf.to(args.device).eval()
        hf.generation_config.eos_token_id = None  # both sides generate exactly --new tokens
        hf.generation_config.pad_token_id = 0
        every = model.hook_names
        mechanism = [name for name in every if not EAGER_PATH.search(name)]
        for batch in (int(b) for b in args.batches.split(",")):
            tokens = random_tokens(batch, args.prompt, vocab=model.cfg.d_vocab, seed=batch).to(args.device)
            mask = torch.ones_like(tokens)

            def hf_run():
                with torch.no_grad():
                    return hf.generate(tokens, attention_mask=mask, max_new_tokens=args.new, do_sample=False)

            def ours(**kwargs):
                return lambda: model.generate(tokens, args.new, stop_at_eos=False, **kwargs)

            same = torch.equal(hf_run().cpu(), ours()().cpu())
            fns = {
                "transformers generate": hf_run,
                "hooked generate": ours(),
                "hooked, no-op hook on every point": ours(fwd_hooks=[(every, noop)]),
                "hooked, no-op hook on every point but the eager-path ones": ours(fwd_hooks=[(mechanism, noop)]),
            }
            if args.device.startswith("cuda") and hooked.layers.triton_compiles_on(torch.device(args.device)):

                def forced():
                    with hooked.attention_backend("triton"):
                        return model.generate(tokens, args.new, stop_at_eos=False)

                fns["hooked, Triton on every call (decode included)"] = forced
            timings = compare(fns, repeats=args.repeats, warmup=1)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            base = {t.name: t.median for t in timings}
            rows = []
            for t in timings:
                rate = batch * args.new / t.median
                rows.append(
                    (
                        t.name,
                        f"{t.median:.3f}",
                        f"{t.spread:.2f}",
                        f"{rate:.1f}",
                        f"{base['transformers generate'] / t.median:.2f}x",
                        f"{t.median / base['hooked generate']:.3f}",
                    )
                )
            print(
                table(
                    ["", "median s", "IQR/median", "tokens/s", "vs transformers", "vs hooked unhooked"],
                    rows,
                    title=f"\n{model_name}, {dtype}, {args.device}: batch {batch}, prompt {args.prompt},"
                    f" {args.new} new tokens, greedy, {args.repeats} runs each (same tokens as transformers: {same})",
                )
            )
            unhooked = base["hooked generate"]
            summary.append(
                (
                    model_name,
                    batch,
                    f"{base['transformers generate'] / unhooked:.2f}x",
                    f"{base['hooked, no-op hook on every point'] / unhooked:.3f}",
                    f"{base['hooked, no-op hook on every point but the eager-path ones'] / unhooked:.3f}",
                    same,
                )
            )
    print(
        table(
            [
                "model",
                "batch",
                "tokens/s vs transformers (target >= 1.0)",
                "every point hooked / unhooked (<= 1.10)",
                "all but eager-path points / unhooked",
                "same tokens",
            ],
            summary,
            title="\nsummary",
        )
    )


if __name__ == "__main__":
    main()
