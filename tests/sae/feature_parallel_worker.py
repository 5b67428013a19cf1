"""What a tensor-parallel model computes with dictionaries spliced, saved per rank: run by
tests/sae/test_feature_parallel.py under torchrun (as tests/infrastructure/distributed_worker.py is).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/sae/feature_parallel_worker.py OUT NAME=DIR ...

For each checkpoint, loaded with tp=2, `features(model)` (also what the test computes in one process); each rank
writes OUT/rank{R}.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import hooked
from hooked import ablate, metrics
from tests.infrastructure.distributed_worker import TIMEOUT_S, cpu, prompt_tokens
from tests.sae.dictionaries import random_dictionary


def features(model) -> dict:
    """Splice an SAE on blocks.0.hook_resid_post and a transcoder replacing the last block's MLP (its mixture of
    experts on Qwen3-MoE), then run them, a feature held, a sweep over features, generation and a sparse cache."""
    cfg = model.cfg
    last = cfg.n_layers - 1
    sae = random_dictionary(cfg.d_model, "blocks.0.hook_resid_post", d_sae=32, architecture="topk", seed=1)
    tc = random_dictionary(
        cfg.d_model, f"blocks.{last}.mlp.hook_in", hook_name_out=f"blocks.{last}.hook_mlp_out", d_sae=32, seed=2
    )
    tokens = prompt_tokens(cfg)
    names = ["blocks.0.hook_resid_post.hook_sae_acts_post", f"blocks.{last}.hook_mlp_out.hook_sae_acts_post"]
    result = {"is_sparse": cfg.is_sparse(last), "spliced": model.run_with_saes(tokens, saes=[sae, tc])}
    with model.saes([sae, tc], use_error_term=True):
        held = ablate.hooks(model, ["L0.resid_post.F3", f"L{last}.mlp_out.F5"], "constant", value=4.0)
        result["held"] = model.run_with_hooks(tokens, fwd_hooks=held)
        variants = {f"L0.resid_post.F{i}": ablate.hooks(model, f"L0.resid_post.F{i}", "zero") for i in range(8)}
        variants |= {f"L{last}.mlp_out.F{i}": ablate.hooks(model, f"L{last}.mlp_out.F{i}", "zero") for i in range(8)}
        sweep = hooked.sweep(model, tokens, variants, metrics.logit_diff(model, [1, 2, 3], [4, 5, 6]))
        result["sweep"] = {"values": sweep.values, "base": sweep.base}
        with model.hooks(fwd_hooks=held):
            result["generated"] = model.generate(tokens, 3, stop_at_eos=False)
    _, cache = model.run_with_cache_with_saes(tokens, saes=[sae, tc], sparse_features=True, names_filter=names)
    result["features"] = {name: cache[name].to_dense() for name in names}
    return cpu(result)


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    checkpoints = {item.split("=", 1)[0]: Path(item.split("=", 1)[1]) for item in argv[1:]}
    rank = int(os.environ["RANK"])
    result = {
        name: features(hooked.load(directory, tp=2, timeout=TIMEOUT_S)) for name, directory in checkpoints.items()
    }
    torch.save(result, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
