"""What a tensor-parallel model computes, saved per rank: run by tests/infrastructure/test_distributed.py under
torchrun.

    python -m torch.distributed.run --standalone --nproc-per-node 2 \
        tests/infrastructure/distributed_worker.py MODE OUT NAME=DIR ...

Modes:
* `main`: for each checkpoint, at tp=2: logits (plain and left-padded), the whole cache, each of
  `ablation_hooks(cfg)`, the collectives an unhooked and a hooked forward make (and one reading the q/k
  norms' hooks, where the model has q/k norms), a hook whose result
  differs between ranks, a sweep, greedy generation, unembedding rows; then at tp=1 (two data-parallel
  ranks) and without tp (data_parallel=True): the same sweep, with the variants each rank ran.
* `failures`: mistakes made on one rank (a hook that raises, bad or different input, a failing sweep
  variant) and on all (a hook of the wrong shape); what each rank raised; then a forward that must
  still work.
* `hybrid` (four ranks): tp=2 twice over, so a sweep is split over two data-parallel groups of two.
* `stalled`: rank 1 stops calling (sleeps past the timeout); what rank 0's forward raised, and when.

Each rank writes OUT/rank{R}.pt (torch.save of a dict). The comparisons live in the test, against
single-process models.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

import hooked
from hooked import ablate, metrics

TIMEOUT_S = 60  # collectives of the main and failures modes
STALL_TIMEOUT_S = 10  # the stalled mode's timeout; rank 1 sleeps STALL_TIMEOUT_S + 8


def prompt_tokens(cfg) -> torch.Tensor:
    return torch.randint(0, cfg.d_vocab, (3, 9), generator=torch.Generator().manual_seed(11))


def padded_prompt(cfg) -> tuple[torch.Tensor, torch.Tensor]:
    tokens = prompt_tokens(cfg)
    mask = torch.ones_like(tokens, dtype=torch.bool)
    mask[1, :3] = False
    mask[2, :1] = False
    return tokens, mask


def mid_point(cfg) -> str:
    """A replicated point between the halves of a block: resid_mid, or attn_out in a parallel-residual block."""
    return "hook_attn_out" if cfg.parallel_attn_mlp else "hook_resid_mid"


def ablation_hooks(cfg) -> dict[str, list]:
    """Interventions at points of every split: heads (q, k, z, pattern, q_norm), hidden columns, expert
    slots, and replicated points; zero, mean, resample and hand-written ones."""
    last = cfg.n_layers - 1
    reference = torch.randint(0, cfg.d_vocab, (4, 9), generator=torch.Generator().manual_seed(12))

    def scale_kv_head(v, hook):  # in place, on a kv-head axis (replicated over ranks when kv heads < tp)
        v[:, :, -1] *= 3.0

    def double_neurons(post, hook):  # a returned replacement on the hidden axis
        return post * 2.0

    hooks = {
        "zero_head_z": [(f"blocks.{last}.attn.hook_z", ablate.zero(heads=1))],
        "resample_heads_pattern": [("blocks.0.attn.hook_pattern", ablate.resample(heads=[0, cfg.n_heads - 1], seed=3))],
        "zero_q_position": [("blocks.0.attn.hook_q", ablate.zero(heads=cfg.n_heads - 1, positions=[2]))],
        "scale_v": [(f"blocks.{last}.attn.hook_v", scale_kv_head)],
        "zero_resid_mid": [(f"blocks.0.{mid_point(cfg)}", ablate.zero(positions=[-1]))],
    }
    dense = [layer for layer in range(cfg.n_layers) if not cfg.is_sparse(layer)]
    if dense:  # a dense MLP's neurons (Mixtral has none)
        hooks["double_neurons"] = [(f"blocks.{dense[0]}.mlp.hook_post", double_neurons)]
        hooks["mean_neurons"] = [
            (f"blocks.{dense[0]}.mlp.hook_pre", ablate.mean(reference, neurons=[0, 5], model=None))
        ]
    if cfg.original_architecture in ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "Olmo2ForCausalLM"):  # q/k norms
        hooks["zero_q_normed"] = [("blocks.0.attn.q_norm.hook_normalized", ablate.zero(heads=0))]
    if cfg.original_architecture == "Olmo2ForCausalLM":  # norms over every head: one replicated scale per position
        hooks["double_q_scale"] = [(f"blocks.{last}.attn.q_norm.hook_scale", lambda scale, hook: scale * 2.0)]
        hooks["zero_k_normalized_position"] = [("blocks.0.attn.k_norm.hook_normalized", ablate.zero(positions=[4]))]
    if getattr(cfg, "n_experts", 0):
        sparse = [layer for layer in range(cfg.n_layers) if cfg.is_sparse(layer)][-1]
        hooks["mask_expert"] = [(f"blocks.{sparse}.mlp.hook_router_logits", ablate.zero(experts=1))]
        hooks["zero_expert_neurons"] = [
            (f"blocks.{sparse}.mlp.hook_expert_post", ablate.zero(experts=2, neurons=[0, 3]))
        ]
        hooks["mean_expert_pre"] = [(f"blocks.{sparse}.mlp.hook_expert_pre", ablate.mean(reference, model=None))]
    return hooks


def with_model(hooks: dict[str, list], model) -> dict[str, list]:
    """The hooks with token references bound to `model` (mean ablations run the references once)."""
    bound = {}
    for name, pairs in hooks.items():
        bound[name] = []
        for hook_name, fn in pairs:
            if isinstance(fn, ablate.Mean) and fn.model is None:
                fn = ablate.mean(
                    fn.reference,
                    heads=fn.heads,
                    neurons=fn.neurons,
                    positions=fn.positions,
                    experts=fn.experts,
                    model=model,
                )
            bound[name].append((hook_name, fn))
    return bound


def sweep_variants(cfg) -> dict[str, list]:
    variants = {
        f"L{layer}H{head}": [(f"blocks.{layer}.attn.hook_z", ablate.zero(heads=head))]
        for layer in range(cfg.n_layers)
        for head in range(cfg.n_heads)
    }
    variants |= {f"L{layer}.mlp": [(f"blocks.{layer}.hook_mlp_out", ablate.zero())] for layer in range(cfg.n_layers)}
    dense = [layer for layer in range(cfg.n_layers) if not cfg.is_sparse(layer)]
    if dense:
        variants[f"L{dense[0]}.N3"] = [(f"blocks.{dense[0]}.mlp.hook_post", ablate.zero(neurons=3))]
    return variants


def sweep_metric(model):
    return metrics.logit_diff(model, [1, 2, 3], [4, 5, 6])


class Counted:
    """A variant's callback that records, on this rank, that its variant ran."""

    ran: set[str] = set()

    def __init__(self, name: str, fn):
        self.name, self.fn = name, fn

    def __call__(self, activation, hook):
        Counted.ran.add(self.name)
        return self.fn(activation, hook)


def counted(variants: dict[str, list]) -> dict[str, list]:
    return {name: [(hook_name, Counted(name, fn)) for hook_name, fn in pairs] for name, pairs in variants.items()}


class Collectives:
    """Counts torch.distributed calls made inside the block."""

    NAMES = ("all_reduce", "all_gather_single", "broadcast", "all_gather_object")

    def __enter__(self):
        self.counts = dict.fromkeys(self.NAMES, 0)
        self.saved = {name: getattr(dist, name) for name in self.NAMES}
        for name in self.NAMES:
            original = self.saved[name]

            def counting(*args, _name=name, _original=original, **kwargs):
                self.counts[_name] += 1
                return _original(*args, **kwargs)

            setattr(dist, name, counting)
        return self

    def __exit__(self, *exc):
        for name, fn in self.saved.items():
            setattr(dist, name, fn)


def cpu(tree):
    if isinstance(tree, torch.Tensor):
        return tree.detach().cpu().clone()
    if isinstance(tree, dict):
        return {key: cpu(value) for key, value in tree.items()}
    return tree


def main_mode(checkpoints: dict[str, Path], rank: int) -> dict:
    out = {}
    for name, directory in checkpoints.items():
        model = hooked.load(directory, tp=2, timeout=TIMEOUT_S)
        cfg = model.cfg
        tokens = prompt_tokens(cfg)
        padded, mask = padded_prompt(cfg)
        result = {"logits": model(tokens), "logits_padded": model(padded, attention_mask=mask)}
        _, cache = model.run_with_cache(tokens)
        result["cache"] = dict(cache.items())
        _, z_only = model.run_with_cache(
            tokens, names_filter=lambda hook: hook.endswith(("hook_z", "hook_resid_post", "hook_scale"))
        )
        try:
            result["head_results"] = z_only.stack_head_results(layer=-1, pos_slice=-1)  # W_O is this rank's shard
        except ValueError as refused:  # post-norm blocks (OLMo 2): a head's write is not what it adds
            result["head_results"] = f"ValueError: {refused}"
        # carried through the post-norms at their (replicated) cached scales; the same as above on pre-norm blocks
        result["head_results_through"] = z_only.stack_head_results(layer=-1, pos_slice=-1, through_post_norm=True)
        if getattr(cfg, "n_experts", 0):  # each rank holds its experts' down_proj
            result["expert_results"] = cache.stack_expert_results(pos_slice=-1)
        result["ablations"] = {
            label: model.run_with_hooks(tokens, fwd_hooks=pairs)
            for label, pairs in with_model(ablation_hooks(cfg), model).items()
        }

        def add_rank(activation, hook):  # differs between ranks: the first rank's result must count
            return activation + float(rank)

        result["rank_dependent"] = model.run_with_hooks(
            tokens, fwd_hooks=[("blocks.0.attn.hook_z", add_rank), (f"blocks.0.{mid_point(cfg)}", add_rank)]
        )
        with Collectives() as unhooked:
            model(tokens)
        with Collectives() as reading:
            model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", lambda z, hook: None)])
        with Collectives() as writing:
            model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", ablate.zero(heads=0))])
        result["collectives"] = {"unhooked": unhooked.counts, "reading": reading.counts, "writing": writing.counts}
        norm_points = [
            "blocks.0.attn.q_norm.hook_scale",
            "blocks.0.attn.q_norm.hook_normalized",
            "blocks.0.attn.k_norm.hook_normalized",
        ]
        if all(point in model.hook_dict for point in norm_points):
            with Collectives() as qk_norms:
                model.run_with_hooks(
                    tokens, fwd_hooks=[(point, lambda activation, hook: None) for point in norm_points]
                )
            result["collectives"]["qk_norms"] = qk_norms.counts
        sweep = hooked.sweep(model, tokens, sweep_variants(cfg), sweep_metric(model))
        result["sweep"] = {"values": sweep.values, "base": sweep.base, "variants": sweep.variants}
        result["generated"] = model.generate(padded, max_new_tokens=4, attention_mask=mask, return_type="tokens")
        result["directions"] = model.tokens_to_residual_directions(torch.tensor([0, cfg.d_vocab // 2, cfg.d_vocab - 1]))
        result["local_parameters"] = sum(p.numel() for p in model.parameters())

        Counted.ran = set()
        replicas = hooked.load(directory, tp=1, timeout=TIMEOUT_S)  # two data-parallel ranks
        dp = hooked.sweep(replicas, tokens, counted(sweep_variants(cfg)), sweep_metric(replicas))
        result["dp_sweep"] = {"values": dp.values, "base": dp.base, "ran": sorted(Counted.ran)}
        Counted.ran = set()
        plain = hooked.load(directory)
        world = hooked.sweep(plain, tokens, counted(sweep_variants(cfg)), sweep_metric(plain), data_parallel=True)
        result["world_sweep"] = {"values": world.values, "ran": sorted(Counted.ran)}
        out[name] = cpu(result)
    return out


def hybrid_mode(checkpoints: dict[str, Path], rank: int) -> dict:
    """Four ranks: two data-parallel copies, each split over two ranks (tp=2)."""
    out = {}
    for name, directory in checkpoints.items():
        model = hooked.load(directory, tp=2, timeout=TIMEOUT_S)
        tokens = prompt_tokens(model.cfg)
        Counted.ran = set()
        result = hooked.sweep(model, tokens, counted(sweep_variants(model.cfg)), sweep_metric(model))
        out[name] = cpu(
            {
                "logits": model(tokens),
                "values": result.values,
                "ran": sorted(Counted.ran),
                "tp_rank": model.parallel.tp_rank,
                "dp_rank": model.parallel.dp_rank,
            }
        )
    return out


def outcome(call) -> dict:
    start = time.monotonic()
    try:
        call()
    except Exception as error:
        return {"raised": type(error).__name__, "message": str(error), "seconds": time.monotonic() - start}
    return {"raised": None, "message": "", "seconds": time.monotonic() - start}


def failures_mode(checkpoints: dict[str, Path], rank: int) -> dict:
    directory = next(iter(checkpoints.values()))
    model = hooked.load(directory, tp=2, timeout=TIMEOUT_S)
    cfg = model.cfg
    tokens = prompt_tokens(cfg)
    first = model(tokens)

    def raise_on_rank_1(activation, hook):
        if rank == 1:
            raise ValueError("a mistake in this hook on rank 1")

    def wrong_shape(activation, hook):
        return activation[:, :-1]

    bad = tokens.clone()
    if rank == 1:
        bad[0, 0] = cfg.d_vocab + 5
    different = tokens.clone()
    if rank == 1:
        different[1, 2] = (different[1, 2] + 1) % cfg.d_vocab
    variants = {
        "fine": [("blocks.0.hook_mlp_out", ablate.zero())],
        "broken": [("blocks.0.attn.hook_z", raise_on_rank_1)],
    }
    replicas = hooked.load(directory, tp=1, timeout=TIMEOUT_S)
    dp_variants = {f"v{index}": [("blocks.0.hook_mlp_out", ablate.zero())] for index in range(3)}
    # Variants run in order of the stage they start at: the final norm's is last, so in rank 1's share.
    dp_variants["v3"] = [("ln_final.hook_normalized", raise_on_rank_1)]
    result = {
        "hook_raises_on_one_rank": outcome(
            lambda: model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_z", raise_on_rank_1)])
        ),
        "bad_input_on_one_rank": outcome(lambda: model(bad)),
        "different_inputs": outcome(lambda: model(different)),
        "wrong_shape_everywhere": outcome(
            lambda: model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.attn.hook_q", wrong_shape)])
        ),
        "cache_with_failing_hook": outcome(
            lambda: (
                model.run_with_cache(tokens, names_filter="blocks.0.mlp.hook_post")
                if rank == 0
                else model.run_with_cache(tokens, names_filter="blocks.0.mlp.hook_nope")
            )
        ),
        "sweep_variant_fails_on_one_rank": outcome(lambda: hooked.sweep(model, tokens, variants, sweep_metric(model))),
        "dp_sweep_share_fails": outcome(lambda: hooked.sweep(replicas, tokens, dp_variants, sweep_metric(replicas))),
        "hooks_left": sum(len(point.fwd_hooks) for point in model.hook_dict.values()),
    }
    result["after"] = model(tokens)
    result["first"] = first
    return cpu(result)


def both_started(out: Path, rank: int, processes: int = 2, limit_s: float = 300) -> None:
    """Wait, through files in `out`, until every rank has got here. The stalled mode's short timeout also bounds the
    process group's start, so a rank still importing on a loaded machine would fail the start, not the collective
    the test is about; after this the ranks start the group within moments of each other."""
    (out / f"started{rank}").touch()
    deadline = time.monotonic() + limit_s
    while not all((out / f"started{r}").exists() for r in range(processes)):
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank}: not every rank started within {limit_s} s")
        time.sleep(0.05)


def stalled_mode(checkpoints: dict[str, Path], rank: int, out: Path) -> dict:
    directory = next(iter(checkpoints.values()))
    both_started(out, rank)
    model = hooked.load(directory, tp=2, timeout=STALL_TIMEOUT_S)
    tokens = prompt_tokens(model.cfg)
    if rank == 1:
        time.sleep(STALL_TIMEOUT_S + 8)  # never makes the call rank 0 waits in
        return {"slept": True}
    return {"forward": outcome(lambda: model(tokens))}


def main(argv: list[str]) -> None:
    mode, out = argv[0], Path(argv[1])
    checkpoints = {item.split("=", 1)[0]: Path(item.split("=", 1)[1]) for item in argv[2:]}
    rank = int(os.environ["RANK"])
    modes = {
        "main": main_mode,
        "hybrid": hybrid_mode,
        "failures": failures_mode,
        "stalled": lambda checkpoints, rank: stalled_mode(checkpoints, rank, out),
    }
    result = modes[mode](checkpoints, rank)
    torch.save(result, out / f"rank{rank}.pt")
    if mode == "stalled":
        os._exit(0)  # the group is broken by design: no orderly teardown
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
