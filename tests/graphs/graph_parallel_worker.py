"""Attribution graphs of a tensor-parallel model, saved per rank: run by tests/graphs/test_graph_parallel.py under
torchrun (as tests/infrastructure/distributed_worker.py is).

    python -m torch.distributed.run --standalone --nproc-per-node 2 \\
        tests/graphs/graph_parallel_worker.py OUT NAME=DIR ...

For each checkpoint, loaded with tp=2, `graph(model)` (also what the test computes in one process); each rank
writes OUT/rank{R}.pt.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

import hooked
from hooked import graphs
from tests.infrastructure.distributed_worker import TIMEOUT_S, cpu
from tests.sae.dictionaries import random_dictionary


def transcoders(cfg) -> list:
    """One jumprelu transcoder per layer with a skip path, reading blocks.l.mlp.hook_in and writing hook_mlp_out (on
    Qwen3-MoE the last block's is a mixture of experts, split over the ranks)."""
    return [
        random_dictionary(
            cfg.d_model,
            f"blocks.{layer}.mlp.hook_in",
            hook_name_out=f"blocks.{layer}.hook_mlp_out",
            d_sae=24,
            architecture="jumprelu",
            skip=True,
            seed=layer,
        )
        for layer in range(cfg.n_layers)
    ]


def graph(model, batched: bool = False, **settings) -> dict:
    """The graph of one 7-token prompt (at most 5 logits), as tensors; `batched`: the second of two prompts'
    graphs from `graphs.attribute_batch`."""
    prompts = torch.randint(1, model.cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(5))
    settings = {"batch_size": 8, **({} if "attribution_targets" in settings else {"max_n_logits": 5}), **settings}
    if batched:
        g = graphs.attribute_batch(model, prompts, transcoders(model.cfg), **settings)[1]
    else:
        g = graphs.attribute(model, prompts[0], transcoders(model.cfg), **settings)
    return cpu(
        {
            "adjacency": g.adjacency,
            "active_features": g.active_features,
            "activation_values": g.activation_values,
            "selected_features": g.selected_features,
            "logit_ids": torch.tensor([t.vocab_idx for t in g.logit_targets]),
            "logit_probabilities": g.logit_probabilities,
        }
    )


def gradient(model) -> dict:
    """The gradient of a loss on every logit with respect to a leaf at hook_embed, through every layer (MLPs and
    experts too), a hook at a split point (the heads' z in reverse order) and, on an MoE, the per-slot expert neurons
    (summed over the ranks); whether a plain forward builds an autograd graph; a backward hook's refusal."""
    cfg = model.cfg
    tokens = torch.randint(1, cfg.d_vocab, (2, 7), generator=torch.Generator().manual_seed(6))
    leaves = {}

    def embed(activation, hook):
        leaves["x"] = activation.detach().requires_grad_(True)
        return leaves["x"]

    def double(activation, hook):
        return activation * 2

    def swap_heads(activation, hook):  # head h reads head n - 1 - h's z: each rank's gradient reaches the other's
        return activation.flip(2)

    hooks = [("hook_embed", embed), ("blocks.0.attn.hook_z", swap_heads)]
    if cfg.is_sparse(cfg.n_layers - 1):
        hooks.append((f"blocks.{cfg.n_layers - 1}.mlp.hook_expert_post", double))
    logits = model.run_with_hooks(tokens, fwd_hooks=hooks)
    loss = (logits.log_softmax(-1) * torch.linspace(-1, 1, cfg.d_vocab)).sum()
    loss.backward()
    try:
        model.run_with_hooks(tokens, bwd_hooks=[("blocks.0.hook_resid_post", lambda grad, hook: None)])
        refusal = None
    except RuntimeError as error:
        refusal = str(error)
    return cpu(
        {
            "loss": loss,
            "grad": leaves["x"].grad,
            "plain_forward_has_a_graph": model(tokens).requires_grad,
            "backward_hook_refusal": refusal,
        }
    )


def graphs_of(model) -> dict:
    """Every feature's rows, the 6 most influential features' (chosen by influence, as circuit-tracer), a graph of
    a batch of two prompts, one of three tokens asked for (the last id's unembedding row is the last rank's); the
    gradient of `gradient`."""
    return {
        "all": graph(model),
        "selected": graph(model, max_feature_nodes=6),
        "batched": graph(model, batched=True),
        "targets": graph(model, attribution_targets=[model.cfg.d_vocab - 1, 3, 9]),  # rows of W_U on both ranks
        "gradient": gradient(model),
    }


def main(argv: list[str]) -> None:
    out = Path(argv[0])
    checkpoints = {item.split("=", 1)[0]: Path(item.split("=", 1)[1]) for item in argv[1:]}
    rank = int(os.environ["RANK"])
    result = {
        name: graphs_of(hooked.load(directory, tp=2, timeout=TIMEOUT_S)) for name, directory in checkpoints.items()
    }
    torch.save(result, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
