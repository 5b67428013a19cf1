"""What a layer declares about itself for generic code, as data: how tensor parallelism cuts a parameter
(`Split`, in a module's `tp_plan()`), and which weights read or write the residual stream (`Projection`, in
`residual_readers()` / `residual_writers()`, read by weight processing and the residual decomposition).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor


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
