"""GPT-2's tanh GELU (`hooked.layers.mlp.gelu_new`) against transformers' own `NewGELUActivation`, bit for bit:
the in-place path without autograd and the cube it computes as a product must round as the plain expression."""

from __future__ import annotations

import pytest
import torch
from transformers.activations import NewGELUActivation

from hooked.layers.mlp import gelu_new


def values(dtype: torch.dtype) -> torch.Tensor:
    """Normal draws at several scales, and the edges: zeros, tiny and huge magnitudes, infinities, NaN."""
    generator = torch.Generator().manual_seed(0)
    draws = [torch.randn(200_000, generator=generator, dtype=torch.float64) * scale for scale in (1e-3, 1, 3, 30)]
    info = torch.finfo(dtype)
    edges = torch.tensor(
        [0.0, -0.0, info.tiny, -info.tiny, info.tiny / 4, 1e-20, -1e-20, 1e15, -1e15, info.max, -info.max],
        dtype=torch.float64,
    )
    special = torch.tensor([float("inf"), float("-inf"), float("nan")], dtype=torch.float64)
    return torch.cat([*draws, edges, special]).to(dtype).reshape(2, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_gelu_new_is_transformers_bit_for_bit(dtype):
    x = values(dtype)
    expected = NewGELUActivation()(x)
    with torch.no_grad():  # the in-place path
        fast = gelu_new(x)
    slow = gelu_new(x.clone().requires_grad_(True)).detach()  # the autograd path: the plain expression
    for got in (fast, slow, x):  # x: the in-place path works on a buffer of its own, not on its input
        reference = values(dtype) if got is x else expected
        assert got.dtype == dtype
        same = (got == reference) | (got.isnan() & reference.isnan())
        assert bool(same.all()), f"{int((~same).sum())} of {x.numel()} values differ"
