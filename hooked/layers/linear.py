"""Linear layers beyond `nn.Linear`: GPT-2's `Conv1D` (its checkpoint stores [in, out]) and `add_bias`, the
output bias added after per-head partial products (tensor parallelism all-reduces them first).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


class Conv1D(nn.Module):
    """GPT-2's linear layer as stored: `x @ weight + bias` with weight [in, out], via `addmm` (transformers'
    `pytorch_utils.Conv1D`; other families use `nn.Linear`, [out, in])."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(d_in, d_out))
        self.bias = nn.Parameter(torch.zeros(d_out))

    def forward(self, x: Tensor) -> Tensor:
        return torch.addmm(self.bias, x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)

    def partial_product(self, x: Tensor) -> Tensor:
        """`x @ weight` without the bias (a row-parallel layer all-reduces it before adding the bias)."""
        return torch.mm(x.reshape(-1, x.shape[-1]), self.weight).view(*x.shape[:-1], -1)

    def add_bias(self, partial: Tensor) -> Tensor:
        """The output from a sum of per-head (or per-row-block) products: the bias added (tensor
        parallelism first all-reduces the partial sums, hooked.distributed.RowParallel)."""
        return partial + self.bias


def add_bias(linear: nn.Module, partial: Tensor) -> Tensor:
    """`linear`'s output from a sum of partial products (per head): its bias added, if any; a layer with its own
    `add_bias` (GPT-2's Conv1D; a tensor-parallel hooked.distributed.RowParallel, which first all-reduces the partial
    sums) adds it itself."""
    if hasattr(linear, "add_bias"):
        return linear.add_bias(partial)
    return partial + linear.bias if linear.bias is not None else partial
