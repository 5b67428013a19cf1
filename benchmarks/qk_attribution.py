"""QK attribution: `hooked.graphs.qk_attribution` of one head at every key position, against one forward plus one
backward pass of the same model on the same prompt, timed in the same run (interleaved, `common.compare`).

    .venv/bin/python benchmarks/qk_attribution.py [--lengths 64,256] [--repeats 5] [--layer -1]

A random Llama-shaped model (4 layers, d_model 128, 4 query heads on 2 key/value heads, d_head 32, d_mlp 512,
vocabulary 300) and a random JumpReLU transcoder set (1,024 features per layer, thresholds set for a few dozen
active features per position and layer, as benchmarks/graphs.py), in float32. The head is head 0 of `--layer` (the
last by default: its residual stream holds every lower layer's features, the most terms), the query the last
position, every key. The baseline is `model(tokens, return_type="loss").backward()` (every parameter's gradient).
Target (issue 41): the ratio qk_attribution / (forward + backward) at most 1, and memory linear in the prompt
(the result holds [terms, d_head] per key position, no [pos, pos] or pairs tensor).
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

SIZES = dict(n_layers=4, d_model=128, n_heads=4, n_kv_heads=2, d_head=32, d_mlp=512, d_vocab=300)
D_SAE, THRESHOLD = 1024, 6.5  # a few dozen of 1,024 features active per position (benchmarks/graphs.py's setting)


def setup(length: int):
    model = random_model("llama", seed=0, max_position_embeddings=max(length, 64), **SIZES)
    transcoders = []
    for layer in range(model.cfg.n_layers):
        d = random_dictionary(
            model.cfg.d_model,
            f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            d_sae=D_SAE,
            architecture="jumprelu",
            skip=True,
            seed=layer,
        )
        with torch.no_grad():
            d.threshold.fill_(THRESHOLD)
        transcoders.append(d)
    tokens = torch.randint(1, SIZES["d_vocab"], (length,), generator=torch.Generator().manual_seed(0))
    return model, transcoders, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", default="64,256")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--layer", type=int, default=-1)
    args = parser.parse_args()
    print(environment())
    rows = []
    for length in (int(n) for n in args.lengths.split(",")):
        model, transcoders, tokens = setup(length)
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
    print(table(headers, rows, title=f"qk_attribution of L{layer}.H0, query -1, every key; target ratio <= 1"))


if __name__ == "__main__":
    main()
