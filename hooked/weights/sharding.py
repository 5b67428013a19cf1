"""`shard_bytes`: how many bytes of parameters each rank of a tensor-parallel group holds, from config.json alone.

The model is built on the meta device once per rank and cut by the same plan `hooked.load(..., tp=)`
uses (hooked.distributed.parallelize, from each module's declared `tp_plan`), so the figures are what
a rank would hold, without memory or a process group. docs/scaling.md's "Memory per rank" table is
made with it.
"""

from __future__ import annotations

import torch

from hooked.distributed import Parallel, parallelize
from hooked.weights.architecture import architecture_for, build_on_meta, read_config
from hooked.weights.sources import resolve


def shard_bytes(config: dict | str, tp: int, dtype: torch.dtype = torch.bfloat16) -> list[dict[str, int]]:
    """The bytes of parameters each rank of a `tp` group would hold for a checkpoint (its config.json
    dict, a directory or a hub id; only config.json is read): per rank, "split" (parameters cut by
    the plan, including key/value heads held by several ranks), "replicated" (held whole by every
    rank) and "total". Built on the meta device: no memory, no process group. docs/scaling.md uses it.
    """
    if not isinstance(config, dict):
        config = read_config(resolve(config, config_only=True))
    model_class = architecture_for(config)
    itemsize = dtype.itemsize
    sizes = []
    for rank in range(tp):
        model = build_on_meta(model_class, config)
        plan = parallelize(model, Parallel(tp, rank, list(range(tp)), None, 1, 0, None))
        parameters = dict(model.named_parameters())
        split = sum(parameters[name].numel() for name in plan) * itemsize
        total = sum(p.numel() for p in parameters.values()) * itemsize
        sizes.append({"split": split, "replicated": total - split, "total": total})
    return sizes
