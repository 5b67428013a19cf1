"""What a layer declares about itself for generic code, as data: how tensor parallelism cuts a parameter
(`Split`, in a module's `tp_plan()`), and which weights read or write the residual stream (`Projection`, in
`residual_readers()` / `residual_writers()`, read by weight processing and the residual decomposition), and what
turns a head's projected queries and keys into what its scores read (`QueryKeyPath`, in `query_key_path()`, read by
hooked.graphs.qk).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor, nn


@dataclass(frozen=True)
class Split:
    """How tensor parallelism cuts one parameter, as a module declares it in `tp_plan()`.

    `axis` names the count whose range a rank holds ("heads", "kv_heads", "d_mlp", "experts"); `dim` is
    the tensor dimension cut; `unit` the elements per head / neuron / expert along `dim` (d_head for a
    q_proj row block); `parts` > 1 when `dim` holds that many equal blocks cut alike (GPT-2's fused
    q|k|v); `reduce=True` on the weight of a layer whose *input* is cut: the layer all-reduces its
    partial product before adding its (whole) bias. hooked.distributed.parallelize applies it.
    """

    axis: str
    dim: int
    unit: int = 1
    parts: int = 1
    reduce: bool = False


@dataclass(frozen=True)
class Projection:
    """A weight that reads the residual stream (after a norm) or writes to it, as weight processing
    (hooked/processing.py) and the residual decomposition see it: each attention and MLP module
    declares its `residual_readers()` and `residual_writers()`.

    `axis` is the weight's d_model axis. `bias` is the output's bias, or None where there is none: for a
    reader the weight's shape without that axis, for a writer [d_model].
    """

    weight: Tensor
    axis: int
    bias: Tensor | None = None


@dataclass(frozen=True)
class QueryKeyPath:
    """What an attention does to its projected queries and keys before the scores, as each attention module declares
    it in `query_key_path()`, for analyses that rebuild one head's score from its parts (hooked.graphs.qk).

    `query_norm` / `key_norm`: the RMSNorms q and k go through (their `hook_scale` is the scale; a weight of
    n_heads * d_head spans every head, OLMo 2's), None without. `q_point` / `k_point`: the attention's hook points
    holding the final queries and keys (after any rotary turn). `rotary_arguments`: the positions of the cos and sin
    tables among the attention's forward arguments, and `rotate(x, cos, sin)` the turn they give x [..., d_head]
    (cos, sin [..., rotary_dim]); both None without rotary embeddings.
    """

    query_norm: nn.Module | None
    key_norm: nn.Module | None
    q_point: str
    k_point: str
    rotary_arguments: tuple[int, int] | None = None
    rotate: Callable[[Tensor, Tensor, Tensor], Tensor] | None = None
