"""QK attribution: `hooked.graphs.qk_attribution` of one head at every key position, against one forward plus one
backward pass of the same model on the same prompt, timed in the same run (interleaved, `common.compare`).

    .venv/bin/python benchmarks/qk_attribution.py [--shape small|gpt2-small] [--lengths 64,256] [--repeats 5]
                                                  [--layer -1]

Two random Llama-shaped models, in float32, each with a random skip JumpReLU transcoder set:
- `small` (the default): 4 layers, d_model 128, 4 query heads on 2 key/value heads, d_head 32, d_mlp 512,
  vocabulary 300; 1,024 features per layer, thresholds set for a few dozen active features per position and layer
  (benchmarks/graphs.py's setting). Every operation is small, so per-call overheads weigh most here.
- `gpt2-small`: GPT-2 small's widths (12 layers, d_model 768, 12 heads of 64, d_mlp 3,072, vocabulary 50,257);
  6,144 features per layer (8 x d_model, as `small`), each layer's threshold set so that 60 features per position
  are active on the prompt (a transcoder's usual L0).
The head is head 0 of `--layer` (the last by default: its residual stream holds every lower layer's features, the
most terms), the query the last position, every key. The baseline is `model(tokens, return_type="loss").backward()`
(every parameter's gradient). Target (issue 41): the ratio qk_attribution / (forward + backward) at most 1, and
memory linear in the prompt (the result holds [terms, d_head] per key position, no [pos, pos] or pairs tensor).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from common import compare, environment, table

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hooked import graphs  # noqa: E402
from hooked.testing import random_model  # noqa: E402
from tests.sae.dictionaries import random_dictionary  # noqa: E402

# sizes, d_sae, and the threshold: a number, or ("active", k) for the threshold leaving k features per position
SHAPES = {
    "small": (dict(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, d_head=32, d_mlp=512, d_vocab=300), 1024, 6.5),
    "gpt2-small": (
        dict(n_layers=12, d_model=768, n_heads=12, n_kv_heads=12, d_head=64, d_mlp=3072, d_vocab=50257),
        6144,
        ("active", 60),
    ),
}


def setup(length: int, shape: str = "small"):
    sizes, d_sae, threshold = SHAPES[shape]
    model = random_model("llama", seed=0, max_position_embeddings=max(length, 64), **sizes)
    tokens = torch.randint(1, sizes["d_vocab"], (length,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda name: name.endswith("mlp.hook_in"))
    transcoders = []
    for layer in range(model.cfg.n_layers):
        d = random_dictionary(
            model.cfg.d_model,
            f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            d_sae=d_sae,
            architecture="jumprelu",
            skip=True,
            seed=layer,
        )
        with torch.no_grad():
            if isinstance(threshold, tuple):  # the value the k-th largest pre-activation per position reaches
                pre = d.pre_activations(cache[f"blocks.{layer}.mlp.hook_in"][0])
                d.threshold.fill_(float(pre.flatten().quantile(1 - threshold[1] / d_sae)))
            else:
                d.threshold.fill_(threshold)
        transcoders.append(d)
    return model, transcoders, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=sorted(SHAPES), default="small")
    parser.add_argument("--lengths", default="64,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layer", type=int, default=-1)
    args = parser.parse_args()
    print(environment())
    rows = []
    for length in (int(n) for n in args.lengths.split(",")):
        model, transcoders, tokens = setup(length, args.shape)
        layer = args.layer % model.cfg.n_layers

        def forward_backward():
            model.zero_grad(set_to_none=True)
            model(tokens[None], return_type="loss").backward()

        def attribution():
            return graphs.qk_attribution(model, tokens, transcoders, layer, 0, -1)

        result = attribution()
        terms = len(result.query_terms) + sum(len(t) for t in result.key_terms)
        error = float((result.forms - result.scores).abs().max())  # a benchmark of a wrong answer is worthless
        fb, qk = compare({"forward+backward": forward_backward, "qk_attribution": attribution}, repeats=args.repeats)
        rows.append(
            (
                length,
                len(result.keys),
                terms,
                f"{error:.1e}",
                f"{fb.median * 1e3:.1f}",
                f"{qk.median * 1e3:.1f}",
                f"**{qk.median / fb.median:.2f}**",
            )
        )
    headers = ["tokens", "keys", "terms (all keys)", "max |form - score|", "fwd+bwd ms", "qk_attribution ms", "ratio"]
    print(
        table(
            headers, rows, title=f"{args.shape}: qk_attribution of L{layer}.H0, query -1, every key; target ratio <= 1"
        )
    )


if __name__ == "__main__":
    main()
